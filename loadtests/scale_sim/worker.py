"""One simulated worker: adapter tiers (``tiers.py``) and an engine whose step time is
modelled, not run.

The engine is a continuous-batching server: a request waits for its adapter (the parse gate
holds it while the adapter is fetched and parsed in the background, never the step), for the
next step boundary, then its prompt is prefilled in one step and one token a step follows.
A step costs ``step_base_s + token_s * tokens`` where tokens are the running sequences (an
all-token one counts ``all_token_decode_factor``) plus the prompt tokens scheduled in it; with
prompt tokens arriving at ``rate`` a second that is ``(base + token_s * n) / (1 - token_s *
rate)``. A request's step time is taken when it starts (not re-evaluated while it runs).
``max_num_seqs`` bounds the running requests; vLLM's ``max_loras`` bounds the distinct
adapters in a batch, which all-token requests hold for their whole life: a request whose
adapter is not among them waits while they fill every slot. A worker given ``pauses``
(``model.Pauses``) makes no engine progress in them: every request on it waits them out
(its fetch and parse threads go on).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter, deque
from dataclasses import dataclass

import numpy as np

from loadtests.scale_sim.model import Profile, WorkerConfig
from loadtests.scale_sim.tiers import DiskTier, LruTier, Reported

MULTIPART_CHUNK = 8 * (1 << 20)  # boto3's download_file: ranged GETs of 8 MiB above 8 MiB
RATE_WINDOW_S = 1.0
TIERS = ("slot", "host", "inflight", "disk", "store")  # where a request found its adapter
WARM_TIERS = ("slot", "host")


@dataclass(slots=True)
class Req:
    """One request and what happened to it."""

    id: int
    t0: float  # arrival at a gateway
    user: int
    adapter: int
    tenant: int
    sha: str
    prompt: int
    output: int
    stream: bool
    all_token: bool
    gateway: int = 0
    worker: str = ""
    route: str = ""
    tier: str = ""
    first: float = math.nan  # first token (TTFT = first - t0)
    done: float = math.nan
    state: str = "new"  # new, waiting, running, decoding, done, failed
    error: str = ""
    two_pools: bool = False
    decode_worker: str = ""


def s3_gets(size: int) -> int:
    """GETs of one ``ObjectStore.fetch_adapter``: the config, then the weights file."""
    return 1 + max(1, math.ceil(size / MULTIPART_CHUNK)) if size > MULTIPART_CHUNK else 2


class SimWorker:
    """A worker pod: ``role`` unified (adapters, prefill and decode), prefill (adapters,
    first token only) or decode (no adapters)."""

    def __init__(self, url: str, profile: Profile, config: WorkerConfig,
                 rng: np.random.Generator, born: float, role: str = "unified",
                 pauses: tuple[tuple[float, float], ...] = ()) -> None:
        self.url, self.profile, self.config, self.rng, self.role = (
            url, profile, config, rng, role)
        self.pause_start = [a for a, _ in sorted(pauses)]
        self.pause_end = [b for _, b in sorted(pauses)]
        self.slots = LruTier(config.max_loras)
        self.host = LruTier(max(config.max_cpu_loras, config.max_loras))
        self.disk = DiskTier(config.disk_bytes)
        self.reported = Reported()
        self.alive = True  # False: the node is gone (connections time out)
        self.accepting = True  # False: terminating (connections refused, running finish)
        self.running: dict[int, Req] = {}
        self.waiting: deque[Req] = deque()
        self.all_adapters: Counter[str] = Counter()  # all-token adapters running: slots held
        self.all_running = 0  # all-token requests running
        self.parse_free = [born] * config.parse_threads
        self.fetch_free = [born] * config.resolver_threads
        self.prefetch_free = [born] * 2  # RegistryPrefetcher's own pool (threads=2)
        self.loading: dict[str, float] = {}  # sha -> when its load completes
        self.rate = 0.0  # prompt tokens a second (exponentially weighted)
        self.rate_t = born
        self.fetches: list[float] = []  # times of object-store fetches
        self.parses = 0
        self.served = 0
        self.s3_gets = 0
        self.s3_bytes = 0
        self.gets_per_fetch = s3_gets(profile.adapter_bytes)

    # -- adapters ------------------------------------------------------------------------

    def load(self, sha: str, t: float) -> tuple[str, float]:
        """Where the adapter was found and when it is ready; moves it through the tiers."""
        pending = self.loading.get(sha)
        if pending is not None:
            if pending > t:
                self.slots.add(sha)
                self.host.touch(sha)
                return "inflight", pending
            del self.loading[sha]
        self.reported.add(sha)
        if self.slots.touch(sha):
            self.host.touch(sha)
            self.disk.note_use(sha)  # the resolver's on_use hook
            return "slot", t
        if self.host.touch(sha):
            self.slots.add(sha)
            self.disk.note_use(sha)
            return "host", t
        if self.disk.note_use(sha):
            tier, available = "disk", t
        else:
            tier = "store"
            k = min(range(len(self.fetch_free)), key=self.fetch_free.__getitem__)
            start = max(t, self.fetch_free[k])
            available = start + self.profile.fetch_s.draw(self.rng)
            self.fetch_free[k] = available
            self.disk.insert(sha, self.profile.adapter_bytes)
            self.fetches.append(available)
            self.s3_gets += self.gets_per_fetch
            self.s3_bytes += self.profile.adapter_bytes
        k = min(range(len(self.parse_free)), key=self.parse_free.__getitem__)
        ready = max(available, self.parse_free[k]) + self.profile.parse_s.draw(self.rng)
        self.parse_free[k] = ready
        self.parses += 1
        self.loading[sha] = ready
        self.host.add(sha)
        self.slots.add(sha)
        return tier, ready

    def prefetch(self, sha: str, older: list[str], t: float) -> bool:
        """``RegistryPrefetcher``: when an older version is on disk, demote it and fetch the
        new one into the disk cache (not host memory, not the reported list)."""
        held = [s for s in older if s in self.disk]
        if not held or sha in self.disk:
            return False
        for old in held:
            self.disk.demote(old)
        k = min(range(len(self.prefetch_free)), key=self.prefetch_free.__getitem__)
        done = max(t, self.prefetch_free[k]) + self.profile.fetch_s.draw(self.rng)
        self.prefetch_free[k] = done
        self.disk.insert(sha, self.profile.adapter_bytes)
        self.fetches.append(done)
        self.s3_gets += self.gets_per_fetch
        self.s3_bytes += self.profile.adapter_bytes
        return True

    # -- engine --------------------------------------------------------------------------

    def after(self, t: float, work: float) -> float:
        """When ``work`` seconds of engine time begun at ``t`` are done, pauses skipped."""
        i = bisect_right(self.pause_end, t)  # the first pause not over at t
        while i < len(self.pause_start) and self.pause_start[i] < t + work:
            work -= max(0.0, self.pause_start[i] - t)
            t = self.pause_end[i]
            i += 1
        return t + work

    def step_s(self, t: float) -> float:
        """The current step time (see the module docstring)."""
        p = self.profile
        self.rate *= math.exp(-(t - self.rate_t) / RATE_WINDOW_S)
        self.rate_t = t
        tokens = len(self.running) + (p.all_token_decode_factor - 1.0) * self.all_running
        return (p.step_base_s + p.token_s * tokens) / max(0.05, 1.0 - p.token_s * self.rate)

    def blocked(self, req: Req) -> bool:
        if len(self.running) >= self.profile.max_num_seqs:
            return True
        return (self.role != "decode" and req.sha not in self.all_adapters
                and len(self.all_adapters) >= self.config.max_loras)

    def admit(self, req: Req, t: float) -> float | None:
        """Start ``req`` at ``t`` and return when it leaves this worker, or queue it (None)."""
        req.worker = req.worker or self.url
        if self.blocked(req):
            req.state = "waiting"
            self.waiting.append(req)
            return None
        return self._start(req, t)

    def _start(self, req: Req, t: float) -> float:
        p = self.profile
        tau = self.step_s(t)
        self.running[req.id] = req
        self.served += 1
        if self.role == "decode":  # the KV arrived: one token a step from the second on
            req.state = "decoding"
            return self.after(t, (req.output - 1) * tau)
        tier, ready = self.load(req.sha, t)
        req.tier = tier
        copy = 0.0 if tier == "slot" else p.slot_copy_s
        req.first = self.after(max(ready, t), self.rng.random() * tau + tau
                               + p.token_s * req.prompt + copy)
        self.rate += req.prompt / RATE_WINDOW_S
        req.state = "running"
        if req.all_token:
            self.all_adapters[req.sha] += 1
            self.all_running += 1
        if self.role == "prefill" and not req.all_token:
            return req.first
        return self.after(req.first, (req.output - 1) * tau)

    def finish(self, req: Req, t: float) -> list[tuple[Req, float]]:
        """``req`` left; start what waited for room (FIFO, skipping requests whose adapter
        cannot get a slot, as vLLM's scheduler does). Returns (request, leaves at)."""
        if self.running.pop(req.id, None) is None:
            return []
        if req.all_token and self.role != "decode":
            self.all_running -= 1
            self.all_adapters[req.sha] -= 1
            if self.all_adapters[req.sha] <= 0:
                del self.all_adapters[req.sha]
        started: list[tuple[Req, float]] = []
        still: deque[Req] = deque()
        while self.waiting:
            nxt = self.waiting.popleft()
            if len(self.running) >= self.profile.max_num_seqs:
                still.append(nxt)
                still.extend(self.waiting)
                self.waiting.clear()
            elif self.blocked(nxt):
                still.append(nxt)
            else:
                started.append((nxt, self._start(nxt, t)))
        self.waiting = still
        return started

    def kill(self) -> list[Req]:
        """The node is gone: every request on it fails."""
        self.alive = self.accepting = False
        lost = [*self.running.values(), *self.waiting]
        self.running.clear()
        self.waiting.clear()
        self.all_adapters.clear()
        self.all_running = 0
        return lost
