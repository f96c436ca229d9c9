"""Debian's chromium for the browser tests: found on the PATH, or the test fails saying
how to install it (`make tools`, which `make test` runs first, installs it as root)."""

from __future__ import annotations

import shutil

import pytest

#: Flags for a browser that can reach no host but 127.0.0.1 (a machine without internet
#: access), and leaves out its own background traffic.
OFFLINE_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]


def chromium() -> str:
    """The chromium executable; fails the test when there is none."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail(
            "no chromium on PATH: run `make tools` as root (it runs `apt-get install "
            "chromium`), or install Debian's chromium package yourself",
            pytrace=False,
        )
    return found
