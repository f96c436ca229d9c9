"""Local table state after an unclean stop under exactly_once."""

from __future__ import annotations

from pathlib import Path

from tables.checkpoint import MARKER, discard_if_unclean, mark_clean


def state(tmp_path: Path) -> tuple[Path, Path]:
    datadir, tabledir = tmp_path / "data", tmp_path / "data" / "v1" / "tables"
    (tabledir / "streamstate-inventory-0.db").mkdir(parents=True)
    return datadir, tabledir


def test_unclean_stop_under_exactly_once_discards_local_tables(tmp_path: Path) -> None:
    datadir, tabledir = state(tmp_path)
    assert discard_if_unclean(datadir, tabledir, exactly_once=True)
    assert not tabledir.exists()


def test_exactly_once_rebuilds_after_a_clean_stop_too_and_consumes_the_marker(
    tmp_path: Path,
) -> None:
    datadir, tabledir = state(tmp_path)
    mark_clean(datadir)
    assert discard_if_unclean(datadir, tabledir, exactly_once=True)
    assert not tabledir.exists()
    assert not (datadir / MARKER).exists()


def test_at_least_once_keeps_local_tables_after_a_clean_stop(tmp_path: Path) -> None:
    datadir, tabledir = state(tmp_path)
    mark_clean(datadir)
    assert not discard_if_unclean(datadir, tabledir, exactly_once=False)
    assert tabledir.exists()
    assert not (datadir / MARKER).exists()


def test_at_least_once_never_discards(tmp_path: Path) -> None:
    datadir, tabledir = state(tmp_path)
    assert not discard_if_unclean(datadir, tabledir, exactly_once=False)
    assert tabledir.exists()
