"""A user's pipeline module, as one would write it outside this repository: page views
per user in 5-minute windows with each user's country from a global table, time spent
per country in hopping windows with a grace (through a repartition topic), and each
user's browsing sessions. The nightly job's tests recompute it.

Values are JSON: ``page-views`` ``{"user", "page", "ms", "ts"}`` keyed by user,
``users`` ``{"user", "country"}`` (compacted) keyed by user.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from streams import Hopping, Json, Session, Topology, Tumbling
from tables.pipeline import Context

VIEWS = "page-views"
USERS = "users"
#: A page whose views the map refuses (its records go to the dead-letter topic).
BROKEN_PAGE = "/broken"


def user_of(view: dict[str, Any]) -> str:
    return str(view["user"])


def with_country(view: dict[str, Any], user: dict[str, Any] | None) -> dict[str, Any]:
    if view["page"] == BROKEN_PAGE:
        raise ValueError(f"cannot read page {view['page']}")
    return {**view, "country": "unknown" if user is None else user["country"]}


def country_of(view: dict[str, Any]) -> str:
    return str(view["country"])


def time_spent(view: dict[str, Any]) -> float:
    return float(view["ms"]) / 1000


def no_session() -> dict[str, Any]:
    return {"views": 0, "pages": []}


def add_view(user: str, view: dict[str, Any], session: dict[str, Any]) -> dict[str, Any]:
    pages = (
        session["pages"] if view["page"] in session["pages"] else [*session["pages"], view["page"]]
    )
    return {"views": session["views"] + 1, "pages": sorted(pages)}


def merge_sessions(user: str, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {"views": a["views"] + b["views"], "pages": sorted(set(a["pages"]) | set(b["pages"]))}


def pipelines(context: Context) -> Topology:
    topology = Topology("pageviews")
    users = topology.global_table(USERS, Json, key="user")
    views = topology.source(VIEWS, Json, key="user", timestamp="ts")
    enriched = views.join(users, with_country, how="left", key=user_of, name="country")
    enriched.group_by_key().window_by(Tumbling(timedelta(minutes=5))).count("views_per_user")
    (
        enriched.group_by(country_of, name="by_country")
        .window_by(Hopping(timedelta(minutes=10), timedelta(minutes=5), grace=timedelta(minutes=2)))
        .sum("seconds_by_country", time_spent)
    )
    (
        views.group_by_key()
        .window_by(Session(timedelta(minutes=3)))
        .aggregate("sessions", no_session, add_view, merge=merge_sessions)
    )
    return topology
