"""The wrk driver of the benchmark's key reads: its request paths, its summary, and one
short run against a local HTTP server that answers some paths and refuses others."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from bench import wrk

DONE_LINE = (
    '{"wrk": {"requests": 1000, "duration_us": 2000000, "connect": 0, "read": 1, '
    '"write": 0, "status": 10, "timeout": 2, '
    '"latency_us": {"50": 1500, "90": 2500, "99": 4000, "99.9": 9000}}}'
)


def test_request_paths_encode_each_key_and_keep_the_base_path() -> None:
    paths = wrk.request_paths("http://h:1/api/", "counts", ["a b", "x/y", "é"], "max_lag_ms=5")
    assert paths == [
        "/api/tables/counts/keys/a%20b?max_lag_ms=5",
        "/api/tables/counts/keys/x%2Fy?max_lag_ms=5",
        "/api/tables/counts/keys/%C3%A9?max_lag_ms=5",
    ]


def test_summary_counts_refusals_and_socket_errors_as_failed() -> None:
    summary = wrk.summarize("Running 2s test\n" + DONE_LINE + "\n")
    assert summary["tool"] == "wrk"
    assert summary["ok"] == 990
    assert summary["failed"] == 13
    assert summary["rps"] == pytest.approx(495.0)
    assert summary["latency_ms"] == {"p50": 1.5, "p90": 2.5, "p99": 4.0, "p99.9": 9.0}


def test_summary_without_the_done_line_is_an_error_that_shows_the_output() -> None:
    with pytest.raises(ValueError, match=r"no summary line.*unable to connect"):
        wrk.summarize("unable to connect to 127.0.0.1:1\n")


def test_script_asks_wrk_for_every_reported_percentile() -> None:
    assert "local quantiles = {50, 90, 99, 99.9}" in wrk.script()


class Answers(BaseHTTPRequestHandler):
    """200 for the keys under /tables/t/keys/ whose name starts with "ok", else 404."""

    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        Answers.seen.append(self.path)
        status = 200 if self.path.startswith("/tables/t/keys/ok") else 404
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.skipif(not wrk.available(), reason="wrk is not installed (make tools)")
def test_run_reads_every_key_of_the_set_and_counts_the_refused(server: str, tmp_path: Path) -> None:
    Answers.seen = []
    summary = wrk.run(
        server,
        "t",
        ["ok1", "ok 2", "gone"],
        duration_s=1,
        connections=2,
        work=tmp_path,
        name="keys",
    )
    assert set(Answers.seen) == {
        "/tables/t/keys/ok1",
        "/tables/t/keys/ok%202",
        "/tables/t/keys/gone",
    }
    # Requests still in flight when wrk stops reach the server but not wrk's counts.
    in_flight = len(Answers.seen) - summary["requests"]
    assert 0 <= in_flight <= 2
    refused = Answers.seen.count("/tables/t/keys/gone")
    assert refused - in_flight <= summary["failed"] <= refused
    assert summary["failed"] > 0
    assert summary["ok"] == summary["requests"] - summary["failed"]
    assert (tmp_path / "keys-wrk.log").read_text().startswith("Running 1s test")
