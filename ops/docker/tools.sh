#!/usr/bin/env bash
# `make tools`: what the Docker checks of the test suite need and pip cannot install.
# A compose CLI validates docker-compose*.yml without a Docker engine: Docker's own
# `docker compose` when present, else Debian's docker-compose (v1, Python). Installs it
# with apt-get when run as root; otherwise says how, and the check that needs it skips.
set -euo pipefail

if docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "tools: installing Debian's docker-compose (validates the compose files)" >&2
  log="$(mktemp)"
  if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends docker-compose; } >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    rm -f "$log"
    exit 1
  fi
  rm -f "$log"
else
  echo "tools: no compose CLI; 'apt-get install docker-compose' (as root) enables the" \
    "compose validation tests" >&2
fi
