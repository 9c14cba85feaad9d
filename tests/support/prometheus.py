"""A real Prometheus server that scrapes test processes, and PromQL over its HTTP API."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.ports import free_port
from tests.support.processes import service


def prometheus_binary() -> str:
    """Path of ``prometheus``; skips the test locally when it is missing, fails under CI."""
    binary = shutil.which("prometheus") or (
        "/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK) else None
    )
    if binary is None:
        message = "the prometheus server is not installed (apt-get install prometheus)"
        if os.environ.get("CI"):
            pytest.fail(message + "; CI must provide it")
        pytest.skip(message)
    return binary


def scrape_config(jobs: Mapping[str, Sequence[str]], interval_s: float) -> str:
    """prometheus.yml text: one static job per entry, targets given as base URLs."""
    interval = f"{round(interval_s * 1000)}ms"  # Prometheus durations are integers
    lines = [
        "global:",
        f"  scrape_interval: {interval}",
        f"  scrape_timeout: {interval}",
        "scrape_configs:",
    ]
    for job, urls in jobs.items():
        targets = ", ".join(f'"{urlsplit(u).netloc}"' for u in urls)
        lines += [
            f"  - job_name: {job}",
            "    metrics_path: /metrics",
            f"    static_configs: [{{targets: [{targets}]}}]",
        ]
    return "\n".join(lines) + "\n"


@dataclass
class Prometheus:
    url: str

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's result vector: ``[{"metric": {...}, "value": [ts, "v"]}]``."""
        reply = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        reply.raise_for_status()
        body = reply.json()
        assert body["status"] == "success", body
        assert body["data"]["resultType"] == "vector", body
        return body["data"]["result"]  # type: ignore[no-any-return]

    def by_label(self, promql: str, label: str) -> dict[str, float]:
        return {r["metric"].get(label, ""): float(r["value"][1]) for r in self.query(promql)}

    def wait_for_scrape_after(self, job: str, moment: float, timeout: float = 60) -> None:
        """Block until every target of ``job`` was scraped (successfully) after ``moment``
        (a ``time.time()`` value), so instant queries see everything done before it."""
        deadline = time.monotonic() + timeout
        while True:
            # ``timestamp`` of a plain selector is the scrape's start time (of an expression
            # such as ``up == 1`` it would be the evaluation time, which proves nothing).
            samples = self.query(f'timestamp(up{{job="{job}"}})')
            up = self.by_label(f'up{{job="{job}"}}', "instance")
            if (
                samples
                and all(float(s["value"][1]) > moment for s in samples)
                and all(v == 1 for v in up.values())
            ):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"no scrape of job {job} after {moment}: {samples}")
            time.sleep(0.25)


@contextlib.contextmanager
def running_prometheus(
    root: Path, jobs: Mapping[str, Sequence[str]], interval_s: float = 1.0, timeout: float = 60
) -> Iterator[Prometheus]:
    """Start ``prometheus`` on a free loopback port scraping ``jobs``; stop it afterwards."""
    binary = prometheus_binary()
    root.mkdir(parents=True, exist_ok=True)
    config = root / "prometheus.yml"
    config.write_text(scrape_config(jobs, interval_s))
    port = free_port()
    process = service(
        "prometheus",
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={root / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        root,
        url=f"http://127.0.0.1:{port}",
    ).start()
    try:
        process.wait_http("/-/ready", timeout)
        yield Prometheus(process.url)
    finally:
        process.stop()
