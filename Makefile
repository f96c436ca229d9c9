# streamstate: the commands of ../shared/CONTRACT.md. Every Python target uses .venv/
# and creates it when missing; `make test` sets up everything from nothing.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
KAFKA_PORT ?= 9092
KAFKA_BROKERS ?= 1
export KAFKA_PORT KAFKA_BROKERS

.PHONY: install bytecode run test test-unit test-integration test-batch lint kafka-up kafka-down \
        kafka-jars spark-jars executor-env nightly bench chaos clean tools kstreams-test screenshots \
        compose-test

install: $(STAMP)

# The project's own modules compiled to bytecode (only what changed since). The machine may
# forbid Python to write bytecode (PYTHONDONTWRITEBYTECODE, as in the Dockerfile, whose
# wheel install compiles them instead); a worker would then compile every module of the
# project at each start, and of the libraries too, which the install leaves uncompiled.
bytecode: install
	$(PY) -m compileall -q -j 0 core app agents streams tables api jobs ops bench chaos tests
	$(if $(PYTHONDONTWRITEBYTECODE),$(PY) -m compileall -q -j 0 $$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))') >/dev/null)

# The libraries are installed without compiling their bytecode (--no-compile), which pip
# does one file at a time: `make bytecode` compiles them on every core when the machine
# forbids Python to write bytecode; otherwise Python writes it for what a process imports.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -e '.[dev,batch]'
	touch $(STAMP)

kafka-jars:
	ops/kafka.sh jars

# Spark's Kafka source for the batch job (jobs/pom.xml), resolved once into .cache/.
spark-jars: install
	$(PY) -m jobs.session

# The Python environment the batch job ships to a cluster's executors, packed once into
# .cache/executor-env/ (docs/operations.md); the job packs it on first use otherwise.
executor-env: install
	$(PY) -m jobs.pyenv

kafka-up:
	ops/kafka.sh up

kafka-down:
	ops/kafka.sh down

run: bytecode kafka-up
	ops/run.sh

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/hadolint --failure-threshold info Dockerfile ops/docker/kafka/Dockerfile

tools:
	ops/docker/tools.sh

# make test runs the test modules in TEST_PROCESSES processes (pytest-xdist), a module
# with its fixtures (brokers, workers, Spark) in one process; each process takes its own
# ports (tests/support/kafka.py), the slowest modules first (tests/conftest.py). The tests
# marked `alone` (faults timed under load) run after the rest, with the machine to themselves.
# The setup runs two steps at a time (the install beside the Kafka jars, the bytecode beside
# the Spark jars), then the lint beside the Kafka Streams baseline's tests (mvn may be absent:
# then the baseline's tests are skipped, with a line that says so).
TEST_PROCESSES ?= 2
CHECKS = lint $(if $(shell command -v mvn 2>/dev/null),kstreams-test)
test:
	$(MAKE) --output-sync=target -j2 install kafka-jars tools
	$(MAKE) --output-sync=target -j2 bytecode spark-jars
	$(if $(filter kstreams-test,$(CHECKS)),,@echo "mvn not on PATH: the Kafka Streams baseline's tests are skipped")
	$(MAKE) --output-sync=target -j2 $(CHECKS)
	$(VENV)/bin/pytest -n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder -m "not alone and not compose" \
	    --durations=20
	$(VENV)/bin/pytest -m alone --durations=10

# The compose cluster built and run on this machine's container engine (Docker when one
# answers, else podman, set up by ops/docker/cluster.sh), checked through its published
# ports by tests/compose, then taken down. Its own ports, so that it can run beside
# `make run` and the tests: Kafka on COMPOSE_KAFKA_PORT, the workers on COMPOSE_WORKER_PORT
# and the next two, all on 127.0.0.1.
COMPOSE_PROJECT ?= streamstate-compose-test
COMPOSE_KAFKA_PORT ?= 15092
COMPOSE_WORKER_PORT ?= 15066
compose-test: install
	COMPOSE_PROJECT_NAME=$(COMPOSE_PROJECT) KAFKA_HOST_PORT=$(COMPOSE_KAFKA_PORT) \
	WORKER_1_PORT=$(COMPOSE_WORKER_PORT) WORKER_2_PORT=$$(($(COMPOSE_WORKER_PORT) + 1)) \
	WORKER_3_PORT=$$(($(COMPOSE_WORKER_PORT) + 2)) ops/docker/cluster.sh test

# The Kafka Streams baseline of the benchmarks (bench/baselines/kstreams/): its topologies'
# TopologyTestDriver tests, against kafka-streams of the broker's version.
KAFKA_VERSION = $(shell sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' ops/kafka/pom.xml)
kstreams-test:
	mvn -B -ntp -Dstyle.color=never -f bench/baselines/kstreams/pom.xml \
	    -Dkafka.version=$(KAFKA_VERSION) test

test-unit: install
	$(VENV)/bin/pytest tests/unit

test-integration: install kafka-jars
	$(VENV)/bin/pytest -m integration

test-batch: install kafka-jars spark-jars
	$(VENV)/bin/pytest -m batch

# docs/console-*.png: each view of the console (/ui) as the browser test sees it, against
# two workers on a broker of its own with the demo generator running.
screenshots: install kafka-jars tools
	STREAMSTATE_SCREENSHOTS=$(CURDIR)/docs $(VENV)/bin/pytest -m "not alone" \
	    tests/integration/test_console.py

nightly: bytecode kafka-up spark-jars
	$(PY) -m ops.nightly --once

bench: bytecode
	$(PY) -m bench $(BENCH_ARGS)

chaos: bytecode kafka-jars spark-jars
	$(PY) -m chaos $(CHAOS_ARGS)

clean:
	rm -rf .data .pytest_cache .mypy_cache .ruff_cache
