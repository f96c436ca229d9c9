#!/usr/bin/env bash
# The local Apache Kafka (KRaft) cluster: 1 or 3 combined broker+controller nodes on
# 127.0.0.1, run as plain Java processes from Maven Central jars.
#
#   ops/kafka.sh up | down | kill | status | jars
#
# `jars` resolves the jars and writes a class-data archive of a node's start (AppCDS,
# kafka.jsa beside the jars), which every later node and tool starts from, loading its
# classes mapped from the archive instead of parsing them from the jars. `kill` stops the
# nodes with SIGKILL, for a cluster whose data is deleted next (tests); `down` stops them
# cleanly.
#
# KAFKA_BROKERS  1 (default) or 3
# KAFKA_PORT     client port of node 1 (default 9092); node i listens on KAFKA_PORT + 2*(i-1)
#                for clients and on the next port for the controller quorum
# KAFKA_DIR      data, pid files and logs (default .kafka/); delete it while stopped for a
#                fresh cluster
# KAFKA_HEAP     JVM heap per node (default 512m)
# KAFKA_PROPERTIES  more broker properties, one key=value per line, written after the
#                ones below (a later line wins): for tests of a broker set up otherwise
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BROKERS="${KAFKA_BROKERS:-1}"
PORT="${KAFKA_PORT:-9092}"
DIR="${KAFKA_DIR:-$ROOT/.kafka}"
HEAP="${KAFKA_HEAP:-512m}"
POM="$ROOT/ops/kafka/pom.xml"
VERSION="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$POM")"
JARS="${KAFKA_JAR_CACHE:-$ROOT/.cache/kafka-$VERSION}"
ARCHIVE="$JARS/kafka.jsa"
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

# The class-data archive: the classes a node loads from its start to ready, dumped by a
# throw-away node in a temporary directory when it stops. The JVM checks an archive against
# its own version and the class path, and starts without it when they differ.
class_archive() {
  [ -f "$ARCHIVE" ] && return 0
  local port
  port="$("$PYTHON" -c 'import socket
while True:  # a free client port whose next port (the controller) is free too
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        try:
            b.bind(("127.0.0.1", a.getsockname()[1] + 1))
        except OSError:
            continue
        print(a.getsockname()[1])
        break')"
  log "writing the class-data archive ${ARCHIVE#"$ROOT"/}"
  (
    DIR="$(mktemp -d)" PORT="$port" BROKERS=1
    trap 'rm -rf "$DIR"' EXIT
    archive_node
  ) || log "no class-data archive: nodes start without one"
}

archive_node() {
  local dir pid
  dir="$(node_dir 1)"
  write_config 1
  format_storage 1
  (ARCHIVE_AT_EXIT="$dir/kafka.jsa" java_cmd "$dir" kafka.Kafka "$dir/server.properties") \
    >"$dir/logs/kafka.out" 2>&1 </dev/null &
  pid=$!
  if ! "$PYTHON" "$ROOT/ops/kafka_ready.py" --port "$PORT" --timeout 60; then
    kill -9 "$pid"
    return 1
  fi
  kill "$pid"
  wait "$pid" || true
  [ -s "$dir/kafka.jsa" ] && mv "$dir/kafka.jsa" "$ARCHIVE"
}

# A cluster id as Kafka's `StorageTool random-uuid` makes one (a random UUID in URL-safe
# base64 without padding, not starting with "-"), without starting a JVM for it.
new_cluster_id() {
  "$PYTHON" -c 'import base64, uuid
while (i := base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")).startswith("-"):
    pass
print(i)'
}

node_dir() { echo "$DIR/node-$1"; }
client_port() { echo $((PORT + 2 * ($1 - 1))); }
controller_port() { echo $((PORT + 2 * ($1 - 1) + 1)); }

# Whether a process runs. A node's parent is gone, so once it exits it stays a zombie
# until init reaps it (seconds, on some machines): a zombie whose threads have all exited
# has stopped, and has closed its sockets and files. (The main thread of a killed JVM is a
# zombie for a second or so while another thread still tears the process down.)
alive() {
  local status
  if [ -d /proc/self ]; then
    status="$(cat "/proc/$1/status" 2>/dev/null)" || return 1
    ! { grep -q '^State:[[:space:]]*Z' <<<"$status" && grep -q '^Threads:[[:space:]]*1$' <<<"$status"; }
  else
    status="$(ps -o stat= -p "$1" 2>/dev/null)" || return 1
    [[ "$status" != Z* ]]
  fi
}

running_pid() {
  local pidfile
  pidfile="$(node_dir "$1")/kafka.pid"
  [ -f "$pidfile" ] || return 1
  local pid
  pid="$(cat "$pidfile")"
  alive "$pid" || return 1
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
broker.heartbeat.interval.ms=1000
broker.session.timeout.ms=4000
EOF
  if [ -n "${KAFKA_PROPERTIES:-}" ]; then
    printf '%s\n' "$KAFKA_PROPERTIES" >>"$dir/server.properties"
  fi
}

# A JVM of the cluster: it starts from the class-data archive, or writes one at its exit
# when ARCHIVE_AT_EXIT names the file (class_archive).
java_cmd() {
  local dir=$1 main=$2 share=()
  shift 2
  if [ -n "${ARCHIVE_AT_EXIT:-}" ]; then
    share=(-XX:ArchiveClassesAtExit="$ARCHIVE_AT_EXIT")
  elif [ -f "$ARCHIVE" ]; then
    share=(-XX:SharedArchiveFile="$ARCHIVE")
  fi
  exec java -Xms128m -Xmx"$HEAP" -XX:+UseG1GC -Djava.awt.headless=true "${share[@]}" \
    -Dlog4j2.configurationFile="$ROOT/ops/kafka/log4j2.properties" \
    -Dkafka.logs.dir="$dir/logs" \
    -cp "$JARS/*" "$main" "$@"
}

format_storage() {
  local i=$1 dir cluster_id
  dir="$(node_dir "$i")"
  [ -f "$dir/data/meta.properties" ] && return 0
  [ -f "$DIR/cluster-id" ] || new_cluster_id >"$DIR/cluster-id"
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

# Stop every node with `signal` and wait until each process has exited.
stop_nodes() {
  local signal=$1 pid pids=()
  [ -d "$DIR" ] || { log "not running"; return 0; }
  for dir in "$DIR"/node-*; do
    [ -f "$dir/kafka.pid" ] || continue
    pid="$(cat "$dir/kafka.pid")"
    if alive "$pid"; then
      kill -"$signal" "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
    rm -f "$dir/kafka.pid"
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 1 300); do
      alive "$pid" || break
      sleep 0.1
    done
    if alive "$pid"; then
      log "pid $pid did not stop in 30s; killing it"
      kill -9 "$pid" 2>/dev/null || true
    fi
  done
  log "stopped ${#pids[@]} node(s)"
}

down() { stop_nodes TERM; }

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
  kill) stop_nodes KILL ;;
  status) status ;;
  jars) fetch_jars && class_archive ;;
  *) echo "usage: $0 up|down|kill|status|jars" >&2; exit 2 ;;
esac
