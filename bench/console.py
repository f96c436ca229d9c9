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


def browse(url: str) -> None:
    """Show the views of the console at ``url`` in turn, for ever."""
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        raise SystemExit("no chromium on PATH: run `make tools` (apt-get install chromium)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=OFFLINE_FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{url}/ui/")
        while True:
            for view in VIEWS:
                page.goto(f"{url}/ui/#/{view}")
                page.wait_for_timeout(VIEW_S * 1000)


@contextlib.contextmanager
def console_open(url: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The console of the worker at ``url`` open in a browser for the ``with`` block."""
    with log.open("ab") as out:
        viewer = subprocess.Popen(
            [sys.executable, "-m", "bench.console", url], cwd=ROOT, stdout=out, stderr=out
        )
    try:
        yield viewer
    finally:
        if viewer.poll() is None:
            viewer.send_signal(signal.SIGTERM)
            try:
                viewer.wait(10)
            except subprocess.TimeoutExpired:
                viewer.kill()
                viewer.wait()


def main() -> None:
    url = sys.argv[1]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    deadline = time.monotonic() + 60.0  # the worker's API starts a moment after its process
    while True:
        try:
            browse(url)
        except Exception as error:
            if time.monotonic() > deadline:
                raise
            print(f"console not reachable yet: {error!r}", flush=True)
            time.sleep(1.0)


if __name__ == "__main__":
    main()
