"""What ``tables/faust_adapter.py`` relies on in faust-streaming and aiokafka, checked
against the installed libraries and a real broker.

An upgrade that renames a member the adapter overrides or calls, or changes how a
consumer reads transactional topics, fails here by name instead of in a running worker.
The version guard keeps workers off untested versions; these tests are what a new
version must pass before the tested range moves.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.consumer.fetcher import Fetcher as AioFetcher
from aiokafka.consumer.fetcher import FetchResult
from aiokafka.consumer.group_coordinator import GroupCoordinator
from faust.stores.rocksdb import Store as RocksStore
from faust.tables import TableManager
from faust.tables.recovery import Recovery
from faust.transport.consumer import Consumer, Fetcher
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from tables import faust_adapter
from tables.faust_adapter import (
    TESTED,
    UnsupportedVersion,
    check_versions,
    consumer_connected,
    consumer_position,
    fetch_mark,
    leave_at_close,
    remove_static_members,
)
from tests.support.kafka import LocalKafka, local_kafka
from tests.support.kafka_io import create_topics, produce

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def kafka() -> Iterator[LocalKafka]:
    with local_kafka("adapter") as cluster:
        yield cluster


# -- the version guard -------------------------------------------------------------------


def test_the_installed_versions_are_the_tested_ones() -> None:
    check_versions()


@pytest.mark.parametrize("package", sorted(TESTED))
def test_an_untested_version_is_refused_naming_the_version_and_the_range(package: str) -> None:
    found = {name: ".".join(map(str, low)) for name, (low, _high) in TESTED.items()}
    found[package] = "99.0.0"
    with pytest.raises(UnsupportedVersion) as refused:
        check_versions(found)
    low, high = TESTED[package]
    message = str(refused.value)
    assert f"{package} 99.0.0 is installed" in message
    assert f">={'.'.join(map(str, low))},<{'.'.join(map(str, high))}" in message


# -- the members the adapter overrides or calls ------------------------------------------


def _parameters(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


@pytest.mark.parametrize(
    ("owner", "member", "parameters"),
    [
        (Fetcher, "_fetcher", None),
        (Consumer, "_getmany", ["self", "active_partitions", "timeout"]),
        (Consumer, "_to_message", ["self", "tp", "record"]),
        (Consumer, "assignment", ["self"]),
        (Consumer, "pause_partitions", ["self", "tps"]),
        (Consumer, "resume_partitions", ["self", "tps"]),
        (Consumer, "_get_active_partitions", ["self"]),
        (faust_aiokafka.Consumer, "_new_consumer_thread", ["self"]),
        (faust_aiokafka.AIOKafkaConsumerThread, "_create_worker_consumer", ["self", "transport"]),
        (faust_aiokafka.AIOKafkaConsumerThread, "call_thread", None),
        (faust_aiokafka.AIOKafkaConsumerThread, "verify_event_path", ["self", "now", "tp"]),
        (faust_aiokafka.AIOKafkaConsumerThread, "on_thread_stop", ["self"]),
        (
            faust_aiokafka.AIOKafkaConsumerThread,
            "_fetch_records",
            ["self", "consumer", "active_partitions", "timeout", "max_records"],
        ),
        (faust_aiokafka.AIOKafkaConsumerThread, "_seek_wait", ["self", "consumer", "partitions"]),
        (faust_aiokafka.AIOKafkaConsumerThread, "seek_to_committed", ["self"]),
        (faust_aiokafka.AIOKafkaConsumerThread, "_ensure_consumer", ["self"]),
        (Consumer, "perform_seek", ["self"]),
        (faust.App, "FlowControlQueue", ["self", "maxsize", "clear_on_resume"]),
        (faust_aiokafka.Transport, "Consumer", None),
        (RocksStore, "_db_for_partition", ["self", "partition"]),
        (RocksStore, "persisted_offset", ["self", "tp"]),
        (RocksStore, "offset_key", None),
        (RocksStore, "revoke_partitions", ["self", "table", "tps"]),
        (faust.Table, "_new_store_by_url", ["self", "url"]),
        (Recovery, "_build_offsets", ["self", "consumer", "tps", "destination", "title"]),
        (Recovery, "_build_highwaters", ["self", "consumer", "tps", "destination", "title"]),
        (Recovery, "_set_recovery_started", ["self"]),
        (Recovery, "add_standby", ["self", "table", "tp"]),
        (
            Recovery,
            "on_rebalance",
            ["self", "assigned", "revoked", "newly_assigned", "generation_id"],
        ),
        (Recovery, "on_recovery_completed", ["self", "generation_id"]),
        (Recovery, "_seek_offsets", ["self", "consumer", "tps", "offsets", "title"]),
        (Recovery, "_wait", ["self", "coro", "timeout"]),
        (Recovery, "_set_recovery_ended", ["self"]),
        (TableManager, "recovery", None),
        (TableManager, "_update_channels", None),
        (faust.App, "consumer_generation_id", None),
        (faust.App, "_new_transport", ["self"]),
        (faust.App, "_fetcher", None),
        (faust.App, "_leader_assignor", None),
        (faust.App, "rebalancing", None),
        (faust.App, "on_partitions_revoked", None),
        (faust.App, "on_partitions_assigned", None),
        (GroupCoordinator, "fetch_committed_offsets", ["self", "partitions"]),
        (GroupCoordinator, "_maybe_leave_group", ["self"]),
        (GroupCoordinator, "reset_generation", ["self"]),
        (faust.App, "crash", None),
        (AIOKafkaConsumer, "beginning_offsets", ["self", "partitions"]),
        (FetchResult, "has_more", ["self"]),
        (AioFetcher, "fetched_records", ["self", "partitions", "timeout", "max_records"]),
    ],
)
def test_faust_and_aiokafka_have_what_the_adapter_uses(
    owner: type, member: str, parameters: list[str] | None
) -> None:
    assert hasattr(owner, member), f"{owner.__module__}.{owner.__qualname__}.{member} is gone"
    if parameters is not None:
        assert _parameters(getattr(owner, member)) == parameters


def test_the_adapter_plugs_its_fetcher_and_transport_into_the_app() -> None:
    from app.main import create_app
    from core.settings import Settings

    app = create_app(Settings())
    assert isinstance(faust_adapter.fetcher_of(app), faust_adapter.EngineFetcher)
    assert app.transport.Consumer is faust_adapter._Consumer
    assert isinstance(app.tables, faust_adapter.StreamstateTableManager)


def test_faust_runs_at_least_once_when_the_environment_asks_for_exactly_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The engine runs the transactions; faust would start producers of its own.
    from app.main import create_app
    from core.settings import Settings

    monkeypatch.setenv("PROCESSING_GUARANTEE", "exactly_once")
    settings = Settings()
    assert settings.processing_guarantee == "exactly_once"
    app = create_app(settings)
    assert app.conf.processing_guarantee.value == "at_least_once"
    assert not app.in_transaction
    assert app.read_committed  # the engine's consumer still reads committed records only


def test_the_group_consumer_asks_the_broker_to_hold_an_empty_fetch_as_long_as_the_setting_says(
    kafka: LocalKafka,
) -> None:
    # faust builds the worker's consumer with fetch_max_wait_ms=1500 and no setting; the
    # adapter sets it before the start, and aiokafka's fetcher sends it in every request
    # that leaves out a partition faust hands out (paused here), the idle wait in one
    # that leaves out none: faust keeps the changelogs of active tables paused for good.
    from app.main import create_app
    from core.settings import Settings

    topic = "contract-fetch-wait"
    create_topics(kafka.bootstrap, {topic: 2})
    tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]

    async def check() -> tuple[int, list[int], int]:
        settings = Settings(
            broker_url=f"kafka://{kafka.bootstrap}",
            source_fetch_max_wait_ms=70,
            source_fetch_idle_wait_ms=900,
        )
        app = create_app(settings)
        consumer = app.consumer._thread._create_worker_consumer(app.transport)
        before = consumer._fetch_max_wait_ms
        await consumer.start()
        fetcher = consumer._fetcher
        waits = []
        try:
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, 0)
            assignment = consumer._subscription.subscription.assignment

            def next_wait(handed_out: set[TopicPartition]) -> None:
                app.consumer._set_active_tps({TP(tp.topic, tp.partition) for tp in handed_out})
                # what aiokafka's fetcher puts in the FetchRequest it builds next
                fetcher._get_actions_per_node(assignment)
                waits.append(fetcher._fetch_max_wait_ms)

            next_wait(set(tps))
            consumer.pause(tps[1])
            next_wait(set(tps))
            next_wait({tps[0]})  # paused, and faust does not hand it out
            consumer.resume(tps[1])
            next_wait(set(tps))
            return before, waits, Settings().source_fetch_max_wait_ms
        finally:
            await consumer.stop()

    before, waits, default = asyncio.run(check())
    assert before == 70
    assert waits == [900, 70, 900, 900]
    assert default < 1500  # faust's value, which held records back up to 1.5 s a cycle


# -- aiokafka against the broker ---------------------------------------------------------


async def _transactions(bootstrap: str, topic: str) -> int:
    """One committed transaction of 3 records, then one left open with 2: returns the
    open transaction's first offset (past the first one's commit marker)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"contract-{topic}")
    await producer.start()
    try:
        async with producer.transaction():
            for n in range(3):
                await producer.send_and_wait(topic, f"c{n}".encode(), partition=0)
        await producer.begin_transaction()
        first = await producer.send_and_wait(topic, b"open-0", partition=0)
        await producer.send_and_wait(topic, b"open-1", partition=0)
        return int(first.offset)
    finally:
        # Stopping without committing leaves the transaction open until it times out.
        await producer.stop()


def test_read_committed_set_as_the_adapter_sets_it_hides_open_transactions_and_the_position_passes_the_marker(  # noqa: E501
    kafka: LocalKafka,
) -> None:
    topic = "contract-isolation"
    create_topics(kafka.bootstrap, {topic: 1})

    async def check() -> tuple[list[bytes], int | None, int | None, bool | None, bool | None]:
        committed_end = await _transactions(kafka.bootstrap, topic)
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, enable_auto_commit=False)
        # what the worker's consumer thread does before faust starts it
        faust_adapter.read_committed(consumer)
        before = consumer_connected(consumer)
        await consumer.start()
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        values: list[bytes] = []
        for _ in range(10):
            fetched = await consumer.getmany(tp, timeout_ms=500)
            values += [r.value for r in fetched.get(tp, []) if r.value is not None]
        position = consumer_position(consumer, tp)
        connected = consumer_connected(consumer)
        await consumer.stop()
        return values, position, committed_end, before, connected

    values, position, committed_end, before, connected = asyncio.run(check())
    assert values == [b"c0", b"c1", b"c2"]
    # 3 records and the commit marker: the position is past the marker, where the open
    # transaction starts (the last stable offset)
    assert position == committed_end == 4
    assert before is None
    assert connected is True


def test_the_seek_to_committed_offsets_asks_once_and_seeks_as_aiokafka_does(
    kafka: LocalKafka,
) -> None:
    topic = "contract-seek-committed"
    create_topics(kafka.bootstrap, {topic: 4})
    for partition in range(4):
        produce_to = [(f"k{partition}-{n}".encode(), b"v") for n in range(20)]
        produce(kafka.bootstrap, topic, produce_to)
    tps = [TopicPartition(topic, p) for p in range(4)]
    # partition 0 committed at 5, 1 at 12, 2 at 0, 3 never
    commits = {tps[0]: 5, tps[1]: 12, tps[2]: 0}

    async def check() -> tuple[dict[Any, int | None], dict[Any, int], int, dict[Any, int | None]]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=kafka.bootstrap,
            group_id="contract-seek",
            enable_auto_commit=False,
            auto_offset_reset="latest",
        )
        await consumer.start()
        try:
            consumer.assign(tps)
            await consumer.commit(commits)
            for tp in tps:
                consumer.seek(tp, 17)
            asked = 0
            fetch = consumer._coordinator.fetch_committed_offsets

            async def counted(partitions: Any) -> Any:
                nonlocal asked
                asked += 1
                return await fetch(partitions)

            consumer._coordinator.fetch_committed_offsets = counted  # type: ignore[method-assign]
            found = await faust_adapter.seek_all_to_committed(consumer)
            positions = {tp: await consumer.position(tp) for tp in tps[:3]}
            consumer._coordinator.fetch_committed_offsets = fetch  # type: ignore[method-assign]
            # what aiokafka's own seek gives, one partition at a time
            for tp in tps:
                consumer.seek(tp, 17)
            theirs = await consumer.seek_to_committed(*tps)
            return found, positions, asked, theirs
        finally:
            await consumer.stop()

    found, positions, asked, theirs = asyncio.run(check())
    assert found == {tps[0]: 5, tps[1]: 12, tps[2]: 0, tps[3]: None} == theirs
    assert asked == 1
    # sought where a commit above 0 is; partition 2's commit at 0 leaves it where it was
    assert positions == {tps[0]: 5, tps[1]: 12, tps[2]: 17}


def test_a_consumer_that_has_no_position_yet_has_none(kafka: LocalKafka) -> None:
    topic = "contract-position"
    create_topics(kafka.bootstrap, {topic: 1})

    async def check() -> int | None:
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, 0)])
            position = consumer_position(consumer, TopicPartition(topic, 0))
            # aiokafka's stop right after assign() cancels a task that has not run yet
            await asyncio.sleep(0.1)
            return position
        finally:
            await consumer.stop()

    assert asyncio.run(check()) is None


def test_a_fetch_mark_changes_with_a_recovery_seek_or_a_new_assignment_not_with_fetches(
    kafka: LocalKafka,
) -> None:
    topic = "contract-marks"
    create_topics(kafka.bootstrap, {topic: 1})
    produce(kafka.bootstrap, topic, [(None, f"r{n}".encode()) for n in range(10)])
    tp = TopicPartition(topic, 0)

    async def check() -> list[bool]:
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            thread = SimpleNamespace(_consumer=consumer, seeks=Counter())
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            mark = fetch_mark(thread, tp)
            await consumer.getmany(tp, timeout_ms=2000, max_records=4)
            same = [fetch_mark(thread, tp) == mark]
            thread.seeks[TP(topic, 0)] += 1  # what _seek_wait counts (faust's TP)
            same.append(fetch_mark(thread, tp) == mark)
            mark = fetch_mark(thread, tp)
            consumer.assign([tp])  # a new assignment: a new state of the partition
            same.append(fetch_mark(thread, tp) == mark)
            return same
        finally:
            await consumer.stop()

    assert asyncio.run(check()) == [True, False, False]


def test_a_fetch_says_where_its_records_follow_on_from(kafka: LocalKafka) -> None:
    # A task that starts runs its first fetch's records when they follow on from its
    # committed offset: the consumer thread says where each fetch's records follow on
    # from (what it did not hand out stays buffered for the next fetch).
    from app.main import create_app
    from core.settings import Settings

    topic = "contract-starts"
    create_topics(kafka.bootstrap, {topic: 1})
    produce(kafka.bootstrap, topic, [(None, f"r{n}".encode()) for n in range(10)])
    tp = TopicPartition(topic, 0)

    async def check() -> list[tuple[list[int], dict[Any, int]]]:
        thread = create_app(Settings(broker_url=f"kafka://{kafka.bootstrap}")).consumer._thread
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, enable_auto_commit=False)
        thread._consumer = consumer  # the thread's own consumer, as once it has started
        await consumer.start()
        seen = []

        async def fetch(most: int) -> None:
            got = await thread._fetch_records(consumer, {tp}, timeout=5.0, max_records=most)
            seen.append(([r.offset for r in got.get(tp, [])], dict(thread.fetched_starts)))

        try:
            consumer.assign([tp])
            consumer.seek(tp, 2)
            await fetch(3)
            await fetch(1000)
            consumer.seek(tp, 4)
            thread.seeks[tp] += 1  # as the connector's seek counts it
            await fetch(1000)
            return seen
        finally:
            await consumer.stop()

    first, rest, again = asyncio.run(check())
    assert first == ([2, 3, 4], {tp: 2})
    assert rest == ([5, 6, 7, 8, 9], {tp: 5})
    assert again == ([4, 5, 6, 7, 8, 9], {tp: 4})  # from where the seek put it


def test_a_capped_fetch_hands_out_at_most_the_cap_per_source_partition_and_loses_nothing(
    kafka: LocalKafka,
) -> None:
    # After a rebalance the consumer thread hands the engine a few records of each source
    # partition per fetch (tables/catchup.py); the rest stays buffered in aiokafka, the
    # position after what was handed out, and comes with the next fetches.
    from functools import partial

    from app.main import create_app
    from core.settings import Settings

    first, second, other = "contract-capped-a", "contract-capped-b", "contract-capped-other"
    create_topics(kafka.bootstrap, {first: 1, second: 1, other: 1})
    produce(kafka.bootstrap, first, [(None, f"a{n}".encode()) for n in range(10)])
    produce(kafka.bootstrap, second, [(None, f"b{n}".encode()) for n in range(3)])
    produce(kafka.bootstrap, other, [(None, f"c{n}".encode()) for n in range(8)])
    a, b, c = TopicPartition(first, 0), TopicPartition(second, 0), TopicPartition(other, 0)
    tps = {a, b, c}
    ends = {a: 10, b: 3, c: 8}

    async def check() -> list[tuple[dict[Any, list[int]], bool, dict[Any, int]]]:
        thread = create_app(Settings(broker_url=f"kafka://{kafka.bootstrap}")).consumer._thread
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, enable_auto_commit=False)
        thread._consumer = consumer
        await consumer.start()
        calls = []
        try:
            consumer.assign(list(tps))
            for tp in tps:
                consumer.seek(tp, 0)
            # every partition's records buffered first, as after a rebalance's pause
            for _ in range(200):
                if set(consumer._fetcher._records) == tps:
                    break
                await asyncio.sleep(0.05)
            seen: dict[Any, int] = {}
            while seen != ends and len(calls) < 10:
                records, left = await faust_adapter.capped_fetch(
                    partial(thread._fetch_records, consumer),
                    consumer._fetcher,
                    tps,
                    5.0,
                    1000,
                    4,
                    {first, second},
                )
                offsets = {tp: [r.offset for r in batch] for tp, batch in records.items()}
                for tp, got in offsets.items():
                    seen[tp] = seen.get(tp, 0) + len(got)
                positions = {tp: await consumer.position(tp) for tp in offsets}
                calls.append((offsets, left, positions))
            return calls
        finally:
            await consumer.stop()

    calls = asyncio.run(check())
    assert calls[0][0] == {a: [0, 1, 2, 3], b: [0, 1, 2], c: list(range(8))}
    assert calls[0][1] is True  # the first topic's partition has records left behind
    assert calls[0][2] == {a: 4, b: 3, c: 8}
    assert [call[0] for call in calls[1:]] == [{a: [4, 5, 6, 7]}, {a: [8, 9]}]
    assert [call[1] for call in calls[1:]] == [True, False]
    assert calls[-1][2] == {a: 10}


def test_a_new_assignment_learns_every_committed_offset_in_one_request(kafka: LocalKafka) -> None:
    # aiokafka asks the coordinator for one partition's committed offset at a time, and
    # fetches from no broker until every partition there has a position.
    topic, group = "contract-at-once", "contract-at-once-group"
    create_topics(kafka.bootstrap, {topic: 12})
    tps = [TopicPartition(topic, p) for p in range(12)]

    async def commit_some() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap)
        await producer.start()
        try:
            for tp in tps:
                for n in range(6):
                    await producer.send_and_wait(topic, f"{n}".encode(), partition=tp.partition)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=kafka.bootstrap, group_id=group, enable_auto_commit=False
        )
        await consumer.start()
        try:
            consumer.assign(tps)
            await consumer.commit({tp: 2 for tp in tps[:6]})  # the other six: none
            for _ in range(50):  # the group's coordinator may have been moving meanwhile
                if [await consumer.committed(tp) for tp in tps[:6]] == [2] * 6:
                    break
                await asyncio.sleep(0.1)
                await consumer.commit({tp: 2 for tp in tps[:6]})
        finally:
            await consumer.stop()

    async def check(at_once: bool) -> tuple[list[int], dict[Any, int]]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=kafka.bootstrap,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        coordinator = consumer._coordinator
        asked: list[int] = []
        fetch_committed = coordinator._do_fetch_commit_offsets

        async def counted(partitions: Any) -> Any:
            asked.append(len(partitions))
            return await fetch_committed(partitions)

        coordinator._do_fetch_commit_offsets = counted
        if at_once:
            faust_adapter.positions_at_once(consumer._fetcher, coordinator)
        first: dict[Any, int] = {}
        try:
            consumer.assign(tps)
            for _ in range(50):
                for tp, batch in (await consumer.getmany(timeout_ms=200)).items():
                    first.setdefault(tp, batch[0].offset)
                if len(first) == len(tps):
                    break
            return asked, first
        finally:
            await consumer.stop()

    asyncio.run(commit_some())
    one_by_one, first_before = asyncio.run(check(at_once=False))
    at_once, first_after = asyncio.run(check(at_once=True))
    starts = {tp: 2 if tp.partition < 6 else 0 for tp in tps}
    assert first_before == starts
    assert first_after == starts  # the same positions as aiokafka's own way
    # aiokafka's own way: one request per partition (and one more once they are known)
    assert len(one_by_one) >= len(tps)
    assert max(one_by_one) == 1
    # here one for all, beside aiokafka's first one-partition request under way already
    assert len(at_once) <= 3
    assert max(at_once) == len(tps)


def test_the_changelog_queue_keeps_its_records_when_the_flow_resumes() -> None:
    """faust empties its changelog queue when the flow resumes after a rebalance; the
    records fetched after that, before the recovery seeks, would follow a gap."""
    from app.main import create_app
    from core.settings import Settings

    app = create_app(Settings())
    queue = app.tables.changelog_queue
    queue.put_nowait("a record")
    app.flow_control.suspend()
    app.flow_control.resume()
    assert queue.qsize() == 1


def test_a_paused_partition_leaves_the_consumers_active_ones_and_comes_back_as_fausts_tp() -> None:
    """The engine pauses a stalled task's partitions through faust's consumer; faust keeps
    what it is given to resume as it is, and asserts later that it holds its own TPs."""
    from app.main import create_app
    from core.settings import Settings
    from tables import engine

    app = create_app(Settings())
    consumer, connector = app.consumer, app.wiring.connector
    consumer._set_active_tps({TP("item-events", 3), TP("item-events", 4)})
    connector.pause([engine.TP("item-events", 3)])
    assert consumer._get_active_partitions() == {TP("item-events", 4)}
    connector.resume([engine.TP("item-events", 3)])
    active = consumer._get_active_partitions()
    assert active == {TP("item-events", 3), TP("item-events", 4)}
    assert all(type(tp) is TP for tp in active)


def test_a_static_member_is_removed_from_its_group_on_its_behalf(kafka: LocalKafka) -> None:
    topic, group = "contract-static", "contract-static-group"
    create_topics(kafka.bootstrap, {topic: 2})

    async def check() -> tuple[dict[str, str], int, int]:
        async with _static_member(kafka.bootstrap, topic, group):
            before = await _members(kafka.bootstrap, group)
            outcome = await remove_static_members(kafka.bootstrap, group, ["worker-a", "nobody"])
            after = await _members(kafka.bootstrap, group)
        return outcome, before, after

    outcome, before, after = asyncio.run(check())
    assert outcome["worker-a"] == "removed"
    assert outcome["nobody"] == "UnknownMemberIdError"
    assert (before, after) == (1, 0)  # gone at once, not after its 30 s session


def test_a_static_member_leaves_its_group_when_its_consumer_closes(kafka: LocalKafka) -> None:
    topic, group = "contract-leave", "contract-leave-group"
    create_topics(kafka.bootstrap, {topic: 2})

    async def check(leave: bool) -> tuple[int, int]:
        async with _static_member(kafka.bootstrap, topic, group) as consumer:
            before = await _members(kafka.bootstrap, group)
            if leave:
                leave_at_close(consumer)
        after = await _members(kafka.bootstrap, group)
        if after:
            await remove_static_members(kafka.bootstrap, group, ["worker-a"])
        return before, after

    # aiokafka alone keeps a static member in its group until its session expires
    assert asyncio.run(check(leave=False)) == (1, 1)
    assert asyncio.run(check(leave=True)) == (1, 0)


@contextlib.asynccontextmanager
async def _static_member(bootstrap: str, topic: str, group: str) -> AsyncIterator[Any]:
    """A consumer of ``topic`` in ``group`` as the static member ``worker-a``, once it
    holds its assignment; stopped at the end."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        group_instance_id="worker-a",
        session_timeout_ms=30_000,
    )
    await consumer.start()
    try:
        while not consumer.assignment():
            await consumer.getmany(timeout_ms=200)
        yield consumer
    finally:
        await consumer.stop()


async def _members(bootstrap: str, group: str) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        [description] = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    return len(description.groups[0][5])
