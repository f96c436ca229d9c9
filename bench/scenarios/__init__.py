"""One module per scenario; each returns a :class:`Outcome`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Outcome:
    """The figures of one scenario (the keys of summary.json), its notes and series."""

    figures: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    #: Time series and extra measurements for the plots and details.json.
    details: dict[str, Any] = field(default_factory=dict)
