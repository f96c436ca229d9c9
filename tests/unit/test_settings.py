"""Settings: faust's environment names, the STREAMSTATE_ prefix, and their checks."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from core.settings import Settings


def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("BROKER_URL", "FAUST_DATADIR", "F_DATADIR", "APP_DATADIR", "TOPIC_PARTITIONS"):
        monkeypatch.delenv(name, raising=False)


def test_faust_environment_names_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    clean_env(monkeypatch)
    monkeypatch.setenv("BROKER_URL", "kafka://10.0.0.5:9092")
    monkeypatch.setenv("TOPIC_PARTITIONS", "12")
    monkeypatch.setenv("PROCESSING_GUARANTEE", "exactly_once")
    monkeypatch.setenv("TABLE_STANDBY_REPLICAS", "2")
    settings = Settings()
    assert settings.broker_url == "kafka://10.0.0.5:9092"
    assert settings.topic_partitions == 12
    assert settings.processing_guarantee == "exactly_once"
    assert settings.exactly_once
    assert settings.table_standby_replicas == 2
    monkeypatch.setenv("PROCESSING_GUARANTEE", "at_least_once")
    assert not Settings().exactly_once


def test_streamstate_prefix_for_settings_faust_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    clean_env(monkeypatch)
    monkeypatch.setenv("STREAMSTATE_API_TOKEN", "s3cret")
    monkeypatch.setenv("STREAMSTATE_SOURCE_RETENTION_MS", "86400000")
    settings = Settings()
    assert settings.api_token == "s3cret"
    assert settings.source_retention_ms == 86_400_000


def test_bootstrap_servers_drop_the_kafka_scheme(monkeypatch: pytest.MonkeyPatch) -> None:
    clean_env(monkeypatch)
    monkeypatch.setenv("BROKER_URL", "kafka://127.0.0.1:9092;kafka://127.0.0.1:9094")
    assert Settings().bootstrap_servers == "127.0.0.1:9092,127.0.0.1:9094"
    monkeypatch.setenv("BROKER_URL", "127.0.0.1:9092")
    assert Settings().broker_url == "kafka://127.0.0.1:9092"


def test_the_datadir_of_faust_cli_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    clean_env(monkeypatch)
    monkeypatch.setenv("APP_DATADIR", "/var/lib/a")
    monkeypatch.setenv("FAUST_DATADIR", "/var/lib/b")
    assert str(Settings().datadir) == "/var/lib/b"


@pytest.mark.parametrize(
    ("name", "value"),
    [("PROCESSING_GUARANTEE", "twice"), ("TOPIC_PARTITIONS", "0"), ("WEB_PORT", "70000")],
)
def test_invalid_values_are_refused(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    clean_env(monkeypatch)
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError):
        Settings()
