#!/usr/bin/env bash
# The local Apache Kafka (KRaft) cluster: 1 or 3 combined broker+controller nodes on
# 127.0.0.1, run as plain Java processes from Maven Central jars.
#
#   ops/kafka.sh up | down | status | jars
#
# KAFKA_BROKERS  1 (default) or 3
# KAFKA_PORT     client port of node 1 (default 9092); node i listens on KAFKA_PORT + 2*(i-1)
#                for clients and on the next port for the controller quorum
# KAFKA_DIR      data, pid files and logs (default .kafka/); delete it while stopped for a
#                fresh cluster
# KAFKA_HEAP     JVM heap per node (default 512m)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BROKERS="${KAFKA_BROKERS:-1}"
PORT="${KAFKA_PORT:-9092}"
DIR="${KAFKA_DIR:-$ROOT/.kafka}"
HEAP="${KAFKA_HEAP:-512m}"
POM="$ROOT/ops/kafka/pom.xml"
VERSION="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$POM")"
JARS="${KAFKA_JAR_CACHE:-$ROOT/.cache/kafka-$VERSION}"
PYTHON="$ROOT/.venv/bin/python"
[ -x "$PYTHON" ] || PYTHON=python3

log() { echo "kafka: $*" >&2; }

fetch_jars() {
  if [ -f "$JARS/.complete" ]; then return 0; fi
  log "resolving Apache Kafka $VERSION from Maven Central into ${JARS#"$ROOT"/}"
  rm -rf "$JARS"
  mvn -q -B -Dstyle.color=never -f "$POM" dependency:copy-dependencies \
    -DoutputDirectory="$JARS" -DincludeScope=runtime
  touch "$JARS/.complete"
}

node_dir() { echo "$DIR/node-$1"; }
client_port() { echo $((PORT + 2 * ($1 - 1))); }
controller_port() { echo $((PORT + 2 * ($1 - 1) + 1)); }

running_pid() {
  local pidfile
  pidfile="$(node_dir "$1")/kafka.pid"
  [ -f "$pidfile" ] || return 1
  local pid
  pid="$(cat "$pidfile")"
  kill -0 "$pid" 2>/dev/null || return 1
  echo "$pid"
}

write_config() {
  local i=$1 dir voters="" j rf isr
  dir="$(node_dir "$i")"
  for j in $(seq 1 "$BROKERS"); do
    voters+="${voters:+,}$j@127.0.0.1:$(controller_port "$j")"
  done
  if [ "$BROKERS" -ge 3 ]; then rf=3; isr=2; else rf=1; isr=1; fi
  mkdir -p "$dir/data" "$dir/logs"
  cat >"$dir/server.properties" <<EOF
process.roles=broker,controller
node.id=$i
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$(client_port "$i"),CONTROLLER://127.0.0.1:$(controller_port "$i")
advertised.listeners=PLAINTEXT://127.0.0.1:$(client_port "$i")
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$dir/data
num.partitions=1
default.replication.factor=$rf
min.insync.replicas=$isr
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
transaction.state.log.num.partitions=10
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$isr
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=2000
auto.create.topics.enable=false
log.cleaner.backoff.ms=5000
EOF
}

java_cmd() {
  local dir=$1 main=$2
  shift 2
  exec java -Xms128m -Xmx"$HEAP" -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$ROOT/ops/kafka/log4j2.properties" \
    -Dkafka.logs.dir="$dir/logs" \
    -cp "$JARS/*" "$main" "$@"
}

format_storage() {
  local i=$1 dir cluster_id
  dir="$(node_dir "$i")"
  [ -f "$dir/data/meta.properties" ] && return 0
  if [ ! -f "$DIR/cluster-id" ]; then
    (java_cmd "$dir" kafka.tools.StorageTool random-uuid) >"$DIR/cluster-id"
  fi
  cluster_id="$(tr -d '[:space:]' <"$DIR/cluster-id")"
  (java_cmd "$dir" kafka.tools.StorageTool format -t "$cluster_id" \
    -c "$dir/server.properties" --ignore-formatted) >"$dir/logs/format.out" 2>&1 || {
    log "formatting node $i failed:"
    tail -n 20 "$dir/logs/format.out" >&2
    return 1
  }
}

check_layout() {
  mkdir -p "$DIR"
  local want="brokers=$BROKERS port=$PORT"
  if [ -f "$DIR/layout" ] && [ "$(cat "$DIR/layout")" != "$want" ]; then
    log "$DIR holds a cluster of $(cat "$DIR/layout"), not $want."
    log "stop it (make kafka-down) and delete $DIR for a new layout."
    exit 1
  fi
  echo "$want" >"$DIR/layout"
}

show_failure() {
  local i=$1 dir
  dir="$(node_dir "$i")"
  log "node $i failed to start; the end of its logs:"
  tail -n 30 "$dir/logs/server.log" 2>/dev/null >&2 || true
  tail -n 30 "$dir/logs/kafka.out" 2>/dev/null >&2 || true
}

up() {
  fetch_jars
  check_layout
  local i started=()
  for i in $(seq 1 "$BROKERS"); do
    if pid="$(running_pid "$i")"; then
      log "node $i already running (pid $pid) on 127.0.0.1:$(client_port "$i")"
      continue
    fi
    write_config "$i"
    format_storage "$i"
    local dir
    dir="$(node_dir "$i")"
    java_cmd "$dir" kafka.Kafka "$dir/server.properties" >"$dir/logs/kafka.out" 2>&1 </dev/null &
    echo $! >"$dir/kafka.pid"
    started+=("$i")
    log "node $i starting (pid $!) on 127.0.0.1:$(client_port "$i")"
  done
  if ! "$PYTHON" "$ROOT/ops/kafka_ready.py" --port "$PORT" --brokers "$BROKERS" \
    --timeout "${KAFKA_START_TIMEOUT:-90}"; then
    for i in $(seq 1 "$BROKERS"); do
      running_pid "$i" >/dev/null || show_failure "$i"
    done
    [ ${#started[@]} -gt 0 ] && show_failure "${started[0]}"
    exit 1
  fi
  log "ready: $BROKERS node(s), bootstrap 127.0.0.1:$PORT (Kafka $VERSION)"
}

down() {
  local i pid pids=()
  [ -d "$DIR" ] || { log "not running"; return 0; }
  for dir in "$DIR"/node-*; do
    [ -f "$dir/kafka.pid" ] || continue
    pid="$(cat "$dir/kafka.pid")"
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
    rm -f "$dir/kafka.pid"
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 1 60); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "pid $pid did not stop in 30s; killing it"
      kill -9 "$pid" 2>/dev/null || true
    fi
  done
  log "stopped ${#pids[@]} node(s)"
}

status() {
  local i found=0
  for dir in "$DIR"/node-*; do
    [ -f "$dir/kafka.pid" ] || continue
    i="${dir##*-}"
    if pid="$(running_pid "$i")"; then
      echo "node $i: running (pid $pid) on 127.0.0.1:$(client_port "$i")"
      found=1
    else
      echo "node $i: stopped"
    fi
  done
  [ "$found" = 1 ]
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  jars) fetch_jars ;;
  *) echo "usage: $0 up|down|status|jars" >&2; exit 2 ;;
esac
