"""Page views per user and per country, in 5-minute windows of event time."""

from datetime import timedelta

from pydantic import BaseModel

from streams import Context, Model, Topology, Tumbling


class PageView(BaseModel):
    user: str
    page: str
    ts: int  # event time, epoch milliseconds


class User(BaseModel):
    user: str
    country: str


FIVE_MINUTES = Tumbling(timedelta(minutes=5))


def country_of(view: PageView, user: User | None) -> str:
    return user.country if user is not None else "unknown"


def pipelines(context: Context) -> Topology:
    topology = Topology("pageviews")
    users = topology.global_table("users", Model(User), key="user")
    views = topology.source("page-views", Model(PageView), key="user", timestamp="ts")

    views.group_by_key().window_by(FIVE_MINUTES).count("views_per_user")

    (
        views.join(users, country_of, how="left", key=lambda view: view.user)
        .group_by(name="by_country")
        .window_by(FIVE_MINUTES)
        .count("views_per_country")
    )
    return topology
