"""What the load tests share: many tiny adapters, tenants that own them, bound users,
Prometheus scrapes, process CPU accounting and the instant upstreams. The stack itself is
:mod:`preft_serve.onebox`."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from preft_serve.adapters.format import CONFIG_FILE, WEIGHTS_FILE, AdapterMode
from preft_serve.onebox import free_port
from preft_serve.onebox.seed import TenantSession, create_tenant
from preft_serve.onebox.stack import OneBox, StackError
from preft_serve.worker.adapter_tiers.background_parse import THREAD_NAME as PRELOAD_THREAD

SEED_BASE = 10_000  # adapter i uses seed SEED_BASE + i: distinct content, distinct sha256


@dataclasses.dataclass(frozen=True)
class BoundUser:
    api_key: str
    user: str
    adapter: str
    sha256: str
    mode: str


def adapter_mode(i: int, all_fraction: float) -> AdapterMode:
    """Spread ``all``-mode adapters evenly: adapter i is ``all`` when the running count of
    ``all_fraction * (i + 1)`` steps up at i."""
    steps = math.floor(all_fraction * (i + 1)) - math.floor(all_fraction * i)
    return AdapterMode.ALL if steps else AdapterMode.PREFILL


def make_adapters(
    model: Path, root: Path, count: int, rank: int = 4, all_fraction: float = 0.0
) -> list[tuple[Path, AdapterMode]]:
    """``count`` rank-``rank`` LoRA folders under ``root`` (kept between runs)."""
    from preft_serve.toymodels import LoraSpec, make_lora_adapter  # imports torch

    out = []
    for i in range(count):
        mode = adapter_mode(i, all_fraction)
        folder = root / f"r{rank}-{i:05d}"
        if not ((folder / CONFIG_FILE).is_file() and (folder / WEIGHTS_FILE).is_file()):
            make_lora_adapter(
                model,
                folder,
                seed=SEED_BASE + i,
                spec=LoraSpec(rank=rank, mode=AdapterMode.PREFILL),
            )
        out.append((folder, mode))
    return out


def seed_tenants(
    stack: OneBox,
    adapters: Sequence[tuple[Path, AdapterMode]],
    tenants: int,
    threads: int = 4,
    prefix: str = "load",
) -> list[BoundUser]:
    """Create ``tenants`` tenants, upload adapter i to tenant ``i % tenants`` over REST and
    bind user ``u<i>`` to it; return every binding."""
    keys = [
        create_tenant(stack.registry_url, stack.admin_token, f"{prefix}-{t}")
        for t in range(tenants)
    ]
    sessions = [TenantSession(stack.registry_url, k) for k in keys]

    def one(i: int) -> BoundUser:
        folder, mode = adapters[i]
        session = sessions[i % tenants]
        name, user = f"a{i:05d}", f"u{i:05d}"
        up = session.upload(folder, name, mode)
        session.bind(user, name)
        return BoundUser(keys[i % tenants], user, name, up.sha256, up.mode)

    try:
        with ThreadPoolExecutor(threads) as pool:
            return list(pool.map(one, range(len(adapters))))
    finally:
        for s in sessions:
            s.close()


def scrape(url: str, names: Sequence[str]) -> dict[str, float]:
    """Sum of each named counter/gauge's samples by label set, keyed ``name{k=v,...}``."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def group_pids(pgid: int) -> list[int]:
    """Live processes in process group ``pgid`` (a local-stack part and what it started)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU time so far of ``pids`` (Linux /proc; vanished pids count 0)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / tick


def _tasks(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def _is_preload(tid: int) -> bool:
    try:
        return Path(f"/proc/{tid}/comm").read_text().strip() == PRELOAD_THREAD
    except OSError:
        return False


def isolate_model_cpus(pids: Iterable[int]) -> tuple[set[int], list[int]]:
    """Leave the CPUs vLLM bound its compute threads to (threads whose affinity is narrower
    than the whole machine) to those threads alone: move every other thread of ``pids`` and
    of this process to the remaining CPUs. Returns (model CPUs, moved thread ids). The
    worker's adapter-parse threads (``preft-preload``) bind themselves to the CPUs the
    compute threads leave free: they are not model threads.

    On a small machine this keeps the gateway, the API servers and the load generator from
    preempting the model's OpenMP thread, which stalls every request in the batch at once.
    """
    everything = set(range(os.cpu_count() or 1))
    threads = [t for pid in [*pids, os.getpid()] for t in _tasks(pid)]
    model: set[int] = set()
    for t in threads:
        with contextlib.suppress(OSError):
            if (cpus := os.sched_getaffinity(t)) != everything and not _is_preload(t):
                model |= cpus
    rest = everything - model
    moved = []
    if model and rest:
        for t in threads:
            with contextlib.suppress(OSError):
                if os.sched_getaffinity(t) == everything:
                    os.sched_setaffinity(t, rest)
                    moved.append(t)
    return model, moved


def release_cpus(threads: Iterable[int]) -> None:
    """Undo :func:`isolate_model_cpus` for ``threads``."""
    everything = set(range(os.cpu_count() or 1))
    for t in threads:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(t, everything)


def stack_main(stack: OneBox, body: Callable[[], int]) -> int:
    """Run a benchmark's ``body`` on ``stack``: a part that fails to start is an
    ``error: ...`` line and exit 1, and the stack is stopped however it ends."""
    try:
        return body()
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        stack.stop()


def write_results(
    out: Path,
    result: dict[str, Any],
    plot: Callable[[dict[str, Any], Path], None],
    markdown: str | None = None,
) -> None:
    """``out``.json (and .md with ``markdown``) and the plot ``out``.png."""
    out.parent.mkdir(parents=True, exist_ok=True)
    # default=str: a setup that echoes the arguments holds paths (--result-dir).
    out.with_suffix(".json").write_text(json.dumps(result, indent=2, default=str))
    written = [".json"]
    if markdown is not None:
        out.with_suffix(".md").write_text(markdown + "\n")
        written.append(".md")
    plot(result, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('')}{{{','.join([*written, '.png'])}}}")


@dataclasses.dataclass(frozen=True)
class FakeUpstream:
    url: str
    pid: int


def _start_asgi(
    stack: OneBox,
    name: str,
    app: str,
    ready: Callable[[str], bool],
    env: dict[str, str] | None = None,
) -> FakeUpstream:
    """A raw ASGI app of ``bench`` under uvicorn (uvloop and httptools, as
    the gateway's uvicorn picks them) as a part of ``stack``."""
    port = free_port()
    child = stack.start(
        name,
        [
            sys.executable,
            "-m",
            "uvicorn",
            app,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-access-log",
            "--log-level",
            "warning",
            "--app-dir",
            str(Path(__file__).resolve().parent.parent),
        ],
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    child.wait_ready(lambda: ready(url), 60)
    return FakeUpstream(url, child.pid)


def start_fake_upstream(stack: OneBox) -> FakeUpstream:
    """``bench/fake_worker.py`` (answers like vLLM, at once) as a part of ``stack``."""
    return _start_asgi(
        stack,
        "fake-worker",
        "bench.fake_worker:app",
        lambda url: httpx.get(f"{url}/health").status_code == 200,
    )


def start_floor_proxy(stack: OneBox, upstream: str) -> FakeUpstream:
    """``bench/floor_proxy.py`` in front of ``upstream``: what a server plus a client
    cost here with no gateway logic."""
    return _start_asgi(
        stack,
        "floor-proxy",
        "bench.floor_proxy:app",
        lambda url: (
            httpx.post(
                f"{url}/v1/completions", json={"model": "x", "prompt": "x", "max_tokens": 1}
            ).status_code
            == 200
        ),
        env={"PREFT_FLOOR_UPSTREAM": upstream},
    )
