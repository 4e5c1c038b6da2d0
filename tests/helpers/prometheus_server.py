"""A real Prometheus server (Debian package ``prometheus``) scraping test targets.

Started with a generated configuration (one job per entry of ``jobs``, scraped
every second), its storage in a temporary folder and its web API on a free
loopback port; read back through the HTTP API (``/api/v1/query``), exactly as
Grafana and alerting read it. A missing binary fails loudly: nothing is skipped.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline.embedded.process import free_port

Series = list[dict[str, Any]]
"""``data.result`` of an instant query: ``[{"metric": {labels}, "value": [time, "text"]}, ...]``."""


@dataclass
class PrometheusServer:
    url: str
    log_path: Path

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> Series:
        """An instant query; raises on a query Prometheus rejects (a typo in a panel, say)."""
        data = self.api("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", f"{expr}: {data['resultType']}"
        result: Series = data["result"]
        return result

    def wait_for(self, expr: str, timeout: float = 30.0, until: Callable[[Series], bool] = bool) -> Series:
        """Query ``expr`` until ``until(result)`` (by default: any series at all)."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if until(result) or time.monotonic() > deadline:
                return result
            time.sleep(0.5)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


def values(result: Series) -> list[float]:
    return [float(series["value"][1]) for series in result]


def _config(jobs: Mapping[str, Sequence[str]], rule_files: Sequence[Path]) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": list(targets)}]} for job, targets in jobs.items()
        ],
    }


@contextlib.contextmanager
def prometheus_server(
    folder: Path, jobs: Mapping[str, Sequence[str]], rule_files: Sequence[Path] = ()
) -> Iterator[PrometheusServer]:
    """Prometheus scraping ``jobs`` (job name -> ``host:port`` targets) every second."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus not found: install the Debian package 'prometheus' (scripts/install.sh --test)"
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "prometheus.yaml"
    config.write_text(yaml.safe_dump(_config(jobs, rule_files), sort_keys=False))
    port = free_port()
    log_path = folder / "prometheus.log"
    argv = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=1h",
    ]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    server = PrometheusServer(f"http://127.0.0.1:{port}", log_path)
    try:
        _wait_ready(server, proc)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _wait_ready(server: PrometheusServer, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"prometheus exited with {proc.returncode}:\n{server.log()}")
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as response:
            if response.status == 200:
                return
        time.sleep(0.2)
    raise AssertionError(f"prometheus not ready after {timeout}s:\n{server.log()}")
