"""Ports of the test brokers."""

from __future__ import annotations

import socket

import pytest


def require_free_port(port: int) -> None:
    """Fail unless nothing listens on 127.0.0.1:``port``: ops/kafka.sh takes any broker
    answering there for the one it started, so a test would use another cluster."""
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            pytest.fail(
                f"127.0.0.1:{port} is taken by another process: "
                "set STREAMSTATE_TEST_KAFKA_PORT to a free port"
            )
