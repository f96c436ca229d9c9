"""The lag monitor's samples count the lag per partition."""

from __future__ import annotations

from chaos.lag import REPARTITIONS, SOURCES, sample_of

WORDS = REPARTITIONS[0]


def test_a_partition_past_its_end_does_not_hide_another_partitions_lag() -> None:
    # Partition 0 committed past the end read for it (it went on after the read);
    # partition 1 is 50 records behind. The sums per topic are equal (200 and 200).
    ends = {(WORDS, 0): 100, (WORDS, 1): 100}
    committed = {(WORDS, 0): 150, (WORDS, 1): 50}
    sample = sample_of(1.0, ends, committed)
    assert sample.ends[WORDS] == sample.committed[WORDS] == 200
    assert sample.lag() == 50
    assert sample.lag((WORDS,)) == 50
    assert sample.lag((SOURCES[0],)) == 0


def test_caught_up_only_when_every_partition_reached_its_end() -> None:
    ends = {(SOURCES[0], 0): 10, (SOURCES[0], 1): 7, (WORDS, 0): 3}
    assert sample_of(0.0, ends, {(SOURCES[0], 0): 10, (SOURCES[0], 1): 7, (WORDS, 0): 3}).lag() == 0
    # a partition with nothing committed yet is behind by its whole end
    assert sample_of(0.0, ends, {(SOURCES[0], 0): 10, (SOURCES[0], 1): 7}).lag() == 3
    assert sample_of(0.0, ends, {(SOURCES[0], 0): 9, (SOURCES[0], 1): 7, (WORDS, 0): 3}).lag() == 1
