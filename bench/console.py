"""The console open in a browser while a bench run goes on: Debian's chromium, driven by
Playwright in a process of its own, shows each view of a worker's console (/ui) in turn,
as an operator watching an incident would, until it is stopped.

    python -m bench.console URL
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from bench.config import ROOT
from tests.support.browser import OFFLINE_FLAGS

#: The console's views, shown in turn; each polls the worker while it is shown.
VIEWS = ("topology", "group", "tables", "dead-letters", "nightly")
#: How long each view stays before the next is shown.
VIEW_S = 5.0
#: The line the viewer prints once its browser is up (before it reaches the worker).
LAUNCHED = "bench.console: browser launched"
#: How long the viewer waits for the worker's console to answer.
REACH_S = 60.0


def browse(url: str) -> None:
    """Launch the browser, then show the views of the console at ``url`` in turn, for
    ever (the worker may start after the browser: its page is asked for until it answers)."""
    from playwright.sync_api import Error, sync_playwright

    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        raise SystemExit("no chromium on PATH: run `make tools` (apt-get install chromium)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=OFFLINE_FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        print(LAUNCHED, flush=True)
        deadline = time.monotonic() + REACH_S
        while True:
            try:
                page.goto(f"{url}/ui/")
                break
            except Error as error:
                if time.monotonic() > deadline:
                    raise
                print(f"console not reachable yet: {error.message.splitlines()[0]}", flush=True)
                page.wait_for_timeout(250)
        while True:
            for view in VIEWS:
                page.goto(f"{url}/ui/#/{view}")
                page.wait_for_timeout(VIEW_S * 1000)


@contextlib.contextmanager
def console_open(url: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The console of the worker at ``url`` open in a browser for the ``with`` block,
    entered once the browser is up: a worker started inside the block does not share the
    machine with a browser's launch, only with the console it shows."""
    start = log.stat().st_size if log.exists() else 0
    with log.open("ab") as out:
        viewer = subprocess.Popen(
            [sys.executable, "-m", "bench.console", url], cwd=ROOT, stdout=out, stderr=out
        )
    try:
        _wait_launched(viewer, log, start)
        yield viewer
    finally:
        if viewer.poll() is None:
            viewer.send_signal(signal.SIGTERM)
            try:
                viewer.wait(10)
            except subprocess.TimeoutExpired:
                viewer.kill()
                viewer.wait()


def _wait_launched(viewer: subprocess.Popen[bytes], log: Path, start: int) -> None:
    deadline = time.monotonic() + REACH_S
    while LAUNCHED.encode() not in log.read_bytes()[start:]:
        if viewer.poll() is not None:
            raise RuntimeError(f"the console's browser exited with {viewer.returncode} ({log})")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the console's browser did not start in {REACH_S:g} s ({log})")
        time.sleep(0.1)


def main() -> None:
    url = sys.argv[1]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    browse(url)


if __name__ == "__main__":
    main()
