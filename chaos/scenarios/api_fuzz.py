"""The HTTP API under schemathesis, and requests that must be refused.

Two workers, so that reads are forwarded. Pass: zero 5xx over the generated cases, and
Hypothesis raised no error of its own while generating them (an operation without
parameters or body has no invalid form, so only valid cases are asked of it); oversize
keys, path traversal, forwarding-loop headers and spoofed forwarding targets are refused:
an answer (a dropped connection or a timeout is not a refusal) that is a 4xx (or the read
answered from the worker's own copy), no 5xx, no forward to a host the request named (a
trap listener counts connections), no forward of a forwarded read.
"""

from __future__ import annotations

import http.client
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson

from chaos.env import Trap, crashes, group, metric, wait_for, workdir
from tests.support.kafka import LocalKafka
from tests.support.kafka_io import produce
from tests.support.workers import Worker

FORWARDED = "X-Streamstate-Forwarded"
WORDS = [f"word{n}" for n in range(40)]


@dataclass
class Fuzz:
    cases: int = 0
    by_status: Counter[int] = field(default_factory=Counter)
    by_operation: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    generation_errors: list[str] = field(default_factory=list)

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.by_status.items() if status >= 500)


def run(kafka: LocalKafka, cases: int = 1000, seed: int = 42) -> dict[str, Any]:
    with group(kafka, workdir("api")) as members:
        a, b = members.add("w0"), members.add("w1")
        a.wait_ready(240)
        b.wait_ready(240)
        _seed(kafka, a)
        started = time.monotonic()
        fuzz = fuzz_api(a.url, cases, seed)
        fuzz_s = time.monotonic() - started
        trap = Trap()
        try:
            refusals = refusal_checks(a, b, trap)
        finally:
            trap.close()
        agent_crashes = crashes(a) + crashes(b)
        alive = a.alive() and b.alive()
    failed = [r for r in refusals if not r["refused"]]
    return {
        "cases": fuzz.cases,
        "fuzz_s": round(fuzz_s, 1),
        "by_status": {str(k): v for k, v in sorted(fuzz.by_status.items())},
        "by_operation": dict(fuzz.by_operation),
        "server_errors": fuzz.server_errors,
        "server_error_examples": fuzz.errors[:10],
        "generation_errors": [e[:200] for e in fuzz.generation_errors[:10]],
        "generation_error_count": len(fuzz.generation_errors),
        "refusal_checks": len(refusals),
        "refusal_failures": failed,
        "refusals_by_group": dict(Counter(r["group"] for r in refusals)),
        "trap_connections": trap.hits,
        "workers_alive": alive,
        "agent_crashes": agent_crashes,
    }


def _seed(kafka: LocalKafka, worker: Worker) -> None:
    lines = [" ".join(WORDS[i : i + 5]) for i in range(0, len(WORDS), 5)]
    produce(kafka.bootstrap, "text-lines", [(None, line) for line in lines])
    product = {"sku": "DAI-1", "name": "milk", "category": "dairy"}
    produce(kafka.bootstrap, "products", [(b"DAI-1", product)])
    wait_for(lambda: worker.get(f"/tables/word_counts/keys/{WORDS[-1]}")[0] == 200, 120, 1.0)


TABLES = ["word_counts", "inventory", "sales_by_category", "unsettled_sales", "products"]


def fuzz_api(base_url: str, cases: int, seed: int) -> Fuzz:
    """Generated requests for every operation of /openapi.json, valid and invalid ones.

    Operations on a table run once with a generated table name (mostly 404) and once
    with each real table fixed, so that the rest of the request is what gets fuzzed.
    Invalid requests are asked only of operations that have something to make invalid:
    for the others Hypothesis can generate none (it raises Unsatisfiable), and every
    error it raises is kept as a generation error.
    """
    import schemathesis
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    # A change stream never ends: its status and first event are what a case checks, so
    # reading stops there instead of waiting out the request timeout on each.
    schema.config.max_stream_events = 1
    operations = [r.ok() for r in schema.get_all_operations() if hasattr(r, "ok")]
    runs: list[tuple[Any, Any, dict[str, str] | None]] = []
    for operation in operations:
        fixed: list[dict[str, str] | None] = [None]
        if "{table}" in operation.path:
            fixed += [{"table": t} for t in TABLES]
        for params in fixed:
            runs.append((operation, GenerationMode.POSITIVE, params))
            if can_be_invalid(operation, params):
                runs.append((operation, GenerationMode.NEGATIVE, params))
    fuzz = Fuzz()
    rounds = 0
    while fuzz.cases < cases and rounds < 20:
        rounds += 1
        want = max(5, (cases - fuzz.cases) // len(runs) + 1)
        for operation, mode, params in runs:
            label = operation.label + (f" [{params['table']}]" if params else "")
            try:
                strategy = operation.as_strategy(generation_mode=mode, path_parameters=params)
                _given(fuzz, strategy, base_url, label, want, seed + rounds)()
            except Exception as error:  # hypothesis could not generate: note it
                fuzz.generation_errors.append(f"{label} {mode.value}: {error!r}")
    return fuzz


def can_be_invalid(operation: Any, fixed: dict[str, str] | None) -> bool:
    """Whether a request of ``operation`` has a part left to make invalid once the path
    parameters in ``fixed`` are set: a free path parameter, a query parameter, a header,
    a cookie or a body."""
    free = [p for p in operation.path_parameters if p.name not in (fixed or {})]
    parts = (operation.query, operation.headers, operation.cookies)
    return bool(free) or any(len(part) for part in parts) or bool(operation.body)


def _given(fuzz: Fuzz, strategy: Any, base_url: str, label: str, examples: int, seed: int) -> Any:
    import hypothesis
    from hypothesis import HealthCheck, given, settings

    @hypothesis.seed(seed)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def call(case: Any) -> None:
        _call(fuzz, case, base_url, label)

    return call


def _call(fuzz: Fuzz, case: Any, base_url: str, label: str) -> None:
    fuzz.cases += 1
    fuzz.by_operation[label] += 1
    try:
        response = case.call(base_url=base_url, timeout=15)
    except Exception as error:  # a connection error counts as a server error
        fuzz.by_status[599] += 1
        fuzz.errors.append(f"{label}: {error!r}"[:300])
        return
    fuzz.by_status[response.status_code] += 1
    if response.status_code >= 500:
        fuzz.errors.append(f"{response.status_code} {case.as_curl_command()}"[:300])


# -- refusals ------------------------------------------------------------------------


def raw_get(
    worker: Worker, target: str, headers: dict[str, str] | None = None
) -> tuple[int | None, Any]:
    """GET ``target`` exactly as given (no normalisation); (status, JSON or text)."""
    conn = http.client.HTTPConnection("127.0.0.1", worker.port, timeout=15)
    try:
        conn.putrequest("GET", target, skip_host="Host" in (headers or {}))
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        conn.endheaders()
        answer = conn.getresponse()
        body = answer.read()
    except (OSError, http.client.HTTPException) as error:
        return None, repr(error)
    finally:
        conn.close()
    try:
        return answer.status, orjson.loads(body)
    except orjson.JSONDecodeError:
        return answer.status, body.decode("utf-8", "replace")[:200]


def key_owned_by(front: Worker, owner: Worker) -> str:
    for word in WORDS:
        status, body = front.get(f"/metadata/tables/word_counts/keys/{word}")
        if status == 200 and str(body.get("active", "")).rstrip("/") == owner.url:
            return word
    raise RuntimeError(f"no seeded key is owned by {owner.url}")


def refusal_checks(a: Worker, b: Worker, trap: Trap) -> list[dict[str, Any]]:
    remote = key_owned_by(a, b)
    group = {a.url, b.url}
    results: list[dict[str, Any]] = []

    def check(
        kind: str,
        target: str,
        headers: dict[str, str] | None = None,
        expect_key: str | None = None,
        front: Worker = a,
    ) -> None:
        forwards = metric(front, "streamstate_forwards_total")
        status, body = raw_get(front, target, headers)
        forwarded = metric(front, "streamstate_forwards_total") - forwards
        results.append(_judge(kind, target, headers, status, body, group, expect_key, forwarded))

    for target in _oversize(remote):
        check("oversize key", target)
    for target, key in _traversal(remote):
        check("path traversal", target, expect_key=key)
    for value in [a.url, b.url, trap.url, "yes", f"{a.url}, {b.url}"]:
        check("forwarding loop", f"/tables/word_counts/keys/{remote}", {FORWARDED: value})
    for headers, target in _spoofs(trap.url, remote):
        check("spoofed target", target, headers)
    for headers, _ in _spoofs(trap.url, remote):
        check("spoofed target", f"/metadata/tables/word_counts/keys/{remote}", headers)
    time.sleep(0.5)
    for result in results:
        result["trap_hits_so_far"] = trap.hits
    return results


def _oversize(remote: str) -> list[str]:
    quote = urllib.parse.quote
    return [
        f"/tables/word_counts/keys/{'k' * 1025}",
        f"/tables/inventory/keys/{quote('é' * 600)}",
        f"/tables/sales_by_category/keys/{'c' * 5000}?at=0",
        f"/tables/products/keys/{'s' * 2048}",
        f"/metadata/tables/word_counts/keys/{'k' * 4096}",
        f"/tables/word_counts/keys?prefix={'p' * 2000}",
        f"/tables/word_counts/keys?cursor={'c' * 5000}",
        f"/tables/word_counts/keys/{'k' * 200_000}",
    ]


def _traversal(remote: str) -> list[tuple[str, str | None]]:
    return [
        ("/tables/..%2F..%2Fetc%2Fpasswd/keys/x", None),
        ("/tables/word_counts/keys/..%2F..%2F..%2Fetc%2Fpasswd", "../../../etc/passwd"),
        ("/tables/word_counts/keys/../../metadata", "../../metadata"),
        ("/tables/word_counts/keys/%2E%2E", ".."),
        ("/tables/word_counts/keys/..%2F..%2Finternal%2Fassignment", "../../internal/assignment"),
        ("/tables/word_counts/keys/%2E%2E%2F%2E%2E%2Fhealth", "../../health"),
        ("/metadata/tables/..%2Fword_counts/keys/x", None),
        ("/internal/tables/..%2F..%2Fetc/scan?partitions=0", None),
        ("/tables/word_counts/keys/..%5C..%5Cwindows", "..\\..\\windows"),
        (f"/tables/word_counts/keys/{remote}%2F..%2F..%2F..%2Fmetadata", None),
        ("/tables/word_counts/keys/%252E%252E%252Fmetadata", "%2E%2E%2Fmetadata"),
    ]


def _spoofs(trap: str, remote: str) -> list[tuple[dict[str, str], str]]:
    host = trap.removeprefix("http://")
    read = f"/tables/word_counts/keys/{remote}"
    quoted = urllib.parse.quote(trap, safe="")
    return [
        ({"Host": host}, read),
        ({"X-Forwarded-Host": host, "X-Forwarded-Proto": "http"}, read),
        ({"Forwarded": f"host={host};proto=http"}, read),
        ({"X-Forwarded-For": "127.0.0.1", "X-Real-IP": "127.0.0.1"}, read),
        ({"X-Original-URL": f"{trap}{read}", "X-Rewrite-URL": f"{trap}{read}"}, read),
        ({"X-Served-By": trap, "X-Replica": "active", "X-Streamstate-Owner": trap}, read),
        ({"Referer": trap, "Origin": trap}, read),
        ({}, f"{read}?owner={quoted}&target={quoted}&host={host}&url={quoted}"),
        ({}, f"{trap}{read}"),  # an absolute-form request target naming the trap
    ]


def _judge(
    kind: str,
    target: str,
    headers: dict[str, str] | None,
    status: int | None,
    body: Any,
    group: set[str],
    expect_key: str | None,
    forwarded: float,
) -> dict[str, Any]:
    """Refused: no 5xx; a key read names the key it was given and is served by a member;
    a forwarded read is never forwarded again; nothing leaks another route's answer."""
    reasons = []
    if status is None:
        reasons.append(f"no answer: {str(body)[:120]}")
    elif status >= 500:
        reasons.append(f"answered {status}")
    if isinstance(body, dict):
        served = str(body.get("served_by") or "").rstrip("/")
        if served and served not in group:
            reasons.append(f"served by {served}, not a member")
        if expect_key is not None and "key" in body and body["key"] != expect_key:
            reasons.append(f"read the key {body['key']!r}, not {expect_key!r}")
        if kind != "spoofed target" and kind != "forwarding loop" and status == 200:
            reasons.append("answered 200")
        active = body.get("active")
        if active is not None and str(active).rstrip("/") not in group:
            reasons.append(f"named {active} as the owner")
        if "hosts" in body or "tables" in body:
            reasons.append("answered another route")
    elif isinstance(body, str) and "root:" in body:
        reasons.append("leaked a file")
    if kind == "forwarding loop" and forwarded:
        reasons.append(f"forwarded a forwarded read ({forwarded:g} forwards)")
    return {
        "group": kind,
        "target": target[:120],
        "headers": {k: v[:80] for k, v in (headers or {}).items()},
        "status": status,
        "detail": _detail(body),
        "forwards": forwarded,
        "refused": not reasons,
        "why_not": reasons,
    }


def _detail(body: Any) -> str | None:
    if isinstance(body, dict):
        return str(body.get("detail") or body.get("replica") or "")[:160]
    return None if body is None else str(body)[:160]
