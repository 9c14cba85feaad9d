"""One simulated worker: adapter tiers (``tiers.py``) and an engine whose step time is
modelled, not run.

The engine steps as vLLM's scheduler does (``SimWorker._plan``), one step after another
while it has work: a step schedules the running requests first (a decode 1 token, a prompt
being prefilled its next chunk), then admits waiting requests in order while its token
budget (``max_num_batched_tokens``; a prompt longer than what is left is chunked) and
``max_num_seqs`` allow, skipping one whose adapter is not yet parsed (the parse gate holds
it while the adapter is fetched and parsed in the background, never the step) or whose
adapter would make one distinct adapter too many (``max_loras``: the adapters of the prompts
in the step and of running all-token requests, which hold theirs for their whole life). The
step that completes a prompt gives its first token; one token a step follows. A step costs
``step_base_s + token_s * tokens`` (its prompt tokens, one per decode, an all-token decode
``all_token_decode_factor``) plus ``slot_copy_s`` per adapter moved into a slot. So a backlog
drains over several steps, each as long as the prompts in it. A worker given ``pauses``
(``model.Pauses``) makes no engine progress in them: a step under way at a pause ends that
much later (its fetch and parse threads go on).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter, deque
from dataclasses import dataclass

import numpy as np

from bench.scale_sim.model import Profile, WorkerConfig
from bench.scale_sim.tiers import DiskTier, LruTier, Reported

MULTIPART_CHUNK = 8 * (1 << 20)  # boto3's download_file: ranged GETs of 8 MiB above 8 MiB
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
    key: str = ""  # the routing key select_target gave (the adapter's sha)
    cold_tenant: str = ""  # the tenant whose cold-load slot the request holds
    worker: str = ""
    route: str = ""
    tier: str = ""
    first: float = math.nan  # first token (TTFT = first - t0)
    done: float = math.nan
    state: str = "new"  # new, waiting, running, decoding, done, failed
    error: str = ""
    two_pools: bool = False
    decode_worker: str = ""
    ready: float = 0.0  # on its worker: when its adapter can run (the parse gate's hold)
    computed: int = 0  # prompt tokens computed (chunked prefill)
    left: int = 0  # tokens still to produce
    fetched: float = 0.0  # on its worker: when its adapter is on disk (the resolver's hold)
    retries: int = 0  # the client's retries of a 429 or 503


def s3_gets(size: int) -> int:
    """GETs of one ``ObjectStore.fetch_adapter``: the config, then the weights file."""
    return 1 + max(1, math.ceil(size / MULTIPART_CHUNK)) if size > MULTIPART_CHUNK else 2


class SimWorker:
    """A worker pod: ``role`` unified (adapters, prefill and decode), prefill (adapters,
    first token only) or decode (no adapters)."""

    def __init__(
        self,
        url: str,
        profile: Profile,
        config: WorkerConfig,
        rng: np.random.Generator,
        born: float,
        role: str = "unified",
        pauses: tuple[tuple[float, float], ...] = (),
    ) -> None:
        self.url, self.profile, self.config, self.rng, self.role = (url, profile, config, rng, role)
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
        self.loading: dict[str, float] = {}  # sha -> parsed at, until its first step
        self.fetched: dict[str, float] = {}  # sha -> on disk at, for a fetch not yet scheduled
        self.max_seqs = config.max_num_seqs or profile.max_num_seqs
        self.max_batched_tokens = config.max_num_batched_tokens or profile.max_num_batched_tokens
        # the step under way: (request, prompt tokens: 0 for a decode) scheduled in it, begun
        # at span_start, step_len seconds of engine time, span identical steps; busy_until
        # when it ends (None: no step under way); gen numbers the latest wake-up
        self.batch: list[tuple[Req, int]] = []
        self.span, self.span_start, self.step_len = 0, born, 0.0
        self.busy_until: float | None = None
        self.gen = 0
        self.fetches: list[float] = []  # times of object-store fetches
        self.parses = 0
        self.served = 0
        self.s3_gets = 0
        self.s3_bytes = 0
        self.gets_per_fetch = s3_gets(profile.adapter_bytes)

    # -- adapters ------------------------------------------------------------------------

    def load(self, sha: str, t: float) -> tuple[str, float, float]:
        """The API server's lookup when a request arrives: where the adapter was found, when
        it is on disk and when it is parsed (the parse gate's hold). Slots and host memory
        are only read here: vLLM moves an adapter through them when the request is
        scheduled (:meth:`_schedule`); a new one is parsed ahead, off the engine loop, and
        waits for that step (``AdapterPreloader``)."""
        self.reported.add(sha)
        if sha in self.slots or sha in self.host:
            self.disk.note_use(sha)  # the resolver's on_use hook
            return ("slot" if sha in self.slots else "host"), t, t
        pending = self.loading.get(sha)
        if pending is not None:  # parsing, or parsed and waiting for its first step
            fetched = self.fetched.get(sha, t)
            return ("inflight", fetched, pending) if pending > t else ("host", t, t)
        if self.disk.note_use(sha):
            tier, available = "disk", t
        else:
            tier = "store"
            k = min(range(len(self.fetch_free)), key=self.fetch_free.__getitem__)
            start = max(t, self.fetch_free[k])
            available = start + self.profile.fetch_s.draw(self.rng)
            self.fetch_free[k] = available
            self.fetched[sha] = available
            self.disk.insert(sha, self.profile.adapter_bytes)
            self.fetches.append(available)
            self.s3_gets += self.gets_per_fetch
            self.s3_bytes += self.profile.adapter_bytes
        k = min(range(len(self.parse_free)), key=self.parse_free.__getitem__)
        ready = max(available, self.parse_free[k]) + self.profile.parse_s.draw(self.rng)
        self.parse_free[k] = ready
        self.parses += 1
        self.loading[sha] = ready
        return tier, available, ready

    def _schedule(self, shas: dict[str, None]) -> tuple[int, int]:
        """The adapters of a step, as vLLM's model runner activates them: each is used in
        host memory (``LRUCacheWorkerLoRAManager.add_adapter``: a hit is most recent, a miss
        is inserted, evicting the least recent) and in a slot (``LRUCacheLoRAModelManager``).
        Returns the slot copies and the adapters parsed inside the step (evicted from host
        memory since their request arrived, none parsed ahead: stock vLLM parses them in
        the step)."""
        copies = reparsed = 0
        for sha in shas:
            if sha not in self.slots:
                copies += 1
            if sha not in self.host and self.loading.pop(sha, None) is None:
                reparsed += 1
                self.parses += 1
            self.loading.pop(sha, None)
            self.fetched.pop(sha, None)
            self.host.add(sha)
            self.slots.add(sha)
        return copies, reparsed

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

    def arrive(self, req: Req, t: float) -> float | None:
        """``req`` reaches the engine at ``t`` (its adapter is looked up now: the API server
        resolves it, the parse gate holds it until parsed) and waits for a step boundary.
        Returns when this worker next needs :meth:`step_done` (a new wake-up, which
        supersedes any earlier one: see ``gen``), or None when the one pending stands."""
        req.worker = req.worker or self.url
        self.served += 1
        if self.role == "decode":  # the KV arrived: one token a step from the second on
            req.computed, req.left, req.ready = req.prompt, max(1, req.output - 1), t
        else:
            req.tier, req.fetched, ready = self.load(req.sha, t)
            req.ready, req.computed, req.left = max(ready, t), 0, req.output
        req.state = "waiting"
        self.waiting.append(req)
        if self.busy_until is None:  # idle (or only gated requests waiting): step now
            return self._plan(t)
        if self.span > 1:  # decode-only steps fast-forwarded: stop after the one under way
            lo, hi = 0, self.span - 1  # steps done by t: the largest j with end(j) <= t
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self.after(self.span_start, mid * self.step_len) <= t:
                    lo = mid
                else:
                    hi = mid - 1
            self.span = lo + 1
            self.busy_until = self.after(self.span_start, self.span * self.step_len)
            self.gen += 1
            return self.busy_until
        return None

    def step_done(self, t: float) -> tuple[list[Req], float | None]:
        """The step (or run of identical decode steps) under way ends at ``t``: prompt
        chunks are computed, tokens produced; the requests that left, and the next
        wake-up (the next step is planned at once)."""
        left: list[Req] = []
        if self.busy_until is not None:
            k = self.span
            for req, chunk in self.batch:
                if req.id not in self.running:
                    continue
                if chunk:  # a prompt chunk
                    req.computed += chunk
                    if req.computed < req.prompt:
                        continue
                    req.first = t  # the step that completes the prompt samples a token
                    req.left -= 1
                    if self.role == "prefill" and not req.all_token:
                        req.left = 0
                else:
                    req.left -= k
                if req.left <= 0:
                    self._remove(req)
                    left.append(req)
        self.busy_until = None
        return left, self._plan(t)

    def _remove(self, req: Req) -> None:
        del self.running[req.id]
        if req.all_token and self.role != "decode":
            self.all_running -= 1
            self.all_adapters[req.sha] -= 1
            if self.all_adapters[req.sha] <= 0:
                del self.all_adapters[req.sha]

    def _plan(self, t: float) -> float | None:
        """vLLM's ``Scheduler.schedule`` at ``t``: the running requests first (a decode
        takes 1 token, a prompt being prefilled its next chunk), then the waiting ones in
        order while the token budget (``max_num_batched_tokens``, chunked prefill) lasts
        and ``max_num_seqs`` allows, skipping a request whose adapter is not yet parsed
        (the parse gate) or would be one distinct adapter too many (``max_loras``: the
        adapters of the prompts in the step and of running all-token requests; PreftScheduler
        frees a PreFT adapter once its prompt is computed). The step costs ``step_base_s +
        token_s x`` its tokens (an all-token decode counting ``all_token_decode_factor``)
        plus ``slot_copy_s`` per adapter moved into a slot, pauses skipped. While nothing
        waits and nothing is prefilled, identical decode steps run up to the next request
        to finish as one span."""
        self.gen += 1
        p, cfg = self.profile, self.config
        budget = self.max_batched_tokens
        loras: dict[str, None] = {}  # in order (a set's order would vary by run)
        batch: list[tuple[Req, int]] = []
        tokens = 0.0
        prefill = False
        for req in self.running.values():
            if budget <= 0:
                break
            if req.computed < req.prompt:
                chunk = min(req.prompt - req.computed, budget)
                budget -= chunk
                tokens += chunk
                batch.append((req, chunk))
                loras[req.sha] = None
                prefill = True
            else:
                budget -= 1
                tokens += p.all_token_decode_factor if req.all_token else 1.0
                batch.append((req, 0))
                if req.all_token and self.role != "decode":
                    loras[req.sha] = None
        skipped: deque[Req] = deque()
        while self.waiting and budget > 0 and len(self.running) < self.max_seqs:
            req = self.waiting.popleft()
            adapter = self.role != "decode"
            if req.ready > t or (adapter and req.sha not in loras and len(loras) >= cfg.max_loras):
                skipped.append(req)
                continue
            self.running[req.id] = req
            if adapter:
                loras[req.sha] = None
                if req.all_token:
                    self.all_adapters[req.sha] += 1
                    self.all_running += 1
            if req.computed < req.prompt:
                chunk = min(req.prompt - req.computed, budget)
                req.state = "running"
                prefill = True
            else:
                chunk = 0
                req.state = "decoding"
            budget -= max(chunk, 1)
            tokens += chunk or (p.all_token_decode_factor if req.all_token else 1.0)
            batch.append((req, chunk))
        skipped.extend(self.waiting)
        self.waiting = skipped
        if not batch:
            self.batch, self.span = [], 0
            gated = [r.ready for r in self.waiting if r.ready > t]
            return min(gated) if gated else None  # a timer: no step runs until then
        copies, reparsed = self._schedule(loras) if self.role != "decode" else (0, 0)
        self.step_len = (
            p.step_base_s
            + p.token_s * tokens
            + p.slot_copy_s * copies
            + sum(p.parse_s.draw(self.rng) for _ in range(reparsed))
        )
        self.span = 1 if prefill or self.waiting else min(r.left for r, _ in batch)
        self.span_start, self.batch = t, batch
        self.busy_until = self.after(t, self.span * self.step_len)
        return self.busy_until

    def kill(self) -> list[Req]:
        """The node is gone: every request on it fails."""
        self.alive = self.accepting = False
        lost = [*self.running.values(), *self.waiting]
        self.running.clear()
        self.waiting.clear()
        self.all_adapters.clear()
        self.all_running = 0
        self.batch, self.span, self.busy_until = [], 0, None
        self.gen += 1
        return lost
