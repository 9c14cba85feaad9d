"""Session-wide real backing services (a redis-server process and a moto S3 server) and the
test tiers.

Both servers run for the whole session on free loopback ports and are shared by every test
directory. Tests isolate themselves with their own Redis key namespace and bucket rather
than restarting the servers.

Tiers: :data:`TIERS` marks each test by what it starts (pyproject.toml lists the markers);
every tier's tests are also ``slow``. ``make test`` runs them all; ``make test-fast``
(``-m "not slow"``) is the edit loop. Under ``pytest -n N`` a test file is one unit of work,
and so is a whole directory that shares an expensive fixture (the engines, the e2e stack),
so each of those starts once (:func:`pytest_xdist_make_scheduler`).
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from preft_serve.common.local_redis import NOT_INSTALLED, running_redis
from tests.support.ports import free_port, wait_for_port

TESTS = Path(__file__).parent
# Two test processes share the cores, each starting vLLM engines, trainers and whole stacks:
# OpenMP's default active wait keeps idle threads spinning, so one process's spinning
# threads take the cores the other's (and its own I/O threads) are waiting for. Passive
# waiting, inherited by every process the suite starts, unless the caller chose otherwise.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
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
    "common/test_service_keepalive.py": ("stack",),
    "gateway/test_e2e.py": ("stack",),
    "disagg/*": ("stack",),  # a prefill and a decode worker with the registry and gateway
    "loadtests/test_gateway_ab.py": ("stack",),
    "loadtests/test_disagg_bench.py": ("stack",),
    "finetune/*": ("trainer",),  # real trainer processes
    "training/test_trainer.py": ("trainer",),
    "chart/*": ("helm",),  # helm template, kubernetes schemas, promtool
    "fuzz/*": ("fuzz",),
    "images/*": ("images",),  # make images, then the chart's containers run from them
    "loadtests/test_quality_bench.py": ("study",),
    "loadtests/test_rl_bench.py": ("study",),
}
# Directories whose tests share one expensive fixture: kept on one xdist worker together.
SHARED_FIXTURE_DIRS = ("engine", "e2e", "images")
# Files (globs) that take minutes, longest first: handed out before everything else, so
# none of them starts last and runs alone at the end of the suite. Then the other tiers'
# files, then the fast ones.
LONGEST = ("images/*", "onebox/test_make_run_real.py", "e2e/*", "onebox/test_soak.py",
           "loadtests/test_disagg_bench.py", "disagg/*")


def tiers_of(relative: str) -> set[str]:
    return {tier for pattern, tiers in TIERS.items() if fnmatch.fnmatch(relative, pattern)
            for tier in tiers}


_TIER_NAMES = {tier for tiers in TIERS.values() for tier in tiers}


def pytest_itemcollected(item: pytest.Item) -> None:
    """Tier markers, set while collecting: before ``-m`` deselects by them."""
    relative = item.path.relative_to(TESTS).as_posix()
    for tier in sorted(tiers_of(relative)):
        item.add_marker(getattr(pytest.mark, tier))
    if any(m.name in _TIER_NAMES for m in item.iter_markers()):
        item.add_marker(pytest.mark.slow)


def run_order(relative: str) -> int:
    """Where a test file's work is handed out: :data:`LONGEST` first, then the slow tiers,
    then the fast tests (a greedy longest-first schedule keeps both workers busy)."""
    for rank, pattern in enumerate(LONGEST):
        if fnmatch.fnmatch(relative, pattern):
            return rank
    return len(LONGEST) + (0 if tiers_of(relative) else 1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest work first; a stable sort keeps the order within each file."""
    items.sort(key=lambda item: run_order(item.path.relative_to(TESTS).as_posix()))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``pytest -n N``: a test file is one unit of work (its module fixtures start once),
    and so is each directory in :data:`SHARED_FIXTURE_DIRS` (its session or package
    fixtures, vLLM engines and servers, start on one worker only). Units are handed out
    in collection order (:func:`run_order`), not xdist's largest-test-count-first."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class SharedFixtureScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            parts = path.split("/")
            return parts[1] if len(parts) > 2 and parts[1] in SHARED_FIXTURE_DIRS else path

    return SharedFixtureScheduling(config, log)


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
