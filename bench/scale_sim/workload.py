"""Who sends what, when: tenants of very different sizes, users with Zipf popularity bound to
their tenant's adapters, multi-turn conversations, a diurnal swing. All drawn with numpy up
front (vectorised), so the event loop only routes and serves.

* Tenants: shares of users and adapters fall as ``1 / rank**1.2`` (a few giants, a long tail).
* Users: each is bound to one adapter of its tenant (uniformly among them); how often a user
  talks follows Zipf(``s``) over a random order of all users, independent of tenant.
* Conversations: a session is 1 + Geometric turns (mean ``turns``) ``think_s`` apart
  (exponential); turn k's prompt is the system prompt, every earlier message and answer, and
  the new message (no prefix-cache credit: each prompt is prefilled whole).
* Mixed adapter modes: ``all_fraction`` of tenants serve all-token adapters, the rest PreFT.
* Diurnal swing: the session rate is ``rps * (1 + swing * sin(2 pi t / day_s))``, a day
  compressed into the simulated window (caches see the rate change, not a day of requests).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from preft_serve.adapters.format import AdapterMode, AdapterType
from preft_serve.common.registry_client import AdapterRef


@dataclass(frozen=True)
class Shape:
    """Request shape: token counts of prompts and answers."""

    system_tokens: int = 150
    message_p50: float = 60.0  # a new user message, lognormal
    message_sigma: float = 0.7
    output_min: int = 16
    output_max: int = 256
    max_prompt: int = 2048
    turns: float = 3.0  # mean turns per conversation
    think_s: float = 15.0  # mean pause between turns
    stream_fraction: float = 0.5


@dataclass
class Population:
    """Tenants, adapters and users; adapter versions change on a hot swap."""

    n_users: int
    n_adapters: int
    n_tenants: int
    zipf_s: float
    seed: int
    all_fraction: float = 0.2
    tenant_exponent: float = 1.2
    one_to_one: bool = False  # user i bound to adapter i (the load test's plan)
    user_tenant: np.ndarray = field(init=False)
    user_adapter: np.ndarray = field(init=False)
    user_weight: np.ndarray = field(init=False)
    adapter_tenant: np.ndarray = field(init=False)
    adapter_all: np.ndarray = field(init=False)
    version: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        rng = np.random.default_rng([self.seed, 1])
        share = 1.0 / np.arange(1, self.n_tenants + 1) ** self.tenant_exponent
        share /= share.sum()
        per_tenant = np.maximum(1, np.floor(share * self.n_adapters)).astype(np.int64)
        per_tenant[0] += self.n_adapters - per_tenant.sum()  # exact total, the largest absorbs
        self.adapter_tenant = np.repeat(np.arange(self.n_tenants), per_tenant)
        first = np.concatenate([[0], np.cumsum(per_tenant)[:-1]])
        self.user_tenant = rng.choice(self.n_tenants, size=self.n_users, p=share)
        pick = rng.random(self.n_users)
        self.user_adapter = first[self.user_tenant] + (pick * per_tenant[self.user_tenant]).astype(
            np.int64
        )
        if self.one_to_one:
            self.user_adapter = np.arange(self.n_users) % self.n_adapters
            self.user_tenant = self.adapter_tenant[self.user_adapter]
        ranks = rng.permutation(self.n_users) + 1
        weight = 1.0 / ranks.astype(np.float64) ** self.zipf_s
        self.user_weight = weight / weight.sum()
        all_tenants = rng.random(self.n_tenants) < self.all_fraction
        all_tenants[0] = False  # the largest tenant is PreFT: the mix stays near the fraction
        self.adapter_all = all_tenants[self.adapter_tenant]
        self.version = np.ones(self.n_adapters, dtype=np.int64)
        self._refs: dict[tuple[int, int], AdapterRef] = {}

    def add_tenant(self, users: int, adapters: int, all_token: bool = False) -> int:
        """A new tenant with ``users`` users spread over ``adapters`` new adapters (a cold
        storm's onboarding tenant); returns its index. New users carry no popularity weight:
        their traffic is generated apart."""
        tenant = self.n_tenants
        self.n_tenants += 1
        first = self.n_adapters
        self.n_adapters += adapters
        self.adapter_tenant = np.concatenate([self.adapter_tenant, np.full(adapters, tenant)])
        self.adapter_all = np.concatenate([self.adapter_all, np.full(adapters, all_token)])
        self.version = np.concatenate([self.version, np.ones(adapters, dtype=np.int64)])
        self.user_tenant = np.concatenate([self.user_tenant, np.full(users, tenant)])
        self.user_adapter = np.concatenate([self.user_adapter, first + np.arange(users) % adapters])
        self.user_weight = np.concatenate([self.user_weight, np.zeros(users)])
        self.n_users += users
        return tenant

    def sha(self, adapter: int) -> str:
        """The adapter's current content hash (its identity and routing key)."""
        return self.ref(adapter).sha256

    def ref(self, adapter: int) -> AdapterRef:
        """What the registry would answer for the adapter's current version."""
        key = (adapter, int(self.version[adapter]))
        ref = self._refs.get(key)
        if ref is None:
            sha = hashlib.sha256(f"{self.seed}:{adapter}:{key[1]}".encode()).hexdigest()
            mode = AdapterMode.ALL if self.adapter_all[adapter] else AdapterMode.PREFILL
            ref = AdapterRef(
                f"t{self.adapter_tenant[adapter]}",
                f"a{adapter}",
                key[1],
                sha,
                AdapterType.LORA,
                mode,
                16,
                "base",
            )
            self._refs[key] = ref
        return ref

    def adapter_weight(self) -> np.ndarray:
        """Each adapter's share of the traffic (the sum of its users' weights)."""
        return np.bincount(self.user_adapter, weights=self.user_weight, minlength=self.n_adapters)


@dataclass
class Requests:
    """Requests sorted by arrival time, one array per field."""

    t: np.ndarray
    user: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    stream: np.ndarray

    def __len__(self) -> int:
        return len(self.t)

    @staticmethod
    def merge(parts: list[Requests]) -> Requests:
        cat = {
            f: np.concatenate([getattr(p, f) for p in parts])
            for f in ("t", "user", "prompt", "output", "stream")
        }
        order = np.argsort(cat["t"], kind="stable")
        return Requests(**{f: v[order] for f, v in cat.items()})


def rate_at(t: np.ndarray, rps: float, swing: float, day_s: float) -> np.ndarray:
    return rps * (1.0 + swing * np.sin(2 * np.pi * t / day_s)) if swing else np.full_like(t, rps)


def conversations(
    rng: np.random.Generator, users: np.ndarray, starts: np.ndarray, shape: Shape, end_s: float
) -> Requests:
    """Every turn of conversations by ``users`` starting at ``starts`` (turns after
    ``end_s`` are dropped)."""
    n = len(users)
    turns = rng.geometric(1.0 / shape.turns, size=n)
    total = int(turns.sum())
    session = np.repeat(np.arange(n), turns)
    index = np.arange(total) - np.repeat(np.cumsum(turns) - turns, turns)
    gaps = rng.exponential(shape.think_s, size=total)
    gaps[index == 0] = 0.0
    # Each turn starts a think time after the previous turn's start.
    cum = np.cumsum(gaps)
    base = np.repeat(cum[np.cumsum(turns) - turns], turns)
    t = starts[session] + (cum - base)
    message = np.maximum(
        4, rng.lognormal(np.log(shape.message_p50), shape.message_sigma, size=total)
    ).astype(np.int64)
    output = rng.integers(shape.output_min, shape.output_max + 1, size=total)
    # Prompt of turn k: system + all earlier messages and answers + this message.
    said = message + output
    said_cum = np.cumsum(said)
    before = said_cum - said - np.repeat((said_cum - said)[np.cumsum(turns) - turns], turns)
    prompt = np.minimum(shape.system_tokens + before + message, shape.max_prompt)
    stream = rng.random(total) < shape.stream_fraction
    keep = t < end_s
    return Requests(t[keep], users[session][keep], prompt[keep], output[keep], stream[keep])


def open_loop(
    pop: Population,
    rng: np.random.Generator,
    rps: float,
    start_s: float,
    end_s: float,
    shape: Shape,
    swing: float = 0.0,
    day_s: float = 0.0,
    users: np.ndarray | None = None,
    lead_s: float = 0.0,
) -> Requests:
    """Conversations arriving as a (diurnally modulated) Poisson process at ``rps`` requests
    a second on average, users drawn by popularity (``users``: only among these).
    ``lead_s``: conversations also start that long before ``start_s`` (only their turns
    from ``start_s`` on are kept), so the rate is steady from the start."""
    session_rate = rps / shape.turns
    peak = session_rate * (1.0 + abs(swing))
    first = start_s - lead_s
    n = rng.poisson(peak * (end_s - first))
    starts = np.sort(rng.uniform(first, end_s, size=n))
    if swing:
        keep = rng.random(n) * peak < rate_at(starts - start_s, session_rate, swing, day_s)
        starts = starts[keep]
    if users is None:
        who = rng.choice(pop.n_users, size=len(starts), p=pop.user_weight)
    else:
        weight = pop.user_weight[users]
        weight = weight / weight.sum() if weight.sum() > 0 else None
        who = users[rng.choice(len(users), size=len(starts), p=weight)]
    out = conversations(rng, who, starts, shape, end_s)
    keep = out.t >= start_s
    return Requests(
        out.t[keep], out.user[keep], out.prompt[keep], out.output[keep], out.stream[keep]
    )
