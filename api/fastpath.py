"""A lean path for the most frequent request: a plain key read.

``GET /tables/{table}/keys/{key}``, with no query parameters but the consistency ones
(``consistent_with``, ``timeout_ms``, ``max_lag_records``, ``max_lag_ms``), on a table
that is not windowed, with the right bearer token (when one is set), is answered here by
the same :class:`~api.queries.Queries` the FastAPI route uses, without FastAPI's routing,
dependency injection and response classes: those cost more per read than the read.
Everything else (other routes, change streams, windowed reads, other query parameters,
values FastAPI would refuse, a missing or wrong token, a key FastAPI or
:func:`~api.queries.encode_key` would refuse) goes to the FastAPI app unchanged, which
answers it, errors included, exactly as before. A change stream is told from a key read
by the path as sent (:mod:`api.paths`), as the FastAPI app tells them: ``x%2Fchanges``
is the key ``x/changes``, read here.

A peer's batch of plain key reads (``GET /internal/reads/{table}?key=..``, see
:mod:`api.peers`) is answered here too, each key as a forwarded read.

Such a read does not become an ASGI request at all: :class:`KeyReadProtocol`, the
worker's uvicorn protocol, answers it from the parsed request line and headers, at once
when this worker's own copy answers it (the most frequent case, and a forwarded read's
case on the worker it was forwarded to); from the owner's answer when the owner holds
it, with no task (the read joins the owner's batch of this turn of the event loop); and
by a task otherwise. The response goes out in one write. :class:`KeyReads` answers the
same reads as an ASGI app, for a server that does not use the protocol.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import time
from collections.abc import Awaitable
from typing import Any
from urllib.parse import parse_qsl, unquote

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from api.errors import QueryError
from api.metrics import QUERY_LATENCY
from api.paths import names_changes, raw_path, utf8_path
from api.peers import BATCH_KEYS, BATCH_ROUTE, FORWARDED_HEADER, PeerAnswer
from api.queries import (
    MAX_WAIT_MS,
    Answer,
    KeyQuery,
    Queries,
    ReadOptions,
    key_too_long,
    owners_answer,
)
from api.routing import QueryTable
from api.tokens import MAX_TOKEN_CHARS

Headers = list[tuple[bytes, bytes]]
#: status, JSON body, and the headers besides content-length and content-type
Response = tuple[int, bytes, Headers]

logger = logging.getLogger(__name__)

#: The route template the FastAPI app reports for key reads (the latency metric's label).
KEY_ROUTE = "/tables/{table}/keys/{key:path}"
#: The route template of a peer's batch of reads (the latency metric's label).
BATCH_TEMPLATE = BATCH_ROUTE + "{table}"
_PREFIX = "/tables/"
_KEYS = "/keys/"
_FORWARDED = FORWARDED_HEADER.lower().encode("latin-1")
_OPTIONS = frozenset({"consistent_with", "timeout_ms", "max_lag_records", "max_lag_ms"})
#: a read's options when it gives none (never changed: shared by every such read)
_NO_OPTIONS = ReadOptions()


class KeyReads:
    """Pure ASGI app in front of the FastAPI app ``api``; :class:`KeyReadProtocol` asks
    it for plain key reads before uvicorn builds their ASGI request."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self._latency: dict[tuple[str, str], Any] = {}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "GET" or not utf8_path(scope):
            await self.api(scope, receive, send)
            return
        started = time.perf_counter()
        request = self.lean_request(
            scope["path"], raw_path(scope), scope["query_string"], scope["headers"]
        )
        if request is None:  # not a plain key read nor a batch (lean_request checks)
            await self.api(scope, receive, send)
            return
        response = request.now()
        if response is None:
            soon = request.soon()
            response = None if soon is None else request.relay(await soon)
        if response is None:
            response = await request.later()
        status, body, headers = response
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-length", str(len(body)).encode()),
                    (b"content-type", b"application/json"),
                    *headers,
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
        request.observe(headers, started)

    @functools.cached_property
    def queries(self) -> Queries:
        queries: Queries = self.api.state.queries  # set before the app serves
        return queries

    @functools.cached_property
    def _token(self) -> str | None:
        token: str | None = self.api.state.worker.settings.api_token
        return token

    def observe(self, headers: Headers, started: float, route: str = KEY_ROUTE) -> None:
        """The read's latency, in the metric the FastAPI routes report to."""
        replica = next((v.decode() for k, v in headers if k == b"x-replica"), "none")
        child = self._latency.get((route, replica))
        if child is None:
            child = QUERY_LATENCY.labels(route=route, replica=replica)
            self._latency[(route, replica)] = child
        child.observe(time.perf_counter() - started)

    def lean_request(
        self, path: str, raw: bytes, query_string: bytes, headers: Headers
    ) -> LeanRequest | None:
        """The request answered here: a plain key read or a peer's batch of them; None
        to leave the request to FastAPI. ``path`` is percent-decoded, ``raw`` as sent."""
        if path.startswith(BATCH_ROUTE):
            batch = self.plain_batch(path, query_string, headers)
            return None if batch is None else BatchRead(self, *batch)
        read = self.plain_read(path, names_changes(raw), query_string, headers)
        return None if read is None else KeyRead(self, *read)

    def plain_batch(
        self, path: str, query_string: bytes, headers: Headers
    ) -> tuple[QueryTable, list[str], str] | None:
        """The table, keys and sender of a peer's batch of plain reads, or None to leave
        the request to FastAPI (which answers what is wrong with it)."""
        table_name = path[len(BATCH_ROUTE) :]
        if not table_name or "/" in table_name:
            return None
        table = self.queries.tables.get(table_name)
        if table is None or table.kind != "table":
            return None
        forwarded, authorization = _sender(headers)
        if not _authorized(self._token, authorization):
            return None
        try:
            pairs = parse_qsl(query_string.decode("latin-1"), strict_parsing=True)
        except ValueError:
            return None
        keys = [value for name, value in pairs if name == "key"]
        if not keys or len(keys) != len(pairs) or len(keys) > BATCH_KEYS:
            return None
        return table, keys, forwarded or "peer"

    def plain_read(
        self, path: str, changes: bool, query_string: bytes, headers: Headers
    ) -> tuple[KeyQuery, str | None] | None:
        """The query of a plain key read and who forwarded it, or None to leave the
        request to FastAPI. ``path`` is percent-decoded; ``changes`` says whether its
        last segment as sent is ``changes`` (:func:`~api.paths.names_changes`)."""
        if not path.startswith(_PREFIX):
            return None
        table_name, sep, key = path[len(_PREFIX) :].partition(_KEYS)
        if not sep or not table_name or "/" in table_name or not key:
            return None
        if changes and "/" in key:
            return None  # the change stream of the key before it
        if key_too_long(key):
            return None  # FastAPI's route refuses it (422)
        options = read_options(query_string)
        if options is None:
            return None
        queries = self.queries
        table = queries.tables.get(table_name)
        if table is None or table.kind == "windowed":
            return None
        forwarded, authorization = _sender(headers)
        if not _authorized(self._token, authorization):
            return None
        try:
            query = queries.query(table, key, None, None, None, options)
        except QueryError:
            return None
        return query, forwarded

    def answer_now(self, query: KeyQuery, forwarded: str | None) -> Response | None:
        """The response to a read that needs neither a wait nor another worker, or None
        when :meth:`answer` must give it."""
        try:
            answer = self.queries.read_now(query, forwarded)
        except QueryError as error:
            return _refusal(error)
        return None if answer is None else _response(answer)

    async def answer(self, query: KeyQuery, forwarded: str | None) -> Response:
        """The response to a plain key read, whatever it needs."""
        try:
            answer: Answer = await self.queries.read(query, forwarded)
        except QueryError as error:
            return _refusal(error)
        return _response(answer)


class LeanRequest:
    """A request :class:`KeyReads` answers: at once (:meth:`now`), from an answer that
    comes (:meth:`soon`, then :meth:`relay`), or else by :meth:`later`."""

    __slots__ = ("reads",)

    def __init__(self, reads: KeyReads) -> None:
        self.reads = reads

    def now(self) -> Response | None:
        """The response when nothing needs awaiting, else None."""
        raise NotImplementedError

    def soon(self) -> asyncio.Future[PeerAnswer | None] | None:
        """The answer of a peer that is asked now, which :meth:`relay` makes the
        response; None when the request takes :meth:`later`."""
        return None

    def relay(self, answer: PeerAnswer | None) -> Response | None:
        """The response from what :meth:`soon` gave, or None to answer by :meth:`later`."""
        return None

    def later(self) -> Awaitable[Response]:
        """The response, whatever it needs."""
        raise NotImplementedError

    def observe(self, headers: Headers, started: float) -> None:
        raise NotImplementedError


class KeyRead(LeanRequest):
    """A plain key read."""

    __slots__ = ("forwarded", "query")

    def __init__(self, reads: KeyReads, query: KeyQuery, forwarded: str | None) -> None:
        super().__init__(reads)
        self.query = query
        self.forwarded = forwarded

    def __str__(self) -> str:
        return f"key read {self.query.path}"

    def now(self) -> Response | None:
        return self.reads.answer_now(self.query, self.forwarded)

    def soon(self) -> asyncio.Future[PeerAnswer | None] | None:
        queries = self.reads.queries
        owner = queries.forward_owner(self.query, self.forwarded)
        if owner is None:
            return None
        table, key = self.query.table.name, self.query.key
        return queries.peers.read_soon(owner, table, key, purpose="owner")

    def relay(self, answer: PeerAnswer | None) -> Response | None:
        relayed = owners_answer(answer)
        return None if relayed is None else _response(relayed)

    def later(self) -> Awaitable[Response]:
        return self.reads.answer(self.query, self.forwarded)

    def observe(self, headers: Headers, started: float) -> None:
        self.reads.observe(headers, started)


class BatchRead(LeanRequest):
    """A peer's batch of plain reads of one table, each answered as a forwarded read."""

    __slots__ = ("forwarded", "keys", "table")

    def __init__(self, reads: KeyReads, table: QueryTable, keys: list[str], forwarded: str) -> None:
        super().__init__(reads)
        self.table = table
        self.keys = keys
        self.forwarded = forwarded

    def __str__(self) -> str:
        return f"batch of {len(self.keys)} reads of {self.table.name}"

    def now(self) -> Response | None:
        found = self.reads.queries.read_many_now(self.table, self.keys, self.forwarded)
        return None if found is None else _answers(found)

    async def later(self) -> Response:
        return _answers(await self.reads.queries.read_many(self.table, self.keys, self.forwarded))

    def observe(self, headers: Headers, started: float) -> None:
        self.reads.observe(headers, started, BATCH_TEMPLATE)


def _answers(found: list[tuple[int, Any]]) -> Response:
    return 200, orjson.dumps({"answers": found}), []


def _sender(headers: Headers) -> tuple[str | None, bytes | None]:
    """Who forwarded a request (the marker header's value), and its authorization."""
    forwarded: str | None = None
    authorization: bytes | None = None
    for name, value in headers:
        if name == b"authorization":
            authorization = value
        elif name == _FORWARDED:
            forwarded = value.decode("latin-1")
    return forwarded, authorization


def _refusal(error: QueryError) -> Response:
    headers = [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    return error.status, orjson.dumps(error.body()), headers


def _response(answer: Answer) -> Response:
    return (
        answer.status,
        orjson.dumps(answer.body),
        [
            (b"x-served-by", answer.served_by.encode()),
            (b"x-replica", answer.replica.encode()),
        ],
    )


def read_options(query_string: bytes) -> ReadOptions | None:
    """The consistency parameters of a query string, or None when it holds anything else
    (or a value the FastAPI route would refuse: FastAPI answers those)."""
    if not query_string:
        return _NO_OPTIONS
    return _parsed_options(query_string)


@functools.lru_cache(maxsize=1024)
def _parsed_options(query_string: bytes) -> ReadOptions | None:
    """:func:`read_options` of a query string, parsed once: a client that wrote reads
    several keys with the same token (the options are never changed once made)."""
    try:
        pairs = parse_qsl(query_string.decode("latin-1"), strict_parsing=True)
    except ValueError:
        return None
    found: dict[str, Any] = {}
    for name, value in pairs:
        if name in found or name not in _OPTIONS:
            return None
        if name == "consistent_with":
            if len(value) > MAX_TOKEN_CHARS:
                return None
            found[name] = value
            continue
        if not value.isascii() or not value.isdigit():
            return None
        number = int(value)
        if name == "timeout_ms" and number > MAX_WAIT_MS:
            return None
        found[name] = number
    return ReadOptions(**found)


def _authorized(expected: str | None, authorization: bytes | None) -> bool:
    """True when no token is set, or the header is ``Bearer <the token>``."""
    if not expected:
        return True
    if authorization is None:
        return False
    scheme, _, credentials = authorization.decode("latin-1").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(credentials.encode(), expected.encode())


class _Cycle:
    """Stands in uvicorn's protocol for the request cycle while :class:`KeyReadProtocol`
    answers a read itself: what uvicorn's callbacks read and set on a cycle."""

    __slots__ = ("disconnected", "keep_alive", "more_body", "response_complete")

    def __init__(self, keep_alive: bool) -> None:
        self.keep_alive = keep_alive
        self.response_complete = False
        self.disconnected = False
        self.more_body = False

    @property
    def message_event(self) -> _Cycle:
        return self  # uvicorn sets it when the request ends or the client goes

    def set(self) -> None:
        pass


#: The answer to a read that failed for a reason of this worker's, not of the request.
_FAILED: Response = (500, orjson.dumps({"detail": "Internal Server Error"}), [])


class KeyReadProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, answering plain key reads itself.

    A GET that :meth:`KeyReads.plain_read` takes, on a connection with no response in
    flight, is answered without an ASGI request: from this worker's copy at once when
    the read needs neither a wait nor another worker, else by a task; the response goes
    out in one write. Everything else (other requests, a read pipelined behind a response
    in flight) takes uvicorn's own path, and the protocol's keep-alive, pipelining and
    shutdown rules hold for both.
    """

    def __init__(self, config: Any, server_state: Any, app_state: Any, _loop: Any = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        app = config.app
        lean = isinstance(app, KeyReads) and not self.root_path and self.limit_concurrency is None
        self._reads: KeyReads | None = app if lean else None
        #: when the connection last fell idle (None: a request is being read or answered)
        self._idle_since: float | None = None

    # Keep-alive: uvicorn arms a timer after every response and cancels it when the next
    # request arrives, which costs a busy connection more than a plain read's answer. One
    # timer per connection here instead: when it fires, it closes the connection if it has
    # been idle for the whole timeout, else waits for the rest of it.

    def _unset_keepalive_if_required(self) -> None:
        self._idle_since = None  # data arrived (or the connection went): not idle

    def on_response_complete(self) -> None:
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle_since = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self._keep_alive_expired
            )

    def _keep_alive_expired(self) -> None:
        self.timeout_keep_alive_task = None
        if self._idle_since is None:
            return  # busy: the response arms the timer again
        left = self._idle_since + self.timeout_keep_alive - self.loop.time()
        if left > 0:
            self.timeout_keep_alive_task = self.loop.call_later(left, self._keep_alive_expired)
        else:
            self.timeout_keep_alive_handler()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None

    def on_headers_complete(self) -> None:
        reads, parser = self._reads, self.parser
        if (
            reads is not None
            and (self.cycle is None or self.cycle.response_complete)
            and not self.flow.write_paused
            and parser.get_method() == b"GET"
            and not parser.should_upgrade()
        ):
            parsed = httptools.parse_url(self.url)
            try:
                path = parsed.path.decode("ascii")
            except UnicodeDecodeError:
                path = ""  # uvicorn's own path refuses it
            if "%" in path:
                try:
                    path = unquote(path, errors="strict")
                except UnicodeDecodeError:
                    path = ""  # the app refuses it (api/middleware.PathMiddleware)
            request = (
                reads.lean_request(path, parsed.path, parsed.query or b"", self.headers)
                if path
                else None
            )
            if request is not None:
                keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
                self._answer(request, keep_alive)
                return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not isinstance(self.cycle, _Cycle):  # a GET's body: nothing reads it
            super().on_body(body)

    def _answer(self, request: LeanRequest, keep_alive: bool) -> None:
        started = time.perf_counter()
        cycle = _Cycle(keep_alive)
        self.cycle = cycle  # type: ignore[assignment]  # what uvicorn's callbacks use of it
        soon: asyncio.Future[PeerAnswer | None] | None = None
        try:
            response = request.now()
            if response is None:
                soon = request.soon()
        except Exception:
            logger.exception("%s failed", request)
            cycle.keep_alive = False
            response = _FAILED
        if response is not None:
            self._send(cycle, request, response, started)
        elif soon is not None:
            soon.add_done_callback(functools.partial(self._relay, request, cycle, started))
        else:
            self._answer_later(request, cycle, started)

    def _relay(
        self,
        request: LeanRequest,
        cycle: _Cycle,
        started: float,
        soon: asyncio.Future[PeerAnswer | None],
    ) -> None:
        if cycle.disconnected or self.transport.is_closing():
            cycle.response_complete = True
            return
        try:
            response = None if soon.cancelled() else request.relay(soon.result())
        except Exception:
            logger.exception("%s: relaying the owner's answer failed", request)
            response = None
        if response is None:  # the owner did not answer it: the whole way then
            self._answer_later(request, cycle, started)
        else:
            self._send(cycle, request, response, started)

    def _answer_later(self, request: LeanRequest, cycle: _Cycle, started: float) -> None:
        task = self.loop.create_task(self._later(request, cycle, started))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    async def _later(self, request: LeanRequest, cycle: _Cycle, started: float) -> None:
        try:
            response = await request.later()
        except Exception:
            logger.exception("%s failed", request)
            cycle.keep_alive = False
            response = _FAILED
        if cycle.disconnected or self.transport.is_closing():
            cycle.response_complete = True
            return
        self._send(cycle, request, response, started)

    def _send(
        self, cycle: _Cycle, request: LeanRequest, response: Response, started: float
    ) -> None:
        status, body, headers = response
        content = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            content += (name, b": ", value, b"\r\n")
        content.append(b"content-length: %d\r\ncontent-type: application/json\r\n" % len(body))
        for name, value in headers:
            content += (name, b": ", value, b"\r\n")
        if not cycle.keep_alive:
            content.append(b"connection: close\r\n")
        content += (b"\r\n", body)
        self.transport.write(b"".join(content))
        cycle.response_complete = True
        if not cycle.keep_alive:
            self.transport.close()
        request.observe(headers, started)
        self.on_response_complete()
