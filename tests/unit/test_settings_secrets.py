"""Settings hold credentials as pydantic ``SecretStr``: no repr, dump or error shows them.

Endpoints are logged, printed in error messages and shown in test failures; the
only way out for a credential is :meth:`Endpoints.environment`, which hands it to
a child process (Triton, Tansu) that needs it.
"""

from __future__ import annotations

import secrets

import pytest
from pydantic import ValidationError

from pipeline.errors import ConfigError
from pipeline.modelstore.store import ModelStore
from pipeline.settings import Endpoints, KafkaSettings


@pytest.fixture
def canaries(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    values = {
        "AWS_ACCESS_KEY_ID": f"canary-access-{secrets.token_hex(6)}",
        "AWS_SECRET_ACCESS_KEY": f"canary-secret-{secrets.token_hex(6)}",
        "PIPELINE_KAFKA_SASL_PASSWORD": f"canary-sasl-{secrets.token_hex(6)}",
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PIPELINE_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9")
    monkeypatch.setenv("PIPELINE_S3_ENDPOINT", "http://127.0.0.1:9")
    return list(values.values())


def test_repr_and_dumps_hide_every_credential(canaries: list[str]) -> None:
    endpoints = Endpoints()
    shown = " ".join(
        [repr(endpoints), str(endpoints), endpoints.model_dump_json(), str(endpoints.model_dump()), f"{endpoints}"]
    )
    assert [c for c in canaries if c in shown] == []
    assert "**********" in shown
    # The one deliberate way out: the environment of a child process that needs the keys.
    assert set(canaries[:2]) <= set(endpoints.environment().values())
    assert endpoints.kafka.client_kwargs()["bootstrap_servers"] == "127.0.0.1:9"


def test_configuration_errors_name_settings_not_credentials(
    canaries: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIPELINE_S3_BUCKET", "xy")
    with pytest.raises(ConfigError) as bad_bucket:
        ModelStore(Endpoints().s3)
    assert "PIPELINE_S3_BUCKET=xy" in str(bad_bucket.value)
    monkeypatch.setenv("PIPELINE_KAFKA_SECURITY_PROTOCOL", "TLS-PLEASE")
    with pytest.raises(ValidationError) as invalid:
        KafkaSettings()
    assert "security_protocol" in str(invalid.value)
    errors = str(invalid.value) + str(bad_bucket.value)
    assert [c for c in canaries if c in errors] == []
