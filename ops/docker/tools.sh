#!/usr/bin/env bash
# `make tools`: what the test suite needs and pip cannot install.
# - A compose CLI validates docker-compose*.yml without a Docker engine: Docker's own
#   `docker compose` when present, else Debian's docker-compose (v1, Python).
# - Debian's chromium opens /docs, /redoc and the console (/ui) headless, as a user would,
#   with no host but 127.0.0.1 reachable (tests/integration/test_docs_offline.py and
#   test_console.py, through Playwright); Playwright's own browser download is not used.
# - Debian's wrk drives the benchmark's interactive-query reads (bench/wrk.py); without it
#   the benchmark falls back to its Python load generator and says so in its report.
# Installs what is missing with apt-get when run as root; otherwise says how, and the
# browser tests fail saying the same.
set -euo pipefail

missing=()
if ! docker compose version >/dev/null 2>&1 && ! command -v docker-compose >/dev/null 2>&1; then
  missing+=(docker-compose)
fi
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  missing+=(chromium)
fi
if ! command -v wrk >/dev/null 2>&1; then
  missing+=(wrk)
fi
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "tools: installing Debian's ${missing[*]}" >&2
  log="$(mktemp)"
  if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    rm -f "$log"
    exit 1
  fi
  rm -f "$log"
else
  echo "tools: missing ${missing[*]}; 'apt-get install ${missing[*]}' (as root) enables" \
    "the compose validation and headless-browser tests" >&2
fi
