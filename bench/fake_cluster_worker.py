"""Fake workers for routing checks: many per process, each with a resident set, a load and
a service time, on plain asyncio streams (no framework: fifty of them share two cores with
ten gateways).

What a gateway reads from a worker, each fake worker answers as vLLM does:

* ``/health``: 200 while it is up;
* ``/v1/models``: the base model with ``max_model_len`` and, as ``sha256:<hex>``, every
  adapter the worker has resolved since it started (vLLM's ``lora_requests``, which nothing
  prunes when a tier evicts: see ``bench/scale_sim/tiers.py``); ``--report lru`` lists
  only the host-memory LRU instead;
* ``/metrics``: ``vllm:num_requests_running`` and ``vllm:num_requests_waiting``, which the
  gateway's load poll sums (``pool_monitor.LoadCount``);
* ``/v1/completions``: the answer after a modelled service time (:class:`ServiceModel`).

Adapter tiers mirror the chart's worker (``worker.maxLoras`` GPU slots, ``worker.maxCpuLoras``
host memory, LRU each; the disk cache holds every adapter seen, as the chart's 20 GiB do
for small adapters). A bench control surface (``/bench/*``) prewarms, reports and stops
one worker; the gateway never calls it.

    python -m bench.fake_cluster_worker --ports 9101,9102,9103
    python -m bench.fake_cluster_worker --count 10 --ports-file /tmp/ports.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

from bench.scale_sim.model import CPU

MODEL_PREFIX = "sha256:"
BASE_MODEL = "fake-base"
MAX_MODEL_LEN = 4096  # > the workload's longest prompt (2,048) plus its longest answer (256)
LOAD_SAMPLE_S = 0.5  # the simulator's load sampling period (scale_sim.cluster.SAMPLE_S)
TIERS = ("slot", "host", "disk", "fetch")


@dataclass(frozen=True)
class ServiceModel:
    """A request's time on a worker, from the engine numbers measured on this machine
    (``bench/scale_sim/model.py``'s ``cpu`` profile, sourced from docs/benchmarks.md):

    * ``step_s`` (6 ms): an engine step's fixed cost; ``token_s`` (0.05 ms): per scheduled
      token. Median step 16 ms at ~200 tokens a step in the 2,000-adapter load test.
    * prefill: one step of ``prompt`` tokens; decode: ``output`` steps, each carrying every
      running sequence (``running`` at admission), so concurrency raises the time.
    * a cold adapter first costs: ``slot_copy_s`` (0.5 ms, host memory -> slot),
      ``parse_s`` (5.6 ms median, disk -> host memory), ``fetch_s`` (58 ms median,
      object store -> disk): each tier missed adds its own and those above it.

    Medians only (no noise): the check compares routing, not latency tails."""

    step_s: float = CPU.step_base_s
    token_s: float = CPU.token_s
    slot_copy_s: float = CPU.slot_copy_s
    parse_s: float = CPU.parse_s.p50
    fetch_s: float = CPU.fetch_s.p50

    def cold_s(self, tier: str) -> float:
        """The load delay of an adapter found in ``tier`` (one of :data:`TIERS`)."""
        if tier == "slot":
            return 0.0
        if tier == "host":
            return self.slot_copy_s
        if tier == "disk":
            return self.slot_copy_s + self.parse_s
        return self.slot_copy_s + self.parse_s + self.fetch_s

    def seconds(self, prompt: int, output: int, running: int, tier: str) -> float:
        prefill = self.step_s + prompt * self.token_s
        decode = output * (self.step_s + max(running, 1) * self.token_s)
        return self.cold_s(tier) + prefill + decode


class Residency:
    """A worker's adapters: GPU slots and host memory (count-bounded LRUs, vLLM's
    ``LRUCacheLoRAModelManager`` / ``LRUCacheWorkerLoRAManager``), the disk (everything
    seen) and what ``/v1/models`` reports."""

    def __init__(self, max_loras: int, max_cpu_loras: int, report: str = "resolved") -> None:
        if report not in ("resolved", "lru"):
            raise ValueError(f"report must be 'resolved' or 'lru', not {report!r}")
        self.slots: OrderedDict[str, None] = OrderedDict()
        self.host: OrderedDict[str, None] = OrderedDict()
        self.max_loras, self.max_cpu_loras = max_loras, max(max_cpu_loras, max_loras)
        self.seen: dict[str, None] = {}  # insertion-ordered: what vLLM has resolved
        self.report = report

    @staticmethod
    def _put(lru: OrderedDict[str, None], sha: str, capacity: int) -> None:
        lru[sha] = None
        lru.move_to_end(sha)
        while len(lru) > capacity:
            lru.popitem(last=False)

    def use(self, sha: str) -> str:
        """A request for ``sha``: where it was found (:data:`TIERS`); it ends up in every
        tier, most recent."""
        if sha in self.slots:
            tier = "slot"
        elif sha in self.host:
            tier = "host"
        elif sha in self.seen:
            tier = "disk"
        else:
            tier = "fetch"
        self.seen[sha] = None
        self._put(self.host, sha, self.max_cpu_loras)
        self._put(self.slots, sha, self.max_loras)
        return tier

    def prewarm(self, shas: list[str]) -> None:
        """A worker that has served for hours: ``shas`` most popular first."""
        for sha in reversed(shas):
            self.seen[sha] = None
        for sha in reversed(shas[: self.max_cpu_loras]):
            self._put(self.host, sha, self.max_cpu_loras)
        for sha in reversed(shas[: self.max_loras]):
            self._put(self.slots, sha, self.max_loras)

    def reported(self) -> list[str]:
        return list(self.seen if self.report == "resolved" else self.host)


@dataclass
class WorkerState:
    """One fake worker's residency, load and counters (what ``/bench/stats`` returns)."""

    residency: Residency
    model: ServiceModel = field(default_factory=ServiceModel)
    running: int = 0
    load_sum: float = 0.0
    load_n: int = 0
    served: Counter[str] = field(default_factory=Counter)  # requests per adapter sha
    tiers: Counter[str] = field(default_factory=Counter)

    def admit(self, sha: str | None, prompt: int, output: int) -> float:
        """Count a request in; its service time."""
        tier = "slot" if sha is None else self.residency.use(sha)
        if sha is not None:
            self.served[sha] += 1
        self.tiers[tier] += 1
        self.running += 1
        return self.model.seconds(prompt, output, self.running, tier)

    def finish(self) -> None:
        self.running -= 1

    def sample(self) -> None:
        self.load_sum += self.running
        self.load_n += 1

    def models(self) -> dict[str, Any]:
        data = [{"id": BASE_MODEL, "object": "model", "max_model_len": MAX_MODEL_LEN}]
        data += [
            {"id": MODEL_PREFIX + sha, "object": "model", "max_model_len": MAX_MODEL_LEN}
            for sha in self.residency.reported()
        ]
        return {"object": "list", "data": data}

    def metrics(self) -> str:
        """vLLM's two load gauges (every request runs at once here: none waits)."""
        label = f'{{model_name="{BASE_MODEL}"}}'
        return (
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{label} {float(self.running)}\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{label} 0.0\n"
        )

    def stats(self) -> dict[str, Any]:
        return {
            "load_sum": self.load_sum,
            "load_n": self.load_n,
            "served": dict(self.served),
            "tiers": dict(self.tiers),
            "reported": len(self.residency.seen),
        }


def prompt_tokens(request: dict[str, Any]) -> int:
    """Token ids count one each; text counts a token per 4 characters (rough, enough here)."""
    prompt = request.get("prompt", "")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return len(prompt)
    return max(1, math.ceil(len(str(prompt)) / 4))


def completion(request: dict[str, Any], tokens: int) -> bytes:
    usage = {"prompt_tokens": prompt_tokens(request), "completion_tokens": tokens}
    usage["total_tokens"] = usage["prompt_tokens"] + tokens
    body = {
        "id": "cmpl-fake",
        "object": "text_completion",
        "created": int(time.time()),
        "model": request.get("model", BASE_MODEL),
        "choices": [{"index": 0, "text": "x" * tokens, "finish_reason": "length"}],
        "usage": usage,
    }
    return json.dumps(body, separators=(",", ":")).encode()


class FakeWorker:
    """One worker on one port: an asyncio server speaking just enough HTTP/1.1."""

    def __init__(self, port: int, state: WorkerState) -> None:
        """``port`` 0: any free one (``port`` holds it once started)."""
        self.port, self.state = port, state
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.up = True

    async def start(self) -> None:
        self.server = await asyncio.start_server(self.connection, "127.0.0.1", self.port)
        self.port = int(self.server.sockets[0].getsockname()[1])

    async def sampler(self) -> None:
        while self.up:
            await asyncio.sleep(LOAD_SAMPLE_S)
            self.state.sample()

    def leave(self) -> None:
        """Gone: new connections refused, open ones closed (a stopped pod)."""
        self.up = False
        if self.server is not None:
            self.server.close()
        for writer in list(self.writers):
            writer.close()

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        try:
            while self.up:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (line.partition(":") for line in lines[1:] if line)
                }
                length = int(headers.get("content-length", "0"))
                body = await reader.readexactly(length) if length else b""
                status, ctype, out = await self.handle(method, path.split("?", 1)[0], body)
                writer.write(
                    f"HTTP/1.1 {status} X\r\ncontent-type: {ctype}\r\n"
                    f"content-length: {len(out)}\r\n\r\n".encode()
                    + out
                )
                await writer.drain()
                if headers.get("connection", "").lower() == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            self.writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()

    async def handle(self, method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        state, js = self.state, "application/json"
        if path == "/health":
            return 200, js, b""
        if path == "/v1/models":
            return 200, js, json.dumps(state.models()).encode()
        if path == "/metrics":
            return 200, "text/plain; version=0.0.4", state.metrics().encode()
        if path == "/bench/stats":
            return 200, js, json.dumps(state.stats()).encode()
        if path == "/bench/prewarm" and method == "POST":
            state.residency.prewarm(json.loads(body))
            return 200, js, b"{}"
        if path == "/bench/leave" and method == "POST":
            asyncio.get_running_loop().call_soon(self.leave)
            return 200, js, b"{}"
        if path == "/v1/completions" and method == "POST":
            request = json.loads(body)
            model = str(request.get("model", ""))
            sha = model.removeprefix(MODEL_PREFIX) if model.startswith(MODEL_PREFIX) else None
            tokens = int(request.get("max_tokens") or 16)
            seconds = state.admit(sha, prompt_tokens(request), tokens)
            try:
                await asyncio.sleep(seconds)
            finally:
                state.finish()
            return 200, js, completion(request, tokens)
        return 404, js, b'{"error": {"message": "fake", "type": "NotFoundError", "code": 404}}'


def write_ports(path: str, ports: list[int]) -> None:
    """All at once (a reader never sees half a list)."""
    with open(f"{path}.tmp", "w") as f:
        json.dump(ports, f)
    os.replace(f"{path}.tmp", path)


async def serve(
    ports: list[int], max_loras: int, max_cpu_loras: int, report: str, ports_file: str | None
) -> None:
    """Run one worker per port (0: any free one); ``ports_file`` gets the ports as a JSON
    list once all of them listen (picking free ports here, not in the parent, leaves no
    time for another process to take one)."""
    workers = [
        FakeWorker(p, WorkerState(Residency(max_loras, max_cpu_loras, report))) for p in ports
    ]
    for w in workers:
        await w.start()
    if ports_file:
        write_ports(ports_file, [w.port for w in workers])
    await asyncio.gather(*(w.sampler() for w in workers))
    await asyncio.Event().wait()  # a worker that left stays gone until the process ends


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.fake_cluster_worker",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--ports", help="comma-separated loopback ports, one worker each")
    where.add_argument("--count", type=int, help="this many workers on free ports")
    p.add_argument("--ports-file", help="write the workers' ports here (JSON) once they listen")
    p.add_argument("--max-loras", type=int, default=8, help="GPU slots (chart worker.maxLoras)")
    p.add_argument(
        "--max-cpu-loras", type=int, default=1024, help="host memory (chart worker.maxCpuLoras)"
    )
    p.add_argument(
        "--report",
        choices=("resolved", "lru"),
        default="resolved",
        help="what /v1/models lists: every adapter resolved (vLLM) or the host LRU",
    )
    args = p.parse_args(argv)
    ports = [int(x) for x in args.ports.split(",") if x] if args.ports else [0] * args.count
    asyncio.run(serve(ports, args.max_loras, args.max_cpu_loras, args.report, args.ports_file))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
