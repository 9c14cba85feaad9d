"""What the simulator models instead of running: time. Service-time profiles and the
configuration of the simulated workers and gateways.

Everything that decides (routing, residency, eviction order, the registry cache) is product
code or mirrors a named product class (see ``tiers.py``); only durations come from here.
Two profiles, never mixed:

* ``cpu``: measured in this repository on the 2-core VM (``docs/benchmarks.md``): a tiny-llama
  worker's engine steps from the 2,000-adapter load test's step trace (median step 16 ms at
  ~200 scheduled tokens a step), resolver fetch and background-parse times from the same
  run's trace, the all-token decode cost from the 512-adapter engine benchmark, the gateway's
  CPU per request from the gateway benchmark, a registry resolve from the registry benchmark.
* ``gpu``: **not measured here**. Llama 3.1 8B in bf16 on one H100-class GPU, built from the
  model's shape (weights read once per decode step, prompt FLOPs) and the paper's published
  ratio (PreFT-LoRA 1.83x the throughput of multi-LoRA with 512 adapters on Llama 3.1 8B),
  which sets the all-token decode cost. Use it for the shape of the answer, not its digits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class Lognormal:
    """A positive duration given by its median and 90th percentile (how traces report it)."""

    p50: float
    p90: float

    @property
    def sigma(self) -> float:
        return math.log(self.p90 / self.p50) / 1.2816 if self.p90 > self.p50 else 0.0

    def draw(self, rng: np.random.Generator, scale: float = 1.0) -> float:
        return scale * self.p50 * math.exp(self.sigma * rng.standard_normal())

    def mean(self) -> float:
        return self.p50 * math.exp(self.sigma**2 / 2)


@dataclass(frozen=True)
class Profile:
    """Service times of one worker, gateway and registry, in seconds."""

    name: str
    label: str
    step_base_s: float  # an engine step's fixed cost (scheduler, sampler, weights read)
    token_s: float  # per scheduled token (prompt tokens and one per decoding sequence)
    all_token_decode_factor: float  # a decoding all-token request costs this many tokens
    slot_copy_s: float  # host memory -> GPU/CPU slot, once per adapter moved into a slot
    parse_s: Lognormal  # disk -> host memory (background parse, one thread per worker)
    fetch_s: Lognormal  # object store -> disk (resolver threads), hash check included
    adapter_bytes: int  # one adapter's blob
    gateway_cpu_s: float  # the gateway's CPU per request (proxying included)
    redis_rtt_s: float  # one registry lookup in Redis (cache miss)
    kv_bytes_per_token: int  # prompt KV moved per token by the two-pool handoff
    kv_link_bytes_s: float  # KV transfer bandwidth between pools
    handoff_s: float  # the gateway's second hop (request, first token bookkeeping)
    pod_start_s: float  # a worker pod from scheduled to ready (a rolling upgrade's step)
    # vLLM 0.32's defaults for an OpenAI server on the device (EngineArgs.get_batch_defaults),
    # which a worker runs with unless WorkerConfig sets them
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    source: dict[str, str] = field(default_factory=dict)

    def scaled(self, factor: float) -> Profile:
        """Every CPU cost times ``factor`` (a slower or faster phase of a shared machine)."""
        return replace(
            self,
            step_base_s=self.step_base_s * factor,
            token_s=self.token_s * factor,
            slot_copy_s=self.slot_copy_s * factor,
            parse_s=Lognormal(self.parse_s.p50 * factor, self.parse_s.p90 * factor),
            fetch_s=Lognormal(self.fetch_s.p50 * factor, self.fetch_s.p90 * factor),
            gateway_cpu_s=self.gateway_cpu_s * factor,
        )


CPU = Profile(
    name="cpu",
    label="CPU, measured (tiny-llama worker on this 2-core VM)",
    # Median step 15.8-16.2 ms at 8,166-10,007 scheduled tokens/s and 40-46 steps/s
    # (loadtest_stalls/stall_trace.json): ~200 tokens a step; a decode-only step of a few
    # sequences is well under half of that.
    step_base_s=0.006,
    token_s=0.00005,
    # all-lora vs preft-lora at 512 adapters on the same kernels: 2.91x (engine_bench_512).
    all_token_decode_factor=2.91,
    slot_copy_s=0.0005,  # ~0.5 ms per adapter moved into a slot (engine_profile)
    parse_s=Lognormal(0.0056, 0.0126),  # background_parse p50 / p90 (stall_trace run 2)
    fetch_s=Lognormal(0.0577, 0.180),  # resolver_fetch p50 / p90 (stall_trace run 2)
    adapter_bytes=1 * MIB,  # a rank-4 tiny-llama LoRA is far smaller; 1 MiB is generous
    gateway_cpu_s=0.0015,  # 1.46-1.61 ms per request with a real worker (gateway_bench)
    redis_rtt_s=0.00017,  # resolve p99 through Redis (registry_bench)
    kv_bytes_per_token=8_190,  # 8.19 MB per 1k prompt tokens (disagg_bench)
    kv_link_bytes_s=8.19e6 / 0.02676,  # ~27 ms per 1k tokens at 2,048 tokens (disagg_bench)
    handoff_s=0.0067,  # gateway handoff 5.2-7.5 ms (disagg_bench)
    pod_start_s=30.0,
    source={
        "steps": "docs/results/loadtest_stalls/stall_trace.json",
        "all_token": "docs/results/engine_bench_512.json",
        "loads": "docs/results/loadtest_stalls/stall_trace.json",
        "gateway": "docs/results/gateway_bench.json",
        "registry": "docs/results/registry_bench.json",
        "kv": "docs/results/disagg_bench.json",
    },
)

# Llama 3.1 8B, bf16, one H100-class GPU: 16 GB of weights read per decode step at ~3 TB/s
# (~5.5 ms) plus ~1.5 ms of scheduling; ~16 GFLOP per prompt token at ~450 TFLOP/s
# effective; a rank-16 q,k,v,o LoRA on 32 layers is 13.6 M parameters (27 MB in bf16).
GPU = Profile(
    name="gpu",
    label="GPU, modelled (Llama 3.1 8B on one H100-class GPU; paper ratios)",
    step_base_s=0.007,
    token_s=0.000036,
    all_token_decode_factor=1.83,  # the paper: PreFT-LoRA 1.83x multi-LoRA, 512 adapters, 8B
    slot_copy_s=0.0011,  # 27 MB over PCIe at ~25 GB/s
    parse_s=Lognormal(0.030, 0.060),  # safetensors load of 27 MB into pinned memory
    fetch_s=Lognormal(0.180, 0.400),  # S3 GET of 27 MB at ~200 MB/s + first byte + hash
    adapter_bytes=27 * MIB,
    gateway_cpu_s=0.0015,
    redis_rtt_s=0.0005,
    kv_bytes_per_token=128 * 1024,  # 2 x 32 layers x 8 KV heads x 128 x 2 bytes
    kv_link_bytes_s=12.5e9,  # 100 Gb/s RDMA
    handoff_s=0.002,
    pod_start_s=120.0,
    max_num_seqs=1024,
    max_num_batched_tokens=8192,
    source={
        "all_token": "paper: 1.83x (LoRA) on Llama 3.1 8B, 512 adapters",
        "rest": "model shape and nominal H100 figures (docs/scale.md)",
    },
)

PROFILES = {p.name: p for p in (CPU, GPU)}


@dataclass(frozen=True)
class Pauses:
    """When workers' engines made no progress that their step model does not give: per
    worker, intervals ``(start, end)`` in seconds from the run's start, replayed as a real
    run's step traces measured them (``stalls.py``), never fitted."""

    workers: tuple[tuple[tuple[float, float], ...], ...]
    source: str = ""


@dataclass(frozen=True)
class WorkerConfig:
    """A worker's adapter tiers and engine limits, as ``python -m preft_serve.worker.serve``
    configures them (defaults: ``--max-loras 8 --max-cpu-loras 64``, 10 GiB disk cache).

    The scheduler's limits per step (``worker.SimWorker._plan``): ``max_loras`` distinct
    adapters, ``max_num_seqs`` running requests, ``max_num_batched_tokens`` tokens (prompts
    are chunked to fit). serve.py passes neither of the last two to vLLM, so None means
    vLLM's default on the profile's device (``Profile``: 128 and 2,048 on a CPU, 1,024 and
    8,192 on an H100-class GPU); the load test passes ``--max-num-seqs 64``."""

    max_loras: int = 8
    max_num_seqs: int | None = None  # --max-num-seqs
    max_num_batched_tokens: int | None = None  # --max-num-batched-tokens
    max_cpu_loras: int = 64
    disk_bytes: int = 10 * GIB
    resolver_threads: int = 2  # PREFT_WORKER_RESOLVER_THREADS
    parse_threads: int = 1  # install_preloader(threads=1)
    prefetch_on_update: bool = True  # the chart gives workers the registry's Redis
