"""Parts of the README and docs/ that the bench and chaos runners write from their result
files, so that no figure in them is typed by hand.

A generated section sits between ``<!-- begin NAME -->`` and ``<!-- end NAME -->``;
:func:`replace_section` rewrites what lies between, and a unit test checks that what the
README holds is what the result files give.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


class MissingSection(ValueError):
    """The file has no markers for the section."""


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- begin {re.escape(name)} -->\n)(.*?)(<!-- end {re.escape(name)} -->)", re.S
    )


def section(text: str, name: str) -> str:
    """What lies between the markers of ``name`` in ``text``."""
    found = _pattern(name).search(text)
    if found is None:
        raise MissingSection(f"no <!-- begin {name} --> ... <!-- end {name} --> markers")
    return found.group(2)


def replace_section(path: Path, name: str, body: str) -> None:
    """Rewrite the section ``name`` of ``path`` with ``body``."""
    text = path.read_text()
    section(text, name)  # raises when the markers are missing
    body = body if body.endswith("\n") else body + "\n"
    path.write_text(_pattern(name).sub(lambda m: m.group(1) + body + m.group(3), text, count=1))
