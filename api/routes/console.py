"""The console's routes: the topology with rates, the group, dead letters and their
replay, the nightly report. Every worker answers them for the whole group."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request

from api.bodies import JsonBodyRoute
from api.console import Console
from api.console.replays import Wanted
from api.console.schemas import (
    DeadLetters,
    Group,
    Member,
    Nightly,
    Replayed,
    ReplayRequest,
    Topology,
)
from api.console.topology import build, group_flow, group_lag
from api.deps import CHECKED_QUERY, known_query, require_token
from api.errors import KafkaUnavailable, NotFound
from api.schemas import ErrorDetail


def get_console(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


ConsoleDep = Annotated[Console, Depends(get_console)]

router = APIRouter(
    tags=["console"],
    dependencies=[Depends(require_token), Depends(known_query)],
    responses=CHECKED_QUERY,
)
internal = APIRouter(
    prefix="/internal/console",
    tags=["internal"],
    dependencies=[Depends(require_token)],
    include_in_schema=False,
)

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorDetail, "description": "missing or wrong bearer token"}
}


@router.get("/topology", response_model=Topology, responses=ERRORS)
async def topology(console: ConsoleDep) -> dict[str, Any]:
    """Each pipeline as a graph drawn from its declaration: source, repartition, output
    and dead-letter topics, steps and tables; records/s on each edge and the lag of each
    topic the pipelines read, for the whole group."""
    reports = await console.reports.group_flows()
    live = [r for r in reports if r.get("reachable")]
    graph = build(console.pipelines, console.table_kinds(), group_flow(live), group_lag(live))
    seconds = [r["rates"]["seconds"] for r in live if r.get("rates")]
    return {
        **graph,
        "sampled_over_s": max(seconds, default=0.0),
        "members": len(live),
        "unreachable": [r["url"] for r in reports if not r.get("reachable")],
    }


@router.get("/group", response_model=Group, responses=ERRORS)
async def group(console: ConsoleDep) -> dict[str, Any]:
    """Every member: the partitions it holds as active or standby copies with their lag,
    the source partitions it reads with their lag, its restore, its last rebalances and
    how long each paused processing, and its rates."""
    return {
        "partitions": console.worker.settings.topic_partitions,
        "members": await console.reports.group(),
    }


@router.get(
    "/dead-letters",
    response_model=DeadLetters,
    responses={
        **ERRORS,
        404: {"model": ErrorDetail, "description": "`topic` is not a dead-letter topic"},
        503: {"model": ErrorDetail, "description": "the replay log cannot be read"},
    },
)
async def dead_letters(
    console: ConsoleDep,
    topic: Annotated[str | None, Query(max_length=249)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> dict[str, Any]:
    """The latest records of the dead-letter topics (or of one), newest first, each with
    its reason, where it came from, and its replay if it was replayed."""
    sources = console.dead_letter_sources
    if topic is not None and topic not in sources:
        raise NotFound(f"{topic!r} is not a dead-letter topic: {', '.join(sorted(sources))}")
    try:
        await console.replay_log.start()
    except Exception as error:
        raise KafkaUnavailable(f"the replay log cannot be read: {error!r}") from None
    letters = await console.dead_letters.records(topic, limit)
    counts = console.dead_letters.counts()
    return {
        "topics": [
            {"topic": name, "source": sources[name], "records": counts.get(name, 0)}
            for name in sorted(sources)
        ],
        "records": [
            {**letter.as_dict(), "replay": console.replayer.status(letter.name)}
            for letter in letters
        ],
    }


async def replay(body: ReplayRequest, console: ConsoleDep) -> dict[str, Any]:
    """Send dead letters back to their source topics, once each: with their original key
    and value and a `replayed-from` header, validated first where the topic has a
    validator (a record still invalid goes back to its dead-letter topic). The body is
    JSON (`Content-Type: application/json`, or no type), as it is or gzip/deflate."""
    wanted = [Wanted(r.topic, r.partition, r.offset) for r in body.records]
    return {"results": await console.replayer.replay(wanted, body.apply_to_all)}


router.add_api_route(
    "/dead-letters/replay",
    replay,
    methods=["POST"],
    route_class_override=JsonBodyRoute,
    response_model=Replayed,
    responses={
        **ERRORS,
        400: {"model": ErrorDetail, "description": "a dead letter named twice, or a bad one"},
        404: {"model": ErrorDetail, "description": "not a dead-letter topic, or no record there"},
        409: {
            "model": ErrorDetail,
            "description": "some were replayed before (`refused` lists them), or one is a "
            "record a step raised on in one pipeline while others applied it (see "
            "`apply_to_all`): nothing replayed",
        },
        413: {"model": ErrorDetail, "description": "body over 1 MiB"},
        415: {"model": ErrorDetail, "description": "a Content-Type other than JSON"},
        503: {"model": ErrorDetail, "description": "Kafka did not take the replay"},
    },
)


@router.get("/nightly", response_model=Nightly, responses=ERRORS)
async def nightly(console: ConsoleDep) -> dict[str, Any]:
    """The newest nightly reconciliation report: per table the keys compared, differing
    and repaired, when the run took its cut and how long it took."""
    return console.nightly.latest()


@internal.get("/worker", response_model=Member)
async def own_report(console: ConsoleDep) -> dict[str, Any]:
    """This worker's own report (what /group gathers from every member)."""
    return console.reports.own()


@internal.get("/flow", response_model=Member)
async def own_flow(console: ConsoleDep) -> dict[str, Any]:
    """This worker's rates and sources' lag (what /topology gathers from every member)."""
    return console.reports.flow()
