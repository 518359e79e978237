"""A real Prometheus (Debian's `prometheus` package, `make test-deps`) scraping a vllm-use, and
`promtool check metrics` (docs/observability.md, "Metrics"), and `read_metrics`: vllm-use's own
`GET /metrics`, parsed.

`scraping(tmp, target, key)` starts `/usr/bin/prometheus` on a free loopback port with a temporary
TSDB and a one-job config that sends `key` as Prometheus's `authorization: {credentials: …}` every
second, and stops it afterwards. `Prometheus.value(query)` asks its HTTP API (`/api/v1/query`).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.server import Client, eventually, free_port

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
READY_TIMEOUT_S = 60.0  # it is ready within a few seconds; the bound only ends a hang
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def read_metrics(server: Client, key: str | None) -> Samples:
    """`GET /metrics` with `key`, parsed: (sample name, sorted labels) → value."""
    r = server.fetch("/metrics", token=key)
    assert r.status_code == 200, r.text
    found: Samples = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value; 0 when it is absent (a counter that never moved)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def promtool_check(exposition: bytes) -> subprocess.CompletedProcess[str]:
    """`promtool check metrics` on an exposition fed on stdin (rc 0: no problem found)."""
    return subprocess.run(
        [PROMTOOL, "check", "metrics"], input=exposition.decode(), capture_output=True, text=True, timeout=60
    )


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def query(self, expr: str) -> list[dict]:
        r = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=10, trust_env=False)
        assert r.status_code == 200, r.text
        return r.json()["data"]["result"]

    def value(self, expr: str) -> float | None:
        """The one value `expr` evaluates to now, or None while it has no series."""
        result = self.query(expr)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None

    def target_health(self) -> list[dict]:
        r = httpx.get(self.url + "/api/v1/targets", timeout=10, trust_env=False)
        return r.json()["data"]["activeTargets"]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _config(target: str, key: str) -> str:
    address = urlsplit(target).netloc
    return (
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        "  - job_name: vllm-use\n"
        "    metrics_path: /metrics\n"
        f"    authorization:\n      credentials: '{key}'\n"
        f"    static_configs:\n      - targets: ['{address}']\n"
    )


@contextlib.contextmanager
def scraping(tmp: Path, target: str, key: str) -> Iterator[Prometheus]:
    """A Prometheus scraping `target` (http://127.0.0.1:port) with `key`, ready, until the block ends."""
    tmp.mkdir(parents=True, exist_ok=True)
    config = tmp / "prometheus.yml"
    config.write_text(_config(target, key))
    config.chmod(0o600)
    port = free_port()
    log_path = tmp / "prometheus.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=tmp,
        )
    prometheus = Prometheus(f"http://127.0.0.1:{port}", proc, log_path)
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError("prometheus exited:\n" + prometheus.log())
            try:
                return httpx.get(prometheus.url + "/-/ready", timeout=2, trust_env=False).status_code == 200
            except httpx.TransportError:
                return False

        eventually(ready, timeout=READY_TIMEOUT_S, interval=0.1)
        yield prometheus
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
