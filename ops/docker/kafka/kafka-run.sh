#!/usr/bin/env bash
# The broker of the Kafka image, configured from the environment as apache/kafka's image is:
# KAFKA_FOO_BAR sets foo.bar (a double underscore stands for "_", a triple one for "-"),
# except the JVM's own KAFKA_HEAP_OPTS and KAFKA_OPTS; CLUSTER_ID formats an unformatted
# log directory. `kafka-run.sh --print-config` prints the settings and exits.
set -euo pipefail

CONFIG=/opt/kafka/config/server.properties

# One "key=value" line per KAFKA_* variable, in name order.
settings() {
  local name key
  while IFS= read -r name; do
    case "$name" in
      KAFKA_HEAP_OPTS | KAFKA_OPTS | KAFKA_JVM_PERFORMANCE_OPTS | KAFKA_LOG4J_OPTS) continue ;;
    esac
    key="${name#KAFKA_}"
    key="${key//___/-}"
    key="${key//__/$'\x01'}"
    key="${key//_/.}"
    key="${key//$'\x01'/_}"
    printf '%s=%s\n' "${key,,}" "${!name}"
  done < <(compgen -e | grep '^KAFKA_' | LC_ALL=C sort)
}

setting() { sed -n "s/^$1=//p" "$CONFIG" | tail -n 1; }

java_cmd() {
  local main=$1
  shift
  # KAFKA_HEAP_OPTS and KAFKA_OPTS are lists of JVM options: split on spaces on purpose.
  # shellcheck disable=SC2086
  exec java ${KAFKA_HEAP_OPTS:-} -XX:+UseG1GC -Djava.awt.headless=true ${KAFKA_OPTS:-} \
    -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties \
    -cp '/opt/kafka/libs/*' "$main" "$@"
}

if [ "${1:-}" = "--print-config" ]; then
  settings
  exit 0
fi
settings >"$CONFIG"
logs="$(setting log.dirs)"
logs="${logs:-/tmp/kafka-logs}"
if [ ! -f "${logs%%,*}/meta.properties" ]; then
  : "${CLUSTER_ID:?CLUSTER_ID must name the cluster to format a new log directory}"
  (java_cmd kafka.tools.StorageTool format -t "$CLUSTER_ID" -c "$CONFIG" --ignore-formatted)
fi
java_cmd kafka.Kafka "$CONFIG"
