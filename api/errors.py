"""The query layer's errors: each carries its HTTP status, headers and JSON answer (the
FastAPI app's handler, in api/app.py, and the lean key-read path answer with them)."""

from __future__ import annotations

from typing import Any


class QueryError(Exception):
    """An error with its HTTP status; ``detail`` is what the client reads, ``extra`` more
    fields of the answer."""

    status = 500

    def __init__(
        self,
        detail: str,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.headers = headers or {}
        self.extra = extra or {}

    def body(self) -> dict[str, Any]:
        """The JSON answer."""
        return {"detail": self.detail, **self.extra}


class BadRequest(QueryError):
    status = 400


class Unauthorized(QueryError):
    status = 401

    def __init__(self, detail: str) -> None:
        super().__init__(detail, {"WWW-Authenticate": "Bearer"})


class NotFound(QueryError):
    status = 404


class RequestTimeout(QueryError):
    """A request body that did not arrive in time, or whose client left before it did."""

    status = 408


class PayloadTooLarge(QueryError):
    """A request body beyond its limits (bytes or records)."""

    status = 413


class UnsupportedMediaType(QueryError):
    """A request body in a type or encoding the route does not read."""

    status = 415


class InvalidRecords(QueryError):
    """Records that the stream would refuse: ``problems`` holds (index, reason) pairs,
    the index None when the problem is the body as a whole."""

    status = 422

    def __init__(self, detail: str, problems: list[tuple[int | None, str]]) -> None:
        super().__init__(detail)
        self.problems = problems

    def body(self) -> dict[str, Any]:
        errors = [{"index": index, "reason": reason} for index, reason in self.problems]
        return {"detail": self.detail, "errors": errors}


class NotHeldHere(QueryError):
    """A forwarded read reached a worker with no copy of the partition (421 Misdirected)."""

    status = 421


class NoReplica(QueryError):
    """No copy of a partition could answer: the owner and every standby failed, or none
    is within the read's staleness bound."""

    status = 503

    def __init__(
        self, detail: str, retry_after: int = 1, extra: dict[str, Any] | None = None
    ) -> None:
        super().__init__(detail, {"Retry-After": str(retry_after)}, extra)


class NotYet(QueryError):
    """No copy reached the position a read waited for within its timeout (504)."""

    status = 504


class KafkaUnavailable(QueryError):
    """Kafka did not take records written through the API."""

    status = 503

    def __init__(self, detail: str, retry_after: int = 2) -> None:
        super().__init__(detail, {"Retry-After": str(retry_after)})
