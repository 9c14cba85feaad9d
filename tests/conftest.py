"""Session-wide real backing services (a redis-server process and a moto S3 server) and the
test tiers.

Both servers run for the whole session on free loopback ports and are shared by every test
directory. Tests isolate themselves with their own Redis key namespace and bucket rather
than restarting the servers.

Tiers: :data:`TIERS` marks each test by what it starts (pyproject.toml lists the markers);
every tier's tests are also ``slow``. ``make test`` runs them all; ``make test-fast``
(``-m "not slow"``) is the edit loop. Each test also gets an ``xdist_group``: its module, or
its whole directory where the directory shares an expensive fixture (the engines, the e2e
stack), so ``pytest -n 2 --dist loadgroup`` starts each of those once.
"""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from preft_serve.common.local_redis import NOT_INSTALLED, running_redis
from tests.support.ports import free_port, wait_for_port

TESTS = Path(__file__).parent
# Test files (globs under tests/) -> what they start. Everything else is fast: in-process
# apps against the session's Redis and S3 server, helm-free units.
TIERS: dict[str, tuple[str, ...]] = {
    "engine/*": ("engine",),  # in-process vLLM engines (one set per session)
    "worker/test_step_trace_file.py": ("engine",),
    "worker/test_worker_gc.py": ("engine",),
    "loadtests/test_engine_bench.py": ("engine",),
    "e2e/*": ("stack",),  # vLLM servers, registry and gateway as processes
    "onebox/test_make_run.py": ("stack",),
    "onebox/test_make_run_real.py": ("stack", "real_model"),
    "e2e/test_real_model.py": ("stack", "real_model"),
    "onebox/test_cold_bench.py": ("stack",),
    "onebox/test_redis_persistence.py": ("stack",),
    "onebox/test_cli.py": ("stack",),
    "onebox/test_soak.py": ("stack", "soak"),
    "worker/test_resolver.py": ("stack",),
    "worker/test_launcher_observability.py": ("stack",),
    "gateway/test_e2e.py": ("stack",),
    "loadtests/test_gateway_ab.py": ("stack",),
    "finetune/*": ("trainer",),  # real trainer processes
    "training/test_trainer.py": ("trainer",),
    "chart/*": ("helm",),  # helm template, kubernetes schemas, promtool
    "fuzz/*": ("fuzz",),
    "loadtests/test_quality_bench.py": ("study",),
    "loadtests/test_rl_bench.py": ("study",),
}
# Directories whose tests share one expensive fixture: kept on one xdist worker together.
SHARED_FIXTURE_DIRS = ("engine", "e2e")


def tiers_of(relative: str) -> set[str]:
    return {tier for pattern, tiers in TIERS.items() if fnmatch.fnmatch(relative, pattern)
            for tier in tiers}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tier_names = {tier for tiers in TIERS.values() for tier in tiers}
    for item in items:
        relative = item.path.relative_to(TESTS).as_posix()
        for tier in sorted(tiers_of(relative)):
            item.add_marker(getattr(pytest.mark, tier))
        if any(m.name in tier_names for m in item.iter_markers()):
            item.add_marker(pytest.mark.slow)
        top = relative.split("/", 1)[0]
        group = top if top in SHARED_FIXTURE_DIRS else relative
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    """URL of a real redis-server (no persistence), killed at the end of the session."""
    if shutil.which("redis-server") is None:
        pytest.fail(NOT_INSTALLED)
    with running_redis() as url:
        yield url


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """Endpoint URL of a real S3-protocol HTTP server (moto), killed at session end.

    A separate process, like a real S3 endpoint: moto's server imports Flask, whose context
    proxies break vLLM's start-up scan of loaded modules if they share the test process.
    """
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )
    try:
        wait_for_port(port, proc, 30)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(10)
