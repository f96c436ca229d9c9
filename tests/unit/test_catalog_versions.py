"""Which product version a sale is enriched with."""

from __future__ import annotations

from tables.catalog import pick_version

DAIRY = {"sku": "A", "name": "milk", "category": "dairy"}
DRINKS = {"sku": "A", "name": "milk", "category": "drinks"}


def test_the_latest_version_at_or_before_the_sale_time_wins() -> None:
    versions = [[100, 0, DAIRY], [200, 1, DRINKS]]
    assert pick_version(versions, 150) == DAIRY
    assert pick_version(versions, 200) == DRINKS
    assert pick_version(versions, 10_000) == DRINKS


def test_no_version_before_the_sale_means_no_product() -> None:
    assert pick_version([[100, 0, DAIRY]], 99) is None
    assert pick_version([], 99) is None


def test_a_deletion_hides_the_product_from_then_on() -> None:
    versions = [[100, 0, DAIRY], [200, 1, None]]
    assert pick_version(versions, 150) == DAIRY
    assert pick_version(versions, 250) is None


def test_without_a_time_the_newest_version_is_returned() -> None:
    assert pick_version([[100, 0, DAIRY], [200, 1, DRINKS]], None) == DRINKS
