"""The dead-member watch (api/members.py): only a port that refuses, probe after probe,
gets its member evicted; an unreachable one does not."""

from __future__ import annotations

import asyncio
import socket

import pytest

from api import members
from api.members import DeadMembers, refuses


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_closed_port_refuses_and_a_listening_one_does_not() -> None:
    async def check() -> tuple[bool, bool]:
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            listening = await refuses(f"http://127.0.0.1:{port}")
        finally:
            server.close()
            await server.wait_closed()
        return await refuses(f"http://127.0.0.1:{closed_port()}"), listening

    assert asyncio.run(check()) == (True, False)


def test_a_host_that_does_not_answer_is_not_taken_for_a_gone_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def silent(host: str, port: int) -> None:
        await asyncio.sleep(10)  # a partitioned host: no answer at all

    async def unreachable(host: str, port: int) -> None:
        raise OSError(113, "No route to host")

    monkeypatch.setattr(asyncio, "open_connection", silent)
    assert asyncio.run(refuses("http://10.1.2.3:6066", seconds=0.1)) is False
    monkeypatch.setattr(asyncio, "open_connection", unreachable)
    assert asyncio.run(refuses("http://10.1.2.3:6066")) is False


def test_a_member_is_evicted_after_consecutive_refusals_and_only_once() -> None:
    gone = f"http://127.0.0.1:{closed_port()}"
    evicted: list[list[str]] = []

    async def evict(urls: list[str]) -> dict[str, str]:
        evicted.append(urls)
        return dict.fromkeys(urls, "removed")

    watch = DeadMembers(lambda: [gone], evict, probes=2)

    async def rounds() -> list[list[str]]:
        return [await watch.probe_once() for _ in range(4)]

    assert asyncio.run(rounds()) == [[], [gone], [], []]
    assert evicted == [[gone]]
    assert watch.evictions == 1


def test_a_member_that_answers_between_refusals_is_not_evicted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gone = f"http://127.0.0.1:{closed_port()}"
    answers = iter([True, False, True, False])
    evicted: list[list[str]] = []

    async def evict(urls: list[str]) -> dict[str, str]:
        evicted.append(urls)
        return {}

    watch = DeadMembers(lambda: [gone], evict, probes=2)

    async def flaky(url: str, seconds: float = 0.3) -> bool:
        return next(answers)

    monkeypatch.setattr(members, "refuses", flaky)

    async def rounds() -> None:
        for _ in range(4):
            await watch.probe_once()

    asyncio.run(rounds())
    assert evicted == []
