"""docker-compose.yaml is safe by default, checked by the real `docker-compose config`.

No Docker engine is needed: `config` parses, interpolates and validates the file
offline. A copy runs in a temporary folder so a developer's own ``.env`` never
takes part, and the environment is scrubbed of the variables the file requires.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / ".env.example"
REQUIRED = re.findall(r"^([A-Z][A-Z0-9_]*)=$", EXAMPLE.read_text(), flags=re.MULTILINE)
TRITON_PORTS = {"8000", "8001", "8002"}
TOPOLOGY = REPO / "topologies" / "audio.yaml"


def _project(tmp_path: Path, env_file: str | None) -> Path:
    """A copy of the compose file and what its `build:` entries point at, with this ``.env``."""
    for name in ("docker-compose.yaml", "Dockerfile", ".env.example"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "docker", tmp_path / "docker")
    if env_file is not None:
        (tmp_path / ".env").write_text(env_file)
    return tmp_path


def _compose(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    docker_compose = shutil.which("docker-compose")
    assert docker_compose, "docker-compose is not installed (scripts/install.sh installs it)"
    env = {k: v for k, v in os.environ.items() if k not in REQUIRED and not k.startswith("COMPOSE_")}
    return subprocess.run(
        [docker_compose, "-f", "docker-compose.yaml", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _filled(skip: str | None = None) -> str:
    """A ``.env`` with a fresh random value for every required variable but ``skip``."""
    return "".join(f"{name}={secrets.token_hex(12)}\n" for name in REQUIRED if name != skip)


def test_env_example_names_every_variable_and_holds_no_value() -> None:
    assert len(REQUIRED) == 9, REQUIRED
    compose = (REPO / "docker-compose.yaml").read_text()
    used = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)", compose))
    assert used == set(REQUIRED)
    # The one value given: which Triton profile runs. Not a secret.
    assert re.findall(r"^[A-Z][A-Z0-9_]*=.+$", EXAMPLE.read_text(), flags=re.MULTILINE) == ["COMPOSE_PROFILES=cpu"]
    assert ":-" not in compose, "a default value would be a secret in the file"


def test_config_passes_with_a_filled_env(tmp_path: Path) -> None:
    result = _compose(_project(tmp_path, _filled()), "config", "-q")
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""


def test_config_fails_without_env_naming_the_variable(tmp_path: Path) -> None:
    result = _compose(_project(tmp_path, None), "config", "-q")
    assert result.returncode != 0
    assert "MINIO_ROOT_USER is not set; copy .env.example to .env and fill it in" in result.stderr


def test_env_copied_from_the_example_unfilled_fails_too(tmp_path: Path) -> None:
    result = _compose(_project(tmp_path, EXAMPLE.read_text()), "config", "-q")
    assert result.returncode != 0
    assert "is not set; copy .env.example to .env and fill it in" in result.stderr


@pytest.mark.parametrize("missing", REQUIRED)
def test_each_missing_variable_is_named(tmp_path: Path, missing: str) -> None:
    result = _compose(_project(tmp_path, _filled(skip=missing)), "config", "-q")
    assert result.returncode != 0
    assert f"{missing} is not set" in result.stderr


def _resolved(tmp_path: Path, env_file: str) -> dict[str, Any]:
    """The file as docker-compose resolves it with this ``.env``."""
    result = _compose(_project(tmp_path, env_file), "config")
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = yaml.safe_load(result.stdout)
    return config


def test_ports_bind_loopback_and_triton_is_internal_only(tmp_path: Path) -> None:
    config = _resolved(tmp_path, _filled())
    services: dict[str, dict[str, Any]] = config["services"]
    published = {name: [str(p) for p in s.get("ports", [])] for name, s in services.items()}
    assert published["kafka"] == ["127.0.0.1:9092:9092/tcp"]
    assert sorted(published["minio"]) == ["127.0.0.1:9000:9000/tcp", "127.0.0.1:9001:9001/tcp"]
    for name, ports in published.items():
        for port in ports:
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"

    triton = services["triton"]
    assert "ports" not in triton and "expose" not in triton
    assert not TRITON_PORTS & {p.split(":")[-2] for ports in published.values() for p in ports}
    assert "--model-control-mode=explicit" in triton["command"]
    assert config["networks"]["backend"]["internal"] is True
    assert set(triton["networks"]) == {"backend"}
    # Whoever reaches Triton shares the internal network with it: only the stack's own services.
    on_backend = sorted(n for n, s in services.items() if "backend" in s.get("networks", {}))
    stack = ["jaeger", "kafka", "minio", "minio-init", "models-push", "prometheus"]
    assert on_backend == sorted([*stack, *_stage_services(), "triton", "triton-gpu"])
    assert "backend" not in services["grafana"]["networks"], "Grafana reaches Prometheus only"


def test_each_identity_gets_its_own_keys(tmp_path: Path) -> None:
    """Triton, the publisher and the workers hold different keys; none holds MinIO's root."""
    env_file = _filled()
    values = dict(line.split("=", 1) for line in env_file.splitlines())
    services = _resolved(tmp_path, env_file)["services"]

    def key_of(service: str) -> str:
        return str(services[service]["environment"]["AWS_ACCESS_KEY_ID"])

    assert key_of("triton") == values["TRITON_S3_ACCESS_KEY"]
    assert key_of("models-push") == values["MODEL_PUBLISHER_ACCESS_KEY"]
    for stage in _stage_services():
        assert key_of(stage) == values["WORKER_S3_ACCESS_KEY"]
    root = {values["MINIO_ROOT_USER"], values["MINIO_ROOT_PASSWORD"]}
    for name, service in services.items():
        if name not in ("minio", "minio-init"):
            assert not root & {str(v) for v in service.get("environment", {}).values()}, name


def _stage_services() -> list[str]:
    stages = yaml.safe_load(TOPOLOGY.read_text())["stages"]
    return [f"stage-{stage['name']}" for stage in stages]


def test_one_service_runs_each_stage_of_the_topology(tmp_path: Path) -> None:
    """The compose stack runs topologies/audio.yaml for real: a `pipeline run --stage` per stage,
    each with health and metrics where Prometheus scrapes them and traces going to Jaeger."""
    services = _resolved(tmp_path, _filled())["services"]
    for name in _stage_services():
        service = services[name]
        assert service["command"] == ["run", "topologies/audio.yaml", "--stage", name.removeprefix("stage-")]
        env = service["environment"]
        assert env["PIPELINE_HTTP_PORT"] == "9400" and env["PIPELINE_HEALTH_HOST"] == "0.0.0.0"
        assert env["OTEL_TRACES_EXPORTER"] == "otlp" and env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4317"
        assert env["PIPELINE_KAFKA_BOOTSTRAP_SERVERS"] == "kafka:19092" and "9400/readyz" in str(service["healthcheck"])
    scrape = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yaml").read_text())
    targets = {t for job in scrape["scrape_configs"] for group in job["static_configs"] for t in group["targets"]}
    assert {f"{name}:9400" for name in _stage_services()} | {"triton:8002"} <= targets


def test_triton_has_a_cpu_and_a_gpu_profile_answering_as_triton(tmp_path: Path) -> None:
    services = _resolved(tmp_path, _filled())["services"]
    cpu, gpu = services["triton"], services["triton-gpu"]
    assert cpu["profiles"] == ["cpu"] and gpu["profiles"] == ["gpu"]
    assert cpu["command"] == gpu["command"]
    for triton in (cpu, gpu):
        assert triton["networks"]["backend"]["aliases"] == ["triton"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert "deploy" not in cpu


def test_observability_files_it_mounts_exist(tmp_path: Path) -> None:
    services = _resolved(tmp_path, _filled())["services"]
    for name in ("prometheus", "grafana"):
        for volume in services[name]["volumes"]:
            source = str(volume["source"] if isinstance(volume, dict) else volume.split(":")[0])
            relative = Path(source).relative_to(tmp_path)
            assert (REPO / relative).is_dir(), f"{name} mounts {relative}, which the repository lacks"
