#!/usr/bin/env bash
# `make run`: one worker with its HTTP API on 127.0.0.1:6066 and the demo generator, on the
# local Kafka that `make kafka-up` started. Ctrl-C stops what this script started.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PORT="${KAFKA_PORT:-9092}"
WEB_PORT="${WEB_PORT:-6066}"
DATADIR="${DATADIR:-$ROOT/.data/worker-$WEB_PORT}"
mkdir -p "$DATADIR" .data
pids=()
alive() {
  local pid
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && return 0; done
  return 1
}
cleanup() {
  trap - INT TERM EXIT
  echo "run: stopping worker and generator" >&2
  # Ctrl-C in a terminal has already signalled the whole process group: give the
  # children time to stop on their own (a second signal interrupts a clean shutdown).
  for _ in $(seq 1 20); do alive || break; sleep 0.5; done
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 1 60); do alive || break; sleep 0.5; done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  echo "run: stopped (Kafka keeps running; make kafka-down stops it)" >&2
}
trap cleanup INT TERM EXIT

BROKER_URL="kafka://127.0.0.1:$PORT" .venv/bin/faust --datadir "$DATADIR" -A app.main worker \
  -l info --web-host 127.0.0.1 --web-port "$WEB_PORT" &
pids+=($!)
echo "run: waiting for the worker on http://127.0.0.1:$WEB_PORT/ready" >&2
for _ in $(seq 1 240); do
  curl -fs "http://127.0.0.1:$WEB_PORT/ready" >/dev/null 2>&1 && break
  kill -0 "${pids[0]}" 2>/dev/null || { echo "run: the worker exited" >&2; exit 1; }
  sleep 0.5
done
.venv/bin/python -m ops.generator --bootstrap "127.0.0.1:$PORT" --rate "${RATE:-20}" &
pids+=($!)
cat >&2 <<MSG
run: ready. Try:
  curl -s http://127.0.0.1:$WEB_PORT/tables
  curl -s http://127.0.0.1:$WEB_PORT/tables/word_counts/keys/the
  curl -s http://127.0.0.1:$WEB_PORT/tables/inventory/keys/store-001
  curl -s 'http://127.0.0.1:$WEB_PORT/tables/sales_by_category/keys/dairy'
Ctrl-C stops the worker and the generator.
MSG
wait "${pids[@]}"
