"""kill -9 of one broker of three under load, then the broker started again.

Topics are created by the workers with replication factor 3 (``min.insync.replicas=2``),
producers use acks=all. Pass: no acknowledged event is lost, processing goes on while the
broker is gone and after it is back, without restarting a worker.
"""

from __future__ import annotations

import time
from typing import Any

from chaos.env import crashes, group, kill_broker, pid, replication, start, workdir
from chaos.load import SteadyLoad
from chaos.truth import drift, read_tables, settle
from tests.support.kafka import LocalKafka


def run(kafka: LocalKafka, node: int = 2, down_s: float = 20.0, workers: int = 1) -> dict[str, Any]:
    env = {"TOPIC_REPLICATION_FACTOR": "3"}
    with group(kafka, workdir("broker-loss"), **env) as members:
        started = [members.add(f"w{n}") for n in range(workers)]
        for worker in started:
            worker.wait_ready(300)
        pids = [pid(w) for w in started]
        rf = replication(
            kafka.bootstrap, ["text-lines", "item-events", "streamstate-word_counts-changelog"]
        )
        load = SteadyLoad(kafka.bootstrap, 15.0, 6.0, seed=5).start()
        try:
            time.sleep(8)
            counted_at_kill = read_tables(kafka.bootstrap).words_total
            killed = kill_broker(kafka, node)
            time.sleep(down_s)
            counted_while_down = read_tables(kafka.bootstrap).words_total - counted_at_kill
            start(kafka)
            time.sleep(8)
            load.pause()
            truth, tables, settle_s = settle(kafka.bootstrap, timeout=300)
        finally:
            load.stop()
        same = [pid(w) == p and w.alive() for w, p in zip(started, pids, strict=True)]
        agent_crashes = sum(crashes(w) for w in started)
    lost = sorted(load.stats.acked - truth.seqs)
    return {
        "brokers": kafka.brokers,
        "replication_factor": rf,
        "killed_node": node,
        "killed_pid": killed,
        "broker_down_s": down_s,
        "records_sent": load.stats.sent,
        "records_acked": len(load.stats.acked),
        "records_failed": load.stats.failed,
        "producer_errors": load.stats.errors,
        "acked_but_lost": len(lost),
        "words_counted_while_broker_down": counted_while_down,
        "workers_same_process": all(same),
        "agent_crashes": agent_crashes,
        "catch_up_s": round(settle_s, 1),
        "drift": drift(truth, tables).as_dict(),
    }
