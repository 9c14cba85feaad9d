"""Session-wide real backing services (a redis-server process and a moto S3 server) and the
test tiers.

Both servers run for the whole session on free loopback ports and are shared by every test
directory. Tests isolate themselves with their own Redis key namespace and bucket rather
than restarting the servers.

Tiers say what a test starts (pyproject.toml lists the markers); every tier is also ``slow``.
A test is in a tier when it lives in a tier folder (:data:`FOLDER_TIERS`), requests a fixture
or its module imports a helper marked with the tier (:func:`tests.support.tiers.tier`), or
carries the marker itself. ``make test`` runs them all; ``make test-fast`` (``-m "not slow"``)
is the edit loop. Under ``pytest -n N`` a test file is one unit of work, and so is a whole
directory that shares an expensive fixture (the engines, the e2e stack), so each of those
starts once (:func:`pytest_xdist_make_scheduler`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from preft_serve.common.local_redis import NOT_INSTALLED, running_redis
from tests.support import tiers
from tests.support.ports import free_port, wait_for_port

TESTS = Path(__file__).parent
# Two test processes share the cores, each starting vLLM engines, trainers and whole stacks:
# OpenMP's default active wait keeps idle threads spinning, so one process's spinning
# threads take the cores the other's (and its own I/O threads) are waiting for. Passive
# waiting, inherited by every process the suite starts, unless the caller chose otherwise.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Folders under tests/ whose every test starts something expensive, and what. The other
# folders mirror the source (services/preft_serve/<package>, bench, kernels): their
# tests are fast unless a fixture or imported helper they use says otherwise.
FOLDER_TIERS: dict[str, tuple[str, ...]] = {
    "engine": ("engine",),  # in-process vLLM engines (one set per session)
    "e2e": ("stack",),  # vLLM servers, registry and gateway as processes
    "disagg": ("stack",),  # a prefill and a decode worker with the registry and gateway
    "onebox": ("stack",),  # `make run`'s local stack as processes, the chaos soak
    "benchmarks": ("stack",),  # the benchmarks' quick modes, end to end
    "finetune": ("trainer",),  # real trainer processes
    "studies": ("study",),  # quality and RL studies in their quick modes
    "chart": ("helm",),  # helm template, kubernetes schemas, promtool
    "fuzz": ("fuzz",),
    "images": ("images",),  # make images, then the chart's containers run from them
    "browser": ("browser",),  # the web console in headless Chromium against the stack
}
# Directories whose tests share one expensive fixture: kept on one xdist worker together.
SHARED_FIXTURE_DIRS = ("engine", "e2e", "images", "browser")
# Tier folders whose files take minutes, longest first: handed out before everything else,
# so none of them starts last and runs alone at the end of the suite. Then the other slow
# files, then the fast ones.
LONGEST = ("images", "onebox", "e2e", "browser", "benchmarks", "disagg")
TIER_NAMES = frozenset(
    {
        "engine",
        "stack",
        "soak",
        "trainer",
        "helm",
        "fuzz",
        "images",
        "study",
        "real_model",
        "outage",
        "browser",
    }
)


def _folder(item: pytest.Item) -> str:
    parts = item.path.relative_to(TESTS).parts
    return parts[0] if len(parts) > 1 else ""


def tiers_of(item: pytest.Item) -> set[str]:
    """The tiers of ``item``'s folder, of the fixtures it requests (with theirs) and of the
    helpers its module imports."""
    found = set(FOLDER_TIERS.get(_folder(item), ()))
    fixtureinfo = getattr(item, "_fixtureinfo", None)
    if fixtureinfo is not None:
        for definitions in fixtureinfo.name2fixturedefs.values():
            for definition in definitions:
                found.update(tiers.tiers_of(definition.func))
    module = getattr(item, "module", None)
    if module is not None:
        for value in vars(module).values():
            found.update(tiers.tiers_of(value))
    return found


def run_order(item: pytest.Item) -> int:
    """Where a test's file is handed out: :data:`LONGEST` first, then the other slow files,
    then the fast ones (a greedy longest-first schedule keeps both workers busy)."""
    folder = _folder(item)
    if folder in LONGEST:
        return LONGEST.index(folder)
    return len(LONGEST) + (0 if item.get_closest_marker("slow") else 1)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tier markers, before ``-m`` deselects by them (hence ``tryfirst``), then the longest
    work first; a stable sort keeps the order within each file."""
    for item in items:
        for name in sorted(tiers_of(item)):
            item.add_marker(getattr(pytest.mark, name))
        if any(mark.name in TIER_NAMES for mark in item.iter_markers()):
            item.add_marker(pytest.mark.slow)
    items.sort(key=run_order)


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


@pytest.fixture
def redis_client(redis_server: str) -> Iterator[redis.Redis]:
    """A client of the test Redis (strings decoded), closed after the test."""
    client = redis.Redis.from_url(redis_server, decode_responses=True)
    yield client
    client.close()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """Endpoint URL of a real S3-protocol HTTP server (moto), killed at session end.

    A separate process, like a real S3 endpoint: moto's server imports Flask, whose context
    proxies break vLLM's start-up scan of loaded modules if they share the test process.
    """
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_port(port, proc, 30)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(10)
