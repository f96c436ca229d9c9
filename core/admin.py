"""Create the pipelines' topics before anything reads or writes them.

Brokers may auto-create a topic with one partition the first time a client asks for
it; tables need their source topics co-partitioned with their changelogs, so every
topic is created explicitly, with its partitions and configuration, and an existing
topic with another partition count is reported instead of used.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from core.errors import TopicLayoutError
from core.topics import TopicSpec

logger = logging.getLogger(__name__)


async def ensure_topics(bootstrap: str, specs: list[TopicSpec], replication_factor: int) -> None:
    """Create missing topics; raise TopicLayoutError when one exists with other partitions."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        await admin.start()
        existing = set(await admin.list_topics())
        missing = [spec for spec in specs if spec.name not in existing]
        if missing:
            new = [
                NewTopic(spec.name, spec.partitions, replication_factor, topic_configs=spec.config)
                for spec in missing
            ]
            # Topics another worker creates at the same moment come back as errors in
            # the answer, not as exceptions; the description below checks the outcome.
            await admin.create_topics(new)
            logger.info("created topics: %s", ", ".join(spec.name for spec in missing))
        counts: dict[str, int] = {}
        for _ in range(40):
            described = await admin.describe_topics([spec.name for spec in specs])
            counts = {d["topic"]: len(d["partitions"]) for d in described if d["partitions"]}
            if len(counts) == len(specs):
                break
            await asyncio.sleep(0.25)
        wrong = {s.name: counts.get(s.name) for s in specs if counts.get(s.name) != s.partitions}
        if wrong:
            raise TopicLayoutError(
                "topics exist with other partition counts than configured "
                f"({specs[0].partitions}): {wrong}"
            )
    finally:
        await admin.close()


async def partitions_of(bootstrap: str, topic: str, wait_s: float = 30.0) -> list[int]:
    """The partition ids of a topic, waiting up to ``wait_s`` for it to exist."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        await admin.start()
        deadline = asyncio.get_running_loop().time() + wait_s
        while True:
            described = await admin.describe_topics([topic])
            found = [p["partition"] for d in described for p in d["partitions"]]
            if found or asyncio.get_running_loop().time() > deadline:
                return sorted(found)
            await asyncio.sleep(0.5)
    finally:
        await admin.close()


async def topic_configs(bootstrap: str, topics: list[str]) -> dict[str, dict[str, str]]:
    """Each existing topic's configuration as the broker applies it (its own settings,
    and the broker's defaults for the rest); topics the broker does not know are left out."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        await admin.start()
        resources = [ConfigResource(ConfigResourceType.TOPIC, topic) for topic in topics]
        answers = await admin.describe_configs(resources)
    finally:
        await admin.close()
    found: dict[str, dict[str, str]] = {}
    for answer in answers:
        for error_code, _message, _kind, name, entries in answer.resources:
            if error_code == 0:
                found[name] = {entry[0]: entry[1] for entry in entries if entry[1] is not None}
    return found
