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

from api.background import stopped
from api.errors import KafkaUnavailable
from api.records import Outgoing

logger = logging.getLogger(__name__)

#: How long a send may wait for the topic's metadata, and a request for its answer.
REQUEST_TIMEOUT_MS = 10_000
#: How long a write waits for Kafka to acknowledge all its records before it fails.
ACK_TIMEOUT_S = 15.0
#: How long stopping waits for records still in flight.
STOP_TIMEOUT_S = 5.0


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
            except BaseException as error:  # failed, or the worker stops meanwhile
                with contextlib.suppress(Exception):
                    await producer.stop()
                if not isinstance(error, KafkaError):
                    raise
                raise KafkaUnavailable(
                    f"cannot connect to Kafka at {self.bootstrap}: {error}; nothing was written"
                ) from None
            self._producer = producer
            return producer

    async def send(self, topic: str, records: Sequence[Outgoing]) -> list[tuple[int, int]]:
        """Produce ``records`` to ``topic``: (partition, offset) of each, in order.

        KafkaUnavailable unless Kafka acknowledges every record within
        :data:`ACK_TIMEOUT_S`; its detail says how many were written all the same and how
        many may still be (a record handed to the producer is never taken back).
        """
        producer = await self._started()
        futures: list[asyncio.Future[Any]] = []
        failure: BaseException | None = None
        try:
            for record in records:
                futures.append(await producer.send(topic, record.value, key=record.key))
        except KafkaError as error:  # no metadata for the topic in time, or closed
            failure = error
        if futures:
            # The idempotent producer retries a batch for as long as the broker is away.
            await asyncio.wait(futures, timeout=ACK_TIMEOUT_S)
        placed = [f.result() for f in futures if _succeeded(f)]
        if failure is None and len(placed) == len(records):
            return [(meta.partition, meta.offset) for meta in placed]
        raise self._unavailable(topic, len(records), futures, failure)

    def _unavailable(
        self,
        topic: str,
        total: int,
        futures: list[asyncio.Future[Any]],
        failure: BaseException | None,
    ) -> KafkaUnavailable:
        pending = [f for f in futures if not f.done()]
        for future in pending:  # their outcome is logged by nobody: keep asyncio quiet
            future.add_done_callback(lambda f: f.cancelled() or f.exception())
        written = sum(1 for f in futures if _succeeded(f))
        errors = [f.exception() for f in futures if f.done() and not f.cancelled()]
        cause = failure or next((e for e in errors if e is not None), None)
        why = repr(cause) if cause else f"no acknowledgement within {ACK_TIMEOUT_S:g} s"
        logger.warning("produce to %s failed: %s (%d of %d written)", topic, why, written, total)
        detail = f"Kafka did not acknowledge every record for {topic}: {why}; "
        detail += f"{written} of {total} records were written"
        if pending:
            detail += f", {len(pending)} may still be written once Kafka is back"
        return KafkaUnavailable(detail)

    async def stop(self) -> None:
        """Stop the producer, waiting at most :data:`STOP_TIMEOUT_S` for records in flight
        (aiokafka would wait for ever while the brokers are away)."""
        # A producer cancelled while it connects would leave a connection behind.
        await stopped(self._warm_up, asyncio.Event())
        async with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            try:
                await asyncio.wait_for(producer.stop(), STOP_TIMEOUT_S)
            except TimeoutError:
                logger.warning("records still unacknowledged when the API producer stopped")


def _succeeded(future: asyncio.Future[Any]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None
