#!/usr/bin/env bash
# The compose cluster (docker-compose.yml) on the container engine this machine has: Docker
# when a Docker engine answers, podman otherwise (or CONTAINER_ENGINE=podman).
#
#   ops/docker/cluster.sh images    the base images, then the worker and batch images
#   ops/docker/cluster.sh up        images, then the cluster (compose up -d), waiting for health
#   ops/docker/cluster.sh down      the cluster and its volumes removed; podman's API service stopped
#   ops/docker/cluster.sh test      images, then tests/compose against the cluster, then down
#   ops/docker/cluster.sh env       the variables that let compose commands reach the engine
#   ops/docker/cluster.sh compose ARGS...   compose ARGS against the engine (logs, ps, ...)
#
# With podman: Debian's podman, runc, iptables, netavark, aardvark-dns, catatonit,
# debootstrap and docker-compose are apt-installed when missing (as root); CONTAINERS_CONF
# names ops/docker/containers.conf; `podman system service` serves the Docker API that
# docker-compose drives, on a socket under STATE; and where no systemd runs the health
# checks (podman hands them to systemd timers), a loop of this script runs them.
#
# Base images: PYTHON_IMAGE (default python:3.11-slim-bookworm) and KAFKA_IMAGE:KAFKA_VERSION
# (default apache/kafka and the version in ops/kafka/pom.xml) are used when present or
# pullable. When the registry cannot be reached, and unless they were set, they are made
# here: streamstate-python:3.11-bookworm by debootstrap from the Debian mirror apt uses,
# and streamstate-kafka:<version> from the jars `make kafka-up` runs (ops/docker/kafka/).
#
# STATE              pid files, logs, the podman socket, build contexts (default .compose/)
# COMPOSE_PROJECT_NAME   compose project (default streamstate)
# KAFKA_HOST_PORT, WORKER_1_PORT..WORKER_3_PORT   host ports on 127.0.0.1 (19092, 6066-6068)
# DEBIAN_MIRROR      debootstrap's mirror (default: the first one in /etc/apt/sources.list*)
# PIP_INDEX_URL      passed to the image builds when set here or in pip's configuration
# HOST_CA_BUNDLE     the CA bundle podman builds trust (default /etc/ssl/certs/ca-certificates.crt)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STATE="${STATE:-$ROOT/.compose}"
KAFKA_VERSION="${KAFKA_VERSION:-$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$ROOT/ops/kafka/pom.xml")}"
OFFLINE_PYTHON_IMAGE="localhost/streamstate-python:3.11-bookworm"
OFFLINE_KAFKA_IMAGE="localhost/streamstate-kafka"
WORKER_IMAGE="streamstate-worker:local"
BATCH_IMAGE="streamstate-batch:local"
export COMPOSE_PROJECT_NAME="${COMPOSE_PROJECT_NAME:-streamstate}"
export KAFKA_VERSION
HOST_CA_BUNDLE="${HOST_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
PODMAN_PACKAGES=(podman runc iptables netavark aardvark-dns catatonit debootstrap docker-compose)

log() { echo "cluster: $*" >&2; }
die() {
  log "$*"
  exit 1
}

# --- the engine ------------------------------------------------------------------------

choose_engine() {
  if [ -n "${CONTAINER_ENGINE:-}" ]; then
    echo "$CONTAINER_ENGINE"
  elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    echo docker
  else
    echo podman
  fi
}

ENGINE="$(choose_engine)"
SOCKET="$STATE/podman.sock"

install_podman() {
  local missing=() package
  for package in "${PODMAN_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'ok installed' ||
      missing+=("$package")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    die "podman needs Debian's ${missing[*]}: apt-get install ${missing[*]} (as root)"
  fi
  log "installing Debian's ${missing[*]}"
  local out
  out="$(mktemp)"
  if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "${missing[@]}"; } >"$out" 2>&1; then
    tail -n 20 "$out" >&2
    rm -f "$out"
    die "apt-get could not install ${missing[*]}"
  fi
  rm -f "$out"
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# podman's Docker API on $SOCKET, for docker-compose; started once, stopped by `down`.
start_podman_service() {
  alive "$STATE/podman-service.pid" && return 0
  SERVICE_STARTED=1
  rm -f "$SOCKET"
  podman system service --time=0 "unix://$SOCKET" >"$STATE/podman-service.log" 2>&1 &
  echo $! >"$STATE/podman-service.pid"
  for _ in $(seq 1 100); do
    podman --url "unix://$SOCKET" version >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  tail -n 20 "$STATE/podman-service.log" >&2
  die "podman system service did not answer on $SOCKET"
}

# A Go duration as podman prints it (1m30s, 10s, 500ms) in whole seconds, at least 1.
duration_seconds() {
  local rest=$1 total=0 amount unit
  while [[ $rest =~ ^([0-9]+)(\.[0-9]+)?(h|ms|m|s|us|µs|ns)(.*)$ ]]; do
    amount=${BASH_REMATCH[1]}
    unit=${BASH_REMATCH[3]}
    rest=${BASH_REMATCH[4]}
    case "$unit" in
      h) total=$((total + amount * 3600)) ;;
      m) total=$((total + amount * 60)) ;;
      s) total=$((total + amount)) ;;
    esac
  done
  echo $((total > 0 ? total : 1))
}

# podman schedules health checks with systemd timers; without systemd nothing runs them and
# a service that waits for a healthy one never starts. This loop runs them instead: every 2 s
# within a container's start period (where a failure does not count, and a success makes
# it healthy), then at the interval its health check names, so that its retries span as
# long as under Docker; never two at once for one container (a slow check must not pile
# up JVMs on a busy machine).
health_loop() {
  declare -A last=() running=()
  local now id state interval start_period started
  while true; do
    now="$(date +%s)"
    while read -r id state interval start_period started; do
      interval="$(duration_seconds "$interval")"
      if [ "$state" = starting ] && [ $((now - started)) -lt "$(duration_seconds "$start_period")" ]; then
        interval=2
      fi
      if [ -n "${running[$id]:-}" ] && kill -0 "${running[$id]}" 2>/dev/null; then
        continue
      fi
      if [ $((now - ${last[$id]:-0})) -ge "$interval" ]; then
        last[$id]=$now
        timeout 120 podman healthcheck run "$id" >/dev/null 2>&1 &
        running[$id]=$!
      fi
    done < <(podman ps --filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME" \
      --format '{{.ID}}' | xargs -r podman inspect --format \
      '{{.ID}} {{if .State.Health}}{{.State.Health.Status}}{{end}} {{if .Config.Healthcheck}}{{.Config.Healthcheck.Interval}} {{.Config.Healthcheck.StartPeriod}}{{end}} {{.State.StartedAt.Unix}}' \
      2>/dev/null | awk 'NF == 5' || true)
    sleep 1
  done
}

start_health_loop() {
  [ -d /run/systemd/system ] && return 0
  alive "$STATE/health-loop.pid" && return 0
  health_loop >/dev/null 2>&1 &
  echo $! >"$STATE/health-loop.pid"
}

stop_pid() {
  local pidfile=$1
  if alive "$pidfile"; then
    kill "$(cat "$pidfile")" 2>/dev/null || true
    for _ in $(seq 1 50); do
      kill -0 "$(cat "$pidfile")" 2>/dev/null || break
      sleep 0.1
    done
  fi
  rm -f "$pidfile"
}

engine_up() {
  mkdir -p "$STATE"
  if [ "$ENGINE" = podman ]; then
    install_podman
    export CONTAINERS_CONF="${CONTAINERS_CONF:-$ROOT/ops/docker/containers.conf}"
    start_podman_service
    start_health_loop
    export DOCKER_HOST="unix://$SOCKET"
  fi
}

engine_down() {
  [ "$ENGINE" = podman ] || return 0
  stop_pid "$STATE/health-loop.pid"
  stop_pid "$STATE/podman-service.pid"
  rm -f "$SOCKET"
}

# docker-compose v1 where Docker's compose plugin is absent: it drives podman's API too.
compose_cmd() {
  if [ "$ENGINE" = docker ] && docker compose version >/dev/null 2>&1; then
    echo "docker compose"
  elif command -v docker-compose >/dev/null 2>&1; then
    echo docker-compose
  else
    die "no compose CLI: install Docker's compose plugin or Debian's docker-compose"
  fi
}

compose() {
  # shellcheck disable=SC2046
  $(compose_cmd) --project-directory "$ROOT" -f "$ROOT/docker-compose.yml" "$@"
}

# --- images ----------------------------------------------------------------------------

image_present() { "$ENGINE" image inspect "$1" >/dev/null 2>&1; }

# Whether an image is here or can be pulled (a registry out of reach fails at once).
image_available() {
  image_present "$1" && return 0
  log "pulling $1"
  timeout 600 "$ENGINE" pull -q "$1" >/dev/null 2>&1
}

# The Debian mirror apt uses: a deb822 URIs line or a one-line `deb` source.
debian_mirror() {
  [ -n "${DEBIAN_MIRROR:-}" ] && {
    echo "$DEBIAN_MIRROR"
    return
  }
  local uri
  uri="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
    awk '/^URIs:/ && !/security/ {print $2; exit} /^deb / && !/security/ {print ($2 ~ /^\[/ ? $3 : $2); exit}')"
  echo "${uri:-http://deb.debian.org/debian}"
}

# Debian bookworm with Python 3.11, made by debootstrap and imported as an image.
build_python_base() {
  command -v debootstrap >/dev/null 2>&1 || die "debootstrap is missing: apt-get install debootstrap"
  local mirror rootfs security
  mirror="$(debian_mirror)"
  security="${mirror%/debian}/debian-security"
  rootfs="$STATE/rootfs"
  rm -rf "$rootfs"
  log "making $OFFLINE_PYTHON_IMAGE with debootstrap from $mirror"
  debootstrap --variant=minbase --include=python3.11,python3-venv,python3-pip,ca-certificates \
    bookworm "$rootfs" "$mirror" >"$STATE/debootstrap.log" 2>&1 || {
    tail -n 20 "$STATE/debootstrap.log" >&2
    die "debootstrap failed"
  }
  printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s bookworm-security main\n' \
    "$mirror" "$mirror" "$security" >"$rootfs/etc/apt/sources.list"
  # What an image need not carry: the downloaded packages, apt's lists, docs and locales.
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
  ln -sf python3.11 "$rootfs/usr/bin/python"
  tar --numeric-owner -C "$rootfs" -c . |
    "$ENGINE" import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - \
      "$OFFLINE_PYTHON_IMAGE" >/dev/null
  rm -rf "$rootfs"
}

resolve_python_image() {
  if [ -n "${PYTHON_IMAGE:-}" ]; then
    image_available "$PYTHON_IMAGE" || [ "$PYTHON_IMAGE" = "$OFFLINE_PYTHON_IMAGE" ] ||
      die "PYTHON_IMAGE=$PYTHON_IMAGE can be neither found nor pulled"
  elif image_available python:3.11-slim-bookworm; then
    PYTHON_IMAGE=python:3.11-slim-bookworm
  else
    log "python:3.11-slim-bookworm cannot be pulled: using $OFFLINE_PYTHON_IMAGE"
    PYTHON_IMAGE="$OFFLINE_PYTHON_IMAGE"
  fi
  if [ "$PYTHON_IMAGE" = "$OFFLINE_PYTHON_IMAGE" ] && ! image_present "$PYTHON_IMAGE"; then
    build_python_base
  fi
  export PYTHON_IMAGE
}

# The Java trust store of this machine (Maven resolves the Kafka jars with it here).
java_truststore() {
  local java
  if [ -f /etc/ssl/certs/java/cacerts ]; then
    echo /etc/ssl/certs/java/cacerts
  elif java="$(command -v java)" &&
    [ -f "$(dirname "$(readlink -f "$java")")/../lib/security/cacerts" ]; then
    readlink -f "$(dirname "$(readlink -f "$java")")/../lib/security/cacerts"
  fi
}

# Options every build of ours takes: under podman the host's CA bundle in place of the
# image's and the host's Java trust store for Maven (PyPI and Maven Central may sit behind
# a proxy that only the host trusts; the bundle file alone, since Debian's JRE writes its
# keystore beside it) and the Docker image format, which keeps HEALTHCHECK; pip's index
# when this machine configures one.
build_options() {
  BUILD=(--build-arg "PYTHON_IMAGE=$PYTHON_IMAGE")
  if [ "$ENGINE" = podman ]; then
    BUILD+=(--format docker)
    [ -f "$HOST_CA_BUNDLE" ] && BUILD+=(-v "$HOST_CA_BUNDLE:/etc/ssl/certs/ca-certificates.crt:ro")
    local truststore
    truststore="$(java_truststore)"
    if [ -n "$truststore" ]; then
      BUILD+=(-v "$truststore:/run/host-java-cacerts:ro")
      BUILD+=(--build-arg "MAVEN_OPTS=-Djavax.net.ssl.trustStore=/run/host-java-cacerts")
    fi
  fi
  local index="${PIP_INDEX_URL:-}"
  if [ -z "$index" ] && command -v pip3 >/dev/null 2>&1; then
    index="$(pip3 config get global.index-url 2>/dev/null || true)"
  fi
  [ -n "$index" ] && BUILD+=(--build-arg "PIP_INDEX_URL=$index")
  return 0
}

# Kafka from the jars of `make kafka-up` and kafka-tools, on the Python base's Debian.
build_kafka_image() {
  local image=$1 jars tools context
  "$ROOT/ops/kafka.sh" jars
  jars="${KAFKA_JAR_CACHE:-$ROOT/.cache/kafka-$KAFKA_VERSION}"
  tools="$ROOT/.cache/kafka-tools-$KAFKA_VERSION"
  if [ ! -f "$tools/.complete" ]; then
    rm -rf "$tools"
    mvn -q -B -Dstyle.color=never -f "$ROOT/ops/docker/kafka/pom.xml" \
      dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tools" \
      -Dkafka.version="$KAFKA_VERSION"
    touch "$tools/.complete"
  fi
  context="$STATE/kafka-image"
  rm -rf "$context"
  mkdir -p "$context/libs"
  cp -l "$jars"/*.jar "$tools"/*.jar "$context/libs/" 2>/dev/null ||
    cp "$jars"/*.jar "$tools"/*.jar "$context/libs/"
  cp "$ROOT"/ops/docker/kafka/{Dockerfile,log4j2.properties,kafka-run.sh,kafka-broker-api-versions.sh} \
    "$context/"
  log "building $image"
  "$ENGINE" build -q "${BUILD[@]}" --build-arg "BASE_IMAGE=$PYTHON_IMAGE" -t "$image" \
    "$context" >/dev/null
  rm -rf "$context"
}

resolve_kafka_image() {
  local default=apache/kafka
  if [ -z "${KAFKA_IMAGE:-}" ]; then
    if image_available "$default:$KAFKA_VERSION"; then
      KAFKA_IMAGE=$default
    else
      log "$default:$KAFKA_VERSION cannot be pulled: using $OFFLINE_KAFKA_IMAGE:$KAFKA_VERSION"
      KAFKA_IMAGE="$OFFLINE_KAFKA_IMAGE"
    fi
  fi
  if [ "$KAFKA_IMAGE" = "$OFFLINE_KAFKA_IMAGE" ]; then
    build_kafka_image "$KAFKA_IMAGE:$KAFKA_VERSION"
  elif ! image_available "$KAFKA_IMAGE:$KAFKA_VERSION"; then
    die "KAFKA_IMAGE=$KAFKA_IMAGE:$KAFKA_VERSION can be neither found nor pulled"
  fi
  export KAFKA_IMAGE
}

build_project_image() {
  local target=$1 image=$2 started
  started="$(date +%s)"
  "$ENGINE" build -q "${BUILD[@]}" --target "$target" -t "$image" "$ROOT" >/dev/null
  log "built $image in $(($(date +%s) - started)) s"
}

images() {
  resolve_python_image
  build_options
  resolve_kafka_image
  build_project_image worker "$WORKER_IMAGE"
  build_project_image batch "$BATCH_IMAGE"
  log "images: python $PYTHON_IMAGE, kafka $KAFKA_IMAGE:$KAFKA_VERSION, $WORKER_IMAGE, $BATCH_IMAGE"
  printf 'PYTHON_IMAGE=%q\nKAFKA_IMAGE=%q\n' "$PYTHON_IMAGE" "$KAFKA_IMAGE" >"$STATE/images.env"
}

# The base images the last `images` chose, for compose commands that create containers.
load_images() {
  if [ -f "$STATE/images.env" ]; then
    # shellcheck disable=SC1091
    . "$STATE/images.env"
    export PYTHON_IMAGE KAFKA_IMAGE
  fi
}

# --- the cluster -------------------------------------------------------------------------

print_env() {
  echo "export CONTAINER_ENGINE=$ENGINE COMPOSE_PROJECT_NAME=$COMPOSE_PROJECT_NAME"
  echo "export KAFKA_IMAGE=${KAFKA_IMAGE:-} KAFKA_VERSION=$KAFKA_VERSION PYTHON_IMAGE=${PYTHON_IMAGE:-}"
  [ "$ENGINE" = podman ] && echo "export DOCKER_HOST=$DOCKER_HOST CONTAINERS_CONF=$CONTAINERS_CONF"
  echo "export STREAMSTATE_COMPOSE='$(compose_cmd)'"
}

up() {
  engine_up
  images
  compose up -d --no-build
}

down() {
  engine_up
  load_images
  local status=0
  compose down -v --remove-orphans || status=$?
  engine_down
  return "$status"
}

run_tests() {
  engine_up
  trap 'down' EXIT
  images
  eval "$(print_env)"
  local python="$ROOT/.venv/bin/python"
  [ -x "$python" ] || python=python3
  "$python" -m pytest -m compose -p no:cacheprovider "$ROOT/tests/compose" "$@"
}

case "${1:-}" in
  # The engine's service stays up only if it was (for a cluster that `up` started).
  images)
    engine_up
    trap 'if [ -n "${SERVICE_STARTED:-}" ]; then engine_down; fi' EXIT
    images
    ;;
  up) up ;;
  down) down ;;
  test) shift && run_tests "$@" ;;
  env) engine_up && load_images && print_env ;;
  compose) shift && engine_up && load_images && compose "$@" ;;
  *)
    echo "usage: $0 images|up|down|test|env|compose ARGS..." >&2
    exit 2
    ;;
esac
