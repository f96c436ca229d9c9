"""Records Kafka refuses, under load: a refusal of one record is that record's problem.

Two workers under each guarantee process the chaos load; then one of three faults:

* ``event_time``: valid events whose event time (``ts``) lies 2 hours and 3 years ahead
  of the wall clock and behind it (a sale, its payment and a restock each, on stores the
  load uses), produced with the producer's own record timestamp (now), which the broker
  takes. They must be applied like any other: nothing in a dead-letter topic.
* ``state_too_large``: one store restocked with new skus until its ``inventory`` value is
  larger than its changelog's ``max.message.bytes`` (the topic is created with
  :data:`INVENTORY_LIMIT`): each event that would make it larger must go to
  ``item-events-dlq`` with Kafka's reason, the others must be applied.
* ``output_refused``: ``settled-sales``' ``max.message.bytes`` is lowered to
  :data:`SETTLED_LIMIT` while the workers run (they read it when their tasks started), then
  sales with long ids are paid: Kafka refuses their pairs, and the payments that made them
  must go to ``payments-dlq``, the other pairs must settle.

What each measures: for every offending record, the time from its acknowledgement until
the group's committed offset of its partition passed it (the partition moving again); the
dead letters and their reasons; the load's records lost (the ledger against the topics);
the tables against the ground truth of the source topics without the dead-lettered
records (exact under exactly_once; under at_least_once not under-counted); repeated
settled pairs, against the cycles the workers attempted again; /ready's stalled list,
sampled twice a second.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any, NamedTuple

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from chaos import checks
from chaos.env import group, metric, reset, workdir
from chaos.lag import GROUP
from chaos.load import LoadLevel
from chaos.reader import TopicReader, committed_offsets
from chaos.session import Session
from chaos.truth import HOUR_MS, Truth
from chaos.workload import STORES
from tables.limits import record_batch_bytes
from tests.support.kafka import LocalKafka
from tests.support.kafka_io import create_topics
from tests.support.workers import Worker

#: max.message.bytes of the inventory changelog in ``state_too_large``: a store outgrows
#: it near 6,000 skus (Kafka's default, 1 MB, near 60,000).
INVENTORY_LIMIT = 100_000
#: max.message.bytes of settled-sales after the change in ``output_refused`` (the load's
#: pairs are about 330 bytes).
SETTLED_LIMIT = 700
#: Windows of sales_by_category are kept this long (the workers' default).
WINDOW_RETENTION_MS = 7 * 24 * HOUR_MS
#: The highest load these scenarios offer: what two workers carry here with room to spare,
#: so that the time to move again measures the refusal, not a backlog.
MAX_LINES_PER_S = 2_000.0
MAX_EVENTS_PER_S = 600.0
#: The offending records' partitions must move again within this long.
MOVED_IN_S = 5.0
YEAR_MS = 365 * 24 * HOUR_MS
FAULTS = ("event_time", "state_too_large", "output_refused")
#: Kafka's error names a refusal's reason starts with.
KAFKA_ERRORS = ("MessageSizeTooLargeError", "InvalidTimestampError", "InvalidRecordError")


class Injected(NamedTuple):
    """A record the scenario produced: where it is and what it is."""

    topic: str
    partition: int
    offset: int
    acked_at: float
    label: str


@dataclass
class RefusedTruth(Truth):
    """The ground truth of the source topics without the records in the dead-letter
    topics, and with the engine's expiry of sales_by_category's windows: a sale whose
    hour ended before the retention horizon is not counted."""

    excluded: set[tuple[str, int, int]] = field(default_factory=set)

    def add_events(self, partition: int, records: Iterable[Any]) -> None:
        super().add_events(partition, self._without("item-events", partition, records))

    def add_payments(self, partition: int, records: Iterable[Any]) -> None:
        super().add_payments(partition, self._without("payments", partition, records))

    def _without(self, topic: str, partition: int, records: Iterable[Any]) -> list[Any]:
        """The records, the excluded ones emptied (counted, in order, as no event)."""
        return [
            _Emptied(r.offset, r.headers) if (topic, partition, r.offset) in self.excluded else r
            for r in records
        ]

    def _sale(self, event: dict[str, Any]) -> None:
        start = event["ts"] - event["ts"] % HOUR_MS
        if start + HOUR_MS > time.time() * 1000 - WINDOW_RETENTION_MS:
            super()._sale(event)


class _Emptied(NamedTuple):
    offset: int
    headers: Sequence[tuple[str, bytes]]
    value: bytes | None = None


def level_for(level: LoadLevel) -> LoadLevel:
    """The given level, capped at what the scenarios offer."""
    lines = min(level.lines_per_s, MAX_LINES_PER_S)
    events = min(level.events_per_s, MAX_EVENTS_PER_S)
    if (lines, events) == (level.lines_per_s, level.events_per_s):
        return level
    return LoadLevel(lines, events, f"{level.source}, capped at {lines:,.0f} + {events:,.0f}/s")


def run(
    kafka: LocalKafka, level: LoadLevel, guarantee: str, fault: str, load_s: float = 10.0
) -> dict[str, Any]:
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}: one of {FAULTS}")
    reset(kafka)
    work = workdir(f"{fault}-{guarantee}")
    if fault == "state_too_large":
        create_topics(
            kafka.bootstrap,
            {"streamstate-inventory-changelog": 8},
            {"cleanup.policy": "compact", "max.message.bytes": str(INVENTORY_LIMIT)},
        )
    session = Session(kafka, level_for(level), work, active_s=load_s * 3, seed=23)
    truth = session.truth = RefusedTruth()
    figures: dict[str, Any] = {"guarantee": guarantee, "fault": fault}
    try:
        with group(kafka, work, PROCESSING_GUARANTEE=guarantee) as members:
            workers = [members.add("w0"), members.add("w1")]
            for worker in workers:
                worker.wait_ready(240)
            with ReadyWatch(workers) as watch:
                session.start_load()
                time.sleep(load_s)  # the tasks have started and read the topics' rules
                injected = INJECT[fault](kafka.bootstrap)
                moved = moved_after(kafka.bootstrap, injected, 120.0)
                time.sleep(load_s)  # the load goes on past the offending records
                session.pause()
                letters, grown, settled = settle(session, truth, kafka.bootstrap, guarantee)
            figures.update(settled)
            figures.update(summarize(fault, [i._asdict() for i in injected], moved, letters, grown))
            figures["ready"] = watch.summary()
            figures["ready_at_end"] = [_ready(w) for w in workers]
            figures["workers"] = _worker_figures(workers)
        figures.update(session.losses())
    finally:
        figures["load"] = session.close()
    return figures


# -- the faults ---------------------------------------------------------------------


def _event(event_id: str, store: str, kind: str, ts: int, **more: Any) -> dict[str, Any]:
    found = {"event_id": event_id, "store_id": store, "kind": kind, "ts": ts}
    found.update({"sku": "DAI-1", "quantity": 1, **more})
    if kind == "sale":
        found.setdefault("unit_price", 0.5)
    return found


def inject_event_time(bootstrap: str) -> list[Injected]:
    """A sale, its payment a minute later and a restock, per store, at event times hours
    and years from now; record timestamps: now."""
    now = int(time.time() * 1000)
    offsets = {"2h-ahead": 2 * HOUR_MS, "3y-ahead": 3 * YEAR_MS}
    offsets.update({"2h-behind": -2 * HOUR_MS, "3y-behind": -3 * YEAR_MS})
    events, payments = [], []
    for n, (label, shift) in enumerate(offsets.items()):
        store, ts = STORES[n + 1], now + shift
        sale = _event(f"tz-{label}-sale", store, "sale", ts)
        events.append((label, store, sale))
        events.append((label, store, _event(f"tz-{label}-restock", store, "restock", ts)))
        payment = {
            "payment_id": f"tz-{label}-pay",
            "sale_event_id": sale["event_id"],
            "store_id": store,
            "amount": 0.5,
            "ts": ts + 60_000,
        }
        payments.append((label, store, payment))
    return asyncio.run(_produce(bootstrap, "item-events", events)) + asyncio.run(
        _produce(bootstrap, "payments", payments)
    )


GROWING_STORE = "store-grow"
GROWTH_SKUS = 9_000


def inject_state_too_large(bootstrap: str) -> list[Injected]:
    """Restocks of new skus for one store, 500 at a time, until its value would be about
    half again as large as its changelog takes."""
    now = int(time.time() * 1000)
    found: list[Injected] = []
    for start in range(0, GROWTH_SKUS, 500):
        batch = [
            (
                f"growth {n}",
                GROWING_STORE,
                _event(f"grow-{n}", GROWING_STORE, "restock", now, sku=f"GROW-{n:06d}"),
            )
            for n in range(start, start + 500)
        ]
        found += asyncio.run(_produce(bootstrap, "item-events", batch))
        time.sleep(0.25)
    return found


def inject_output_refused(bootstrap: str) -> list[Injected]:
    """Lower settled-sales' max.message.bytes under the running workers, then pay sales
    whose pairs are larger than that (and sales whose pairs fit)."""
    asyncio.run(
        _alter(
            bootstrap,
            "settled-sales",
            {
                "retention.ms": "-1",
                "cleanup.policy": "delete",
                "max.message.bytes": str(SETTLED_LIMIT),
            },
        )
    )
    time.sleep(1.0)
    now = int(time.time() * 1000)
    sales, payments = [], []
    for n in range(6):
        store, large = STORES[n * 7 % len(STORES)], n % 2 == 0
        label = "large" if large else "fits"
        event_id = f"long-{n}-" + ("E" * 240 if large else "")
        sku = "L" * 250 if large else "DAI-2"
        sale = _event(event_id, store, "sale", now, sku=sku)
        sales.append((f"{label} sale", store, sale))
        payment = {
            "payment_id": f"long-{n}-pay",
            "sale_event_id": event_id,
            "store_id": store,
            "amount": 0.5,
            "ts": now + 30_000,
        }
        payments.append((f"{label} payment", store, payment))
    found = asyncio.run(_produce(bootstrap, "item-events", sales))
    time.sleep(1.0)  # the sales are buffered first: the payments make the pairs
    return found + asyncio.run(_produce(bootstrap, "payments", payments))


INJECT: dict[str, Callable[[str], list[Injected]]] = {
    "event_time": inject_event_time,
    "state_too_large": inject_state_too_large,
    "output_refused": inject_output_refused,
}


_CONTROLS = itertools.count()


def _control(topic: str, key: str) -> dict[str, Any]:
    """A valid record that takes effect quietly: a restock of one, or a payment of no sale."""
    n = next(_CONTROLS)
    if topic == "item-events":
        return _event(f"control-{key}-{n}", key, "restock", int(time.time() * 1000))
    return {
        "payment_id": f"control-{key}-{n}",
        "sale_event_id": f"no-sale-{key}-{n}",
        "store_id": key,
        "amount": 0.5,
        "ts": int(time.time() * 1000),
    }


async def _produce(
    bootstrap: str, topic: str, records: Sequence[tuple[str, str, Any]]
) -> list[Injected]:
    """Produce (label, key, value) records with the producer's timestamps (now), each key's
    first record right after a control record of the same key: the partition's pace
    without the fault, to measure the offending records' against."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        sent, seen = [], set()
        for label, key, value in records:
            if key not in seen:
                seen.add(key)
                control = orjson.dumps(_control(topic, key))
                sent.append(("control", await producer.send(topic, control, key=key.encode())))
            value_bytes = orjson.dumps(value)
            sent.append((label, await producer.send(topic, value_bytes, key=key.encode())))
        found = []
        for label, future in sent:
            meta = await future
            found.append(Injected(topic, meta.partition, meta.offset, time.monotonic(), label))
        return found
    finally:
        await producer.stop()


async def _alter(bootstrap: str, topic: str, config: dict[str, str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, config)])
    finally:
        await admin.close()


# -- what is measured -----------------------------------------------------------------


def moved_after(bootstrap: str, injected: Sequence[Injected], timeout: float) -> list[float | None]:
    """Per injected record, seconds from its acknowledgement until the group's committed
    offset of its partition passed it (None: not within ``timeout``)."""

    async def follow() -> list[float | None]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        moved: list[float | None] = [None] * len(injected)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline and None in moved:
                committed = await committed_offsets(admin, GROUP)
                now = time.monotonic()
                for n, record in enumerate(injected):
                    at = committed.get((record.topic, record.partition), -1)
                    if moved[n] is None and at > record.offset:
                        moved[n] = round(now - record.acked_at, 2)
                await asyncio.sleep(0.1)
        finally:
            await admin.close()
        return moved

    return asyncio.run(follow())


def dead_letters(bootstrap: str) -> list[dict[str, Any]]:
    """Every dead letter of item-events and payments: where its record was, and why."""
    found: list[dict[str, Any]] = []
    for source in ("item-events", "payments"):

        def keep(partition: int, records: Sequence[Any], source: str = source) -> None:
            for record in records:
                headers = {name: value.decode() for name, value in record.headers}
                found.append(
                    {
                        "topic": headers.get("source-topic", source),
                        "partition": int(headers.get("source-partition", partition)),
                        "offset": int(headers.get("source-offset", -1)),
                        "error": headers.get("error", ""),
                        "key": (record.key or b"").decode(errors="replace"),
                    }
                )

        TopicReader(bootstrap, f"{source}-dlq").read_new(keep)
    return found


def settle(
    session: Session, truth: RefusedTruth, bootstrap: str, guarantee: str
) -> tuple[list[dict[str, Any]], Any, dict[str, Any]]:
    """With the load paused: the group caught up, the dead letters read and left out of
    the truth, the tables compared with it. The dead letters, the growing store's value
    and the comparison's figures."""
    paused = time.monotonic()
    caught_up = session.monitor.wait_caught_up(300.0, since=paused)
    letters = dead_letters(bootstrap)
    truth.excluded = {(d["topic"], d["partition"], d["offset"]) for d in letters}
    session.refresh_truth()
    found = session.compare()
    for _ in range(4):
        if found.exact:
            break
        time.sleep(2.0)
        found, before = session.compare(), found
        if guarantee == "at_least_once" and found == before:
            break
    copies = session.tables.settled.pairs
    grown = session.tables.state("inventory").get(GROWING_STORE.encode())
    return (
        letters,
        grown,
        {
            "drain_after_pause_s": None if caught_up is None else round(caught_up - paused, 1),
            "drift": found.as_dict(),
            "settled_pairs": len(copies),
            "settled_repeats": sum(n - 1 for n in copies.values()),
            "settled_max_copies": max(copies.values(), default=0),
        },
    )


def _ready(worker: Worker) -> dict[str, Any]:
    status, body = worker.get("/ready")
    answer = body if isinstance(body, dict) else {}
    return {
        "http": status,
        "status": answer.get("status"),
        "stalled": len(answer.get("stalled", [])),
    }


def _grown(value: Any) -> dict[str, Any] | None:
    """The growing store's value: its growth skus kept and its size as a changelog record."""
    if value is None:
        return None
    kept = sorted(int(sku[5:]) for sku in value["on_hand"] if sku.startswith("GROW-"))
    return {
        "skus_kept": len(kept),
        "last_kept": kept[-1] if kept else None,
        "changelog_record_bytes": record_batch_bytes(GROWING_STORE.encode(), orjson.dumps(value)),
    }


def _worker_figures(workers: Sequence[Worker]) -> dict[str, float]:
    def total(name: str, **labels: str) -> float:
        return sum(metric(w, name, **labels) for w in workers if w.alive())

    return {
        "retries_refusal": total("streamstate_cycle_retries_total", cause="refusal"),
        "retries_backoff": total("streamstate_cycle_retries_total", cause="backoff"),
        "refused_records": total("streamstate_refused_records_total"),
        "dead_letters": total("streamstate_dlq_records_total"),
    }


class ReadyWatch:
    """Samples every worker's /ready twice a second in a thread of its own."""

    def __init__(self, workers: Sequence[Worker]) -> None:
        self.workers = list(workers)
        self.samples: list[tuple[int, str, list[dict[str, Any]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> ReadyWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            for worker in self.workers:
                try:
                    status, body = worker.get("/ready", timeout=2.0)
                except OSError:
                    continue
                if isinstance(body, dict):
                    self.samples.append((status, body.get("status", ""), body.get("stalled", [])))

    def summary(self) -> dict[str, Any]:
        stalled = [s for _, _, entries in self.samples for s in entries]
        return {
            "samples": len(self.samples),
            "with_stalled": sum(1 for _, _, entries in self.samples if entries),
            "not_ready_stalled": sum(1 for _, status, _ in self.samples if status == "stalled"),
            "longest_stall_s": max((s["stalled_s"] for s in stalled), default=0.0),
            "stall_examples": stalled[:3],
        }


# -- the figures, the checks and the summary line -----------------------------------------


def offending(
    fault: str, injected: Sequence[dict[str, Any]], letters: Sequence[dict[str, Any]]
) -> list[int]:
    """Indexes of the injected records that had to go to a dead-letter topic (for the
    event-time fault, which must send none: every injected record but the controls)."""
    if fault == "output_refused":
        return [n for n, i in enumerate(injected) if i["label"] == "large payment"]
    if fault == "state_too_large":
        dead = {_place(d) for d in letters}
        return [n for n, i in enumerate(injected) if _place(i) in dead]
    return [n for n, i in enumerate(injected) if i["label"] != "control"]


def _place(record: dict[str, Any]) -> tuple[str, int, int]:
    return (record["topic"], record["partition"], record["offset"])


def later_than_control(
    injected: Sequence[dict[str, Any]], moved: Sequence[float | None], indexes: Sequence[int]
) -> list[float | None]:
    """Per record of ``indexes``: how much longer than the control record produced just
    before it on its partition it took to be passed (None: never passed)."""
    controls: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for m, c in enumerate(injected):
        if c["label"] == "control":
            controls.setdefault((c["topic"], c["partition"]), []).append((c["offset"], m))
    for found in controls.values():
        found.sort()
    result: list[float | None] = []
    for n in indexes:
        record = injected[n]
        before = controls.get((record["topic"], record["partition"]), [])
        at = bisect.bisect_left(before, (record["offset"], -1)) - 1
        control = moved[before[at][1]] if at >= 0 else None
        after = moved[n]
        result.append(None if after is None or control is None else round(after - control, 2))
    return result


def _times(values: Sequence[float | None]) -> dict[str, Any]:
    """Median and max of the measured times, those never measured, those over target."""
    found = [v for v in values if v is not None]
    return {
        "median": round(median(found), 2) if found else None,
        "max": max(found) if found else None,
        "never": len(values) - len(found),
        "over_target": sum(1 for v in found if v > MOVED_IN_S),
    }


def summarize(
    fault: str,
    injected: Sequence[dict[str, Any]],
    moved: Sequence[float | None],
    letters: Sequence[dict[str, Any]],
    grown_value: Any,
) -> dict[str, Any]:
    """The figures of a run, from what it injected, when each injected record was passed,
    the dead letters and the growing store's value: counts and spreads, not lists."""
    indexes = offending(fault, injected, letters)
    wanted = {_place(injected[n]) for n in indexes}
    places = {_place(d) for d in letters}
    reasons = Counter(d["error"].split(":", 1)[0].split(" [")[0] for d in letters)
    figures: dict[str, Any] = {
        "injected": len(injected),
        "offending": len(indexes),
        "moved_after_s": _times([moved[n] for n in indexes]),
        "later_than_control_s": _times(later_than_control(injected, moved, indexes)),
        "dead_letters": {
            "count": len(letters),
            "reasons": dict(reasons),
            "with_kafka_reason": sum(1 for d in letters if d["error"].startswith(KAFKA_ERRORS)),
            "offending_in": len(places & wanted),
            "others": len(places - wanted),
            "examples": list(letters[:3]),
        },
    }
    grown = _grown(grown_value)
    if grown is not None:
        refused = [
            int(injected[n]["label"].split()[1])
            for n in indexes
            if injected[n]["label"].startswith("growth")
        ]
        last = grown["last_kept"]
        grown["refused"] = len(refused)
        grown["refused_after_kept"] = bool(refused) and last is not None and min(refused) > last
        figures["grown"] = grown
    return figures


def check(r: dict[str, Any]) -> list[checks.Check]:
    eos = r["guarantee"] == "exactly_once"
    moved, later, dead = r["moved_after_s"], r["later_than_control_s"], r["dead_letters"]
    truth = "the tables (truth: the sources without the dead letters)"
    found = [
        checks.Check(
            f"lost 0 of {r['acked_records']:,} acknowledged load records",
            r["acked_records"] > 0 and r["acked_but_lost"] == 0,
        ),
        checks.exact(r["drift"], truth) if eos else checks.not_under(r["drift"], truth),
        checks.Check(
            f"every offending record's partition moved past it within {MOVED_IN_S:g} s of "
            f"its acknowledgement ({r['offending']} records)",
            r["offending"] > 0 and moved["never"] == 0 and moved["over_target"] == 0,
            target=True,
        ),
        checks.Check(
            f"no offending record held its partition: each passed within {MOVED_IN_S:g} s of "
            "the record produced just before it",
            r["offending"] > 0 and later["never"] == 0 and later["over_target"] == 0,
            target=True,
        ),
    ]
    if r["fault"] == "event_time":
        found.append(
            checks.Check(
                "no valid event in a dead-letter topic, whatever its event time",
                dead["count"] == 0,
            )
        )
    else:
        found.append(
            checks.Check(
                "every offending input in its dead-letter topic with Kafka's reason, and no "
                "other record",
                r["offending"] > 0
                and dead["offending_in"] == r["offending"]
                and dead["others"] == 0
                and dead["with_kafka_reason"] == dead["count"],
            )
        )
    if r["fault"] == "state_too_large":
        grown = r.get("grown") or {}
        found.append(
            checks.Check(
                f"the growing store kept its skus up to {INVENTORY_LIMIT:,} bytes and refused "
                "each later one",
                bool(grown.get("refused_after_kept"))
                and grown["changelog_record_bytes"] <= INVENTORY_LIMIT
                and grown["skus_kept"] + grown["refused"] == GROWTH_SKUS,
            )
        )
    retries = r["workers"]["retries_refusal"] + r["workers"]["retries_backoff"]
    if eos:
        found.append(checks.Check("no settled pair written twice", r["settled_repeats"] == 0))
    else:
        found.append(
            checks.Check(
                "a settled pair written at most once more per attempt at its cycle "
                f"({retries:g} attempts again)",
                r["settled_max_copies"] <= 1 + retries,
            )
        )
    found.append(
        checks.Check(
            "/ready 200 with no stalled partition at the end",
            all(a["http"] == 200 and a["stalled"] == 0 for a in r["ready_at_end"]),
        )
    )
    return found


def headline(r: dict[str, Any]) -> str:
    dead, load, grown = r["dead_letters"], r["load"], r.get("grown")
    growth = (
        f"; the store kept {grown['skus_kept']:,} skus ({grown['changelog_record_bytes']:,} "
        f"bytes as a changelog record), refused {grown['refused']:,}"
        if grown
        else ""
    )
    reasons = ", ".join(sorted(dead["reasons"])) or "none"
    return (
        f"{r['injected']} records injected ({r['offending']} offending) at "
        f"{load.get('acked_lines_per_s', 0):,} lines/s + {load.get('acked_events_per_s', 0):,} "
        f"item events/s: lost {r['acked_but_lost']} of {r['acked_records']:,}; "
        f"{dead['count']} in the DLQ ({reasons}){growth}; partition past the offending "
        f"record {_spread(r['moved_after_s'])} after it was acknowledged, "
        f"{_spread(r['later_than_control_s'])} later than the record before it; tables "
        f"{'exact' if r['drift']['exact'] else '**not exact**'} against the sources without "
        f"the dead letters; settled pairs repeated {r['settled_repeats']} (attempts again: "
        f"{r['workers']['retries_refusal']:g} at once, {r['workers']['retries_backoff']:g} "
        f"after a backoff); longest stall on /ready {r['ready']['longest_stall_s']} s"
    )


def _spread(times: dict[str, Any]) -> str:
    if times["median"] is None:
        return "never"
    never = f", {times['never']} never" if times["never"] else ""
    return f"{times['median']:.2f} s median, {times['max']:.2f} s max{never}"
