"""Which worker serves a request: rendezvous hashing with a bounded-load cap.

Rendezvous (highest-random-weight) hashing on the adapter's sha gives each adapter a stable
preference order over the workers, so one adapter's requests land on the worker that already
has it loaded (affinity), and adding or removing a worker only moves the adapters whose top
choice changed. A hot adapter must not melt its favourite worker, so the gateway counts its
in-flight requests per worker and skips a worker whose count is at the cap
``ceil(avg * load_factor) + 1`` (avg = in-flight per worker, this request included); taking
the next worker in the adapter's order is a "spill". With several gateway replicas each one
sees only its share of the traffic, so its cap (a few requests) lets every gateway fill a
hot worker to it at once; with ``worker_load`` (the default setting) the pool adds what the
other gateways hold on each worker (the worker's own running + waiting count at the last
load poll, every ``load_poll_interval_s``, less this gateway's in flight then) and the cap
is computed on the cluster's load, without the ``+ 1`` that kept a tiny share from
spilling. That is Mirrokni, Thorup and Zadimoghaddam's consistent hashing with bounded
loads (SODA 2018), whose cap assumes every router sees the same, current loads: the
workers' own gauges are that shared view, as fresh as the poll. Workers report which adapters they
have loaded (``/v1/models``, polled by ``gateway.pool_monitor``); among the workers under the cap
one that already has the adapter wins, so a spilled or re-homed adapter is not loaded twice.
When none of those has it, a worker that has it may go ``resident_slack`` (1) requests past
the cap before the request spills to one that must fetch it: a spill costs the worker it
lands on a store fetch and a parse, one more queued request costs the warm worker a share
of a step. Only where the cap's own headroom holds that much (``cap x (load_factor - 1)``
>= the slack): where the cap is two or three requests, one more is a third or half of a
worker's share; except for a two-pool gateway's prefill hops, short requests that keep the
adapter pool's caps that small while a spill of one still costs a store fetch. In the
simulated cluster (docs/scale.md) nearly every store fetch at Zipf 0.8 was such a spill,
its adapter warm on a favourite at the cap or one over it.
Workers failing health checks get no new requests until they pass again.

One adapter can take more of the traffic than one worker should carry (Zipf-distributed
users put several percent on the hottest). With ``hot_replicas`` > 1 the pool measures each
key's share of its requests (:class:`~preft_serve.gateway.hot_keys.HotKeys`) and gives a key
with share ``s`` the first ``k = ceil(s x workers / hot_headroom)`` workers of its
rendezvous order (at most ``hot_replicas``): a worker at the mean carries ``1 / workers`` of
the traffic, so no replica takes more than ``hot_headroom`` of a mean worker's load from
the key. A threshold well under the cap's own headroom (``load_factor - 1``, the default
when none is given) keeps a hot key from filling a worker to the cap by itself, so the
cap rarely has to spill it. The request goes to the least loaded replica under the cap
(resident ones first). ``k`` follows from the share, which every gateway replica measures
alike on its random sample of users, so all of them spread the key over the same ``k``
workers, which keep it loaded; a key under the threshold has ``k = 1`` and routes as above.
Replicas are a prefix of the rendezvous order, so a membership change moves no more keys.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from preft_serve.common.errors import ServiceUnavailable
from preft_serve.gateway import tenant_budgets
from preft_serve.gateway.classic_slots import ClassicRequest, ClassicSlots
from preft_serve.gateway.hot_keys import HotKeys
from preft_serve.gateway.settings import GatewaySettings

MIN_HEADROOM = 0.05  # the replica target when load_factor leaves (almost) none
RESIDENT_SLACK = 1  # requests over the cap a worker with the key resident may take


def rendezvous_order(key: str, workers: Sequence[str]) -> list[str]:
    """Workers sorted by descending hash(key, worker): stable for a key, uniform over keys."""

    def weight(worker: str) -> bytes:
        return hashlib.blake2b(f"{key}\0{worker}".encode(), digest_size=8).digest()

    return sorted(workers, key=weight, reverse=True)


@functools.lru_cache(maxsize=16384)
def _cached_order(key: str, workers: tuple[str, ...]) -> tuple[str, ...]:
    """:func:`rendezvous_order` once per key and membership: it hashes every worker (~1 us
    each), per request otherwise. Keys are adapter shas, so the cache holds the hot set."""
    return tuple(rendezvous_order(key, workers))


class RouteResult(str, enum.Enum):
    """Why a request went where it went (the ``result`` label of the routing metric)."""

    RESIDENT = "resident"  # the worker reported the adapter loaded: an affinity hit
    PREFERRED = "preferred"  # the adapter's rendezvous favourite, not (yet) reported loaded
    REPLICA = "replica"  # a hot adapter's other replica, not (yet) reported loaded
    SPILL = "spill"  # neither: the load cap or health sent it elsewhere (likely a cold load)


@dataclass(frozen=True)
class Choice:
    """The order to try workers in, and why the first one was picked."""

    order: list[str]
    preferred: str  # the key's rendezvous top choice among healthy workers
    result: RouteResult
    classic: ClassicRequest | None = None  # counted per worker while open (classic_slots)

    @property
    def spilled(self) -> bool:
        return self.result is RouteResult.SPILL

    @property
    def cold(self) -> bool:
        """The first worker has not reported the key loaded: it will fetch it first."""
        return self.result is not RouteResult.RESIDENT

    def landed(self, worker: str) -> RouteResult:
        """The result of the request once it reached ``worker`` of :attr:`order`: the
        choice's own, or a spill when an earlier worker could not be reached."""
        return self.result if worker == self.order[0] else RouteResult.SPILL


@dataclass
class WorkerStatus:
    """What the gateway knows about one worker."""

    inflight: int = 0  # this gateway's open requests on the worker
    failures: int = 0  # consecutive failed health checks / connection attempts
    resident: frozenset[str] = frozenset()  # adapter shas the worker reported loaded
    others: int = 0  # other gateways' requests on it, as of the last poll (worker_load)

    @property
    def load(self) -> int:
        """What the cap is held against: this gateway's requests now plus the others'."""
        return self.inflight + self.others


class WorkerPool:
    """The current workers with in-flight counts, health and residency (one event loop).

    Membership changes come from discovery (``set_workers``); a worker removed while
    requests are in flight keeps its status aside until they are released, so a worker
    that comes back meanwhile (a readiness flap) counts them again instead of starting
    from zero and going negative when they end.
    """

    def __init__(
        self,
        workers: Sequence[str] = (),
        load_factor: float = 1.25,
        unhealthy_after: int = 2,
        max_open: int | None = None,
        worker_load: bool = False,
        hot_replicas: int = 1,
        hot_window: int = 4096,
        hot_headroom: float | None = None,
        tenant_cold_loads: int = 0,
        tenant_open: int = 0,
        resident_slack: int = RESIDENT_SLACK,
        tenant_classic_adapters: int = 0,
    ) -> None:
        """``max_open``: most requests open to workers at once (None: no limit); more are
        refused with a 503 rather than queued for a connection. ``worker_load``: the cap
        counts the workers' own load (``set_worker_load``), not this gateway's alone.
        ``hot_replicas``: most workers one hot key is spread over (1: none); shares are
        measured over about the last ``hot_window`` requests; ``hot_headroom``: the share of
        a mean worker's load one hot key may put on each replica (None: the cap's headroom,
        ``load_factor - 1``); ``tenant_cold_loads``: most cold requests one tenant has
        open, ``tenant_open`` most requests one tenant has open to workers
        (:mod:`~preft_serve.gateway.tenant_budgets`; 0: no limit);
        ``tenant_classic_adapters``: most classic adapters one tenant has requests open to
        on one worker (:mod:`~preft_serve.gateway.classic_slots`; 0: no limit);
        ``resident_slack``: requests past the cap a worker with the key resident may take
        before the request spills to a worker without it, where the cap's headroom holds
        it (at any cap for a prefill hop: :meth:`choose`)."""
        self.hot_headroom = hot_headroom
        self.resident_slack = resident_slack
        self.cold = tenant_budgets.cold_loads(tenant_cold_loads)
        self.tenant_open = tenant_budgets.open_requests(tenant_open)
        self.classic = ClassicSlots(tenant_classic_adapters)
        self.load_factor = load_factor
        self.hot_replicas = hot_replicas
        self.hot = HotKeys(hot_window) if hot_replicas > 1 else None
        self._turn = 0  # rotates ties among a hot key's replicas
        self.worker_load = worker_load
        self.unhealthy_after = unhealthy_after
        self.max_open = max_open
        self.status: dict[str, WorkerStatus] = {}
        self._retired: dict[str, WorkerStatus] = {}  # removed, with requests in flight
        self.set_workers(workers)

    @property
    def workers(self) -> list[str]:
        return list(self.status)

    @property
    def inflight(self) -> dict[str, int]:
        return {url: s.inflight for url, s in self.status.items()}

    def set_workers(self, workers: Sequence[str]) -> tuple[list[str], list[str]]:
        """Replace the membership; returns (added, removed). Known workers keep their state."""
        wanted = list(dict.fromkeys(workers))
        added = [w for w in wanted if w not in self.status]
        removed = [w for w in self.status if w not in wanted]
        old = self.status
        self.status = {
            w: old.get(w) or self._retired.pop(w, None) or WorkerStatus() for w in wanted
        }
        self._retired.update((w, old[w]) for w in removed if old[w].inflight > 0)
        return added, removed

    def is_healthy(self, worker: str) -> bool:
        status = self.status.get(worker)
        return status is not None and status.failures < self.unhealthy_after

    def healthy(self) -> list[str]:
        """Workers in service; when every worker looks down, all of them (trying beats 503)."""
        return [w for w in self.status if self.is_healthy(w)] or self.workers

    def cap(self, candidates: Sequence[str] | None = None) -> int:
        """Most requests one worker may hold (``WorkerStatus.load``) before new ones spill.
        The ``+ 1`` lets a gateway that sees only a few requests keep them on their
        favourites; on the cluster's load (``worker_load``) the average is large enough."""
        candidates = self.healthy() if candidates is None else candidates
        total = sum(self.status[w].load for w in candidates)
        slack = 0 if self.worker_load else 1
        return math.ceil((total + 1) / len(candidates) * self.load_factor) + slack

    def choose(
        self, key: str, prefill_hop: bool = False, classic: ClassicRequest | None = None
    ) -> Choice:
        """The first healthy worker under the cap, preferring ones that have ``key``
        resident, in the key's rendezvous order (failing those, one with ``key`` resident
        under ``cap + resident_slack``, the slack at most ``cap x (load_factor - 1)``, or
        whole for a ``prefill_hop``: a two-pool gateway's short first hop, which keeps the
        caps small while its spill costs a whole store fetch); then the rest as retry
        fallbacks. A ``classic`` adapter's request leaves out the workers where its tenant
        holds as many other classic adapters as it may (429 when that is every worker)."""
        if not self.status:
            raise ServiceUnavailable(
                "no worker is registered yet (discovery found none); retry shortly"
            )
        if self.max_open is not None and self.open_requests() >= self.max_open:
            # Rather than wait in the connection pool, where a timeout would read as the
            # worker failing to connect (retried elsewhere, and counted against its health).
            raise ServiceUnavailable(
                f"this gateway has {self.max_open} requests open to "
                "workers, its most; retry shortly"
            )
        healthy = self.healthy()
        up = set(healthy)
        ranked = _cached_order(key, tuple(self.status))  # filtering keeps its order
        favourite = next(w for w in ranked if w in up)
        if classic is not None and self.classic.limit:
            ranked = tuple(w for w in ranked if not self.classic.full(w, classic))
            if not any(w in up for w in ranked):  # a worker that looks down is no way out
                raise self.classic.refusal()
        order = [w for w in ranked if w in up]
        cap = self.cap(healthy)
        down = [w for w in ranked if w not in up]
        k = self.replicas(key, len(order))
        if k > 1 and (spread := [w for w in order[:k] if self.status[w].load < cap]):
            first = self._least_loaded(
                [w for w in spread if key in self.status[w].resident] or spread
            )
            if key in self.status[first].resident:
                result = RouteResult.RESIDENT
            else:
                result = RouteResult.PREFERRED if first == favourite else RouteResult.REPLICA
            return Choice(
                [first, *(w for w in order if w != first), *down], favourite, result, classic
            )
        under = [w for w in order if self.status[w].load < cap] or order
        slack = (
            self.resident_slack
            if prefill_hop
            else min(self.resident_slack, math.floor(cap * (self.load_factor - 1.0)))
        )
        warm = [w for w in under if key in self.status[w].resident] or [
            w for w in order if key in self.status[w].resident and self.status[w].load < cap + slack
        ]
        first = warm[0] if warm else under[0]
        if warm:
            result = RouteResult.RESIDENT
        else:
            result = RouteResult.PREFERRED if first == favourite else RouteResult.SPILL
        return Choice([first, *(w for w in order if w != first), *down], favourite, result, classic)

    def replicas(self, key: str, workers: int) -> int:
        """How many workers ``key`` is spread over (counting this request toward its
        share): ``ceil(share x workers / headroom)``, 1 to ``hot_replicas``."""
        if self.hot is None:
            return 1
        share = self.hot.add(key)
        headroom = (
            self.hot_headroom
            if self.hot_headroom is not None
            else max(self.load_factor - 1.0, MIN_HEADROOM)
        )
        wanted = math.ceil(share * workers / headroom - 1e-9)
        return max(1, min(wanted, self.hot_replicas, workers))

    def _least_loaded(self, workers: list[str]) -> str:
        """The least loaded of ``workers``, ties taken in turn (without the turn every
        gateway replica would break them toward the same worker)."""
        self._turn += 1
        start = self._turn % len(workers)
        rotated = workers[start:] + workers[:start]
        return min(rotated, key=lambda w: self.status[w].load)

    def open_requests(self) -> int:
        """Requests open to workers, those of workers discovery removed included."""
        return sum(s.inflight for s in self.status.values()) + sum(
            s.inflight for s in self._retired.values()
        )

    def acquire(self, worker: str, classic: ClassicRequest | None = None) -> None:
        if worker in self.status:
            self.status[worker].inflight += 1
        if classic is not None:
            self.classic.acquire(worker, classic)

    def release(self, worker: str, classic: ClassicRequest | None = None) -> None:
        if classic is not None:
            self.classic.release(worker, classic)
        status = self.status.get(worker)
        if status is not None:
            status.inflight -= 1
        elif (retired := self._retired.get(worker)) is not None:
            retired.inflight -= 1
            if retired.inflight <= 0:
                del self._retired[worker]

    def mark_ok(self, worker: str) -> None:
        if worker in self.status:
            self.status[worker].failures = 0

    def mark_failed(self, worker: str) -> None:
        if worker in self.status:
            self.status[worker].failures += 1

    def set_worker_load(self, worker: str, requests: int) -> None:
        """The worker's own count of running + waiting requests, all gateways' (read at a
        health poll); what exceeds this gateway's in-flight count now is the others'. Until
        the next poll this gateway's own count moves live and the others' stays as read."""
        if self.worker_load and (status := self.status.get(worker)) is not None:
            status.others = max(0, requests - status.inflight)

    def set_resident(self, worker: str, keys: frozenset[str]) -> None:
        if worker in self.status:
            self.status[worker].resident = keys

    @contextmanager
    def track(self, worker: str) -> Iterator[None]:
        """Count a request as in flight on ``worker`` for the duration of the block."""
        self.acquire(worker)
        try:
            yield
        finally:
            self.release(worker)


def pool_from_settings(
    settings: GatewaySettings,
    workers: Sequence[str] = (),
    *,
    decode: bool = False,
) -> WorkerPool:
    """The gateway's pool as its settings make it (the app and the scale simulator build
    theirs here, so neither can drift from the other). The decode pool is picked by load
    alone: no hot replicas, and its requests count toward the prefill pool's limit."""
    if decode:
        return WorkerPool(
            workers,
            load_factor=settings.load_factor,
            unhealthy_after=settings.unhealthy_after,
            worker_load=settings.cap_on_worker_load,
        )
    return WorkerPool(
        workers,
        load_factor=settings.load_factor,
        unhealthy_after=settings.unhealthy_after,
        max_open=settings.max_open_requests,
        worker_load=settings.cap_on_worker_load,
        hot_replicas=settings.hot_replicas,
        hot_headroom=settings.hot_headroom,
        tenant_cold_loads=settings.tenant_cold_loads,
        tenant_open=settings.tenant_open_share,
        tenant_classic_adapters=settings.tenant_classic_adapters_per_worker,
    )
