"""The worker's producer for records written through the API.

One idempotent aiokafka producer per worker, with ``acks=all``: a record is answered only
once every in-sync replica has it. It connects on first use (and again after a failed
start), so a worker whose brokers are down still starts and answers 503 until they are
back; the API's lifespan starts it early and stops it with the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from api.errors import KafkaUnavailable
from api.records import Outgoing

logger = logging.getLogger(__name__)

#: How long a send may wait for metadata or acknowledgement before the request fails.
REQUEST_TIMEOUT_MS = 10_000


class RecordProducer:
    """Sends records and answers where each one went: (partition, offset)."""

    def __init__(self, bootstrap: str, client_id: str = "streamstate-api") -> None:
        self.bootstrap = bootstrap
        self.client_id = client_id
        self._producer: AIOKafkaProducer | None = None
        self._lock = asyncio.Lock()
        self._warm_up: asyncio.Task[None] | None = None

    def warm_up(self) -> None:
        """Connect in the background, so that the first write does not wait for it."""
        self._warm_up = asyncio.ensure_future(self._quietly_started())

    async def _quietly_started(self) -> None:
        with contextlib.suppress(KafkaUnavailable):
            await self._started()

    async def _started(self) -> AIOKafkaProducer:
        async with self._lock:
            if self._producer is not None:
                return self._producer
            producer = AIOKafkaProducer(
                bootstrap_servers=self.bootstrap,
                client_id=self.client_id,
                acks="all",
                enable_idempotence=True,
                request_timeout_ms=REQUEST_TIMEOUT_MS,
            )
            try:
                await producer.start()
            except KafkaError as error:
                with contextlib.suppress(Exception):
                    await producer.stop()
                raise KafkaUnavailable(
                    f"cannot connect to Kafka at {self.bootstrap}: {error}; nothing was written"
                ) from None
            self._producer = producer
            return producer

    async def send(self, topic: str, records: Sequence[Outgoing]) -> list[tuple[int, int]]:
        """Produce ``records`` to ``topic``: (partition, offset) of each, in order.

        KafkaUnavailable when Kafka does not acknowledge every record; its detail says how
        many were written all the same (a record is never taken back once produced).
        """
        producer = await self._started()
        futures: list[asyncio.Future[Any]] = []
        failure: BaseException | None = None
        try:
            for record in records:
                futures.append(await producer.send(topic, record.value, key=record.key))
        except KafkaError as error:  # no metadata for the topic in time, or closed
            failure = error
        results = await asyncio.gather(*futures, return_exceptions=True)
        placed = [(r.partition, r.offset) for r in results if not isinstance(r, BaseException)]
        if failure is None and len(placed) == len(records):
            return placed
        written = len(placed)
        cause = failure or next(r for r in results if isinstance(r, BaseException))
        logger.warning("produce to %s failed: %r (%d written)", topic, cause, written)
        raise KafkaUnavailable(
            f"Kafka did not acknowledge every record for {topic}: {cause!r}; "
            f"{written} of {len(records)} records were written"
        )

    async def stop(self) -> None:
        if self._warm_up is not None:
            self._warm_up.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._warm_up
        async with self._lock:
            if self._producer is not None:
                await self._producer.stop()
                self._producer = None
