"""make test starts the slowest modules first: the list names modules that exist."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import SLOWEST_FIRST

ROOT = Path(__file__).resolve().parents[2]


def test_every_module_of_the_order_exists_once() -> None:
    assert len(set(SLOWEST_FIRST)) == len(SLOWEST_FIRST)
    missing = [path for path in SLOWEST_FIRST if not (ROOT / path).is_file()]
    assert missing == []


def test_make_test_keeps_the_order() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "--dist loadfile --no-loadscope-reorder" in makefile
