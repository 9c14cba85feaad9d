"""The soak's verdicts, computed from what the clients saw (no access to the services):
wrong answers, error accounting, recovery times, resource growth, the printed table and
the timeline plot. Pure functions over the soak's records, so they are unit-tested on
hand-made timelines (tests/bench/soak/test_soak_checks.py); :mod:`bench.soak.state`
reads the services' own state back.

Records are plain dicts (they go to the JSON as they are):

* request ``{"k": "chat", "t0", "t1", "tenant", "user", "status", "err", "shape_ok",
  "name", "version", "sha"}``: ``status`` 0 = no HTTP answer; ``err`` names a broken stream;
  ``name``/``version``/``sha`` come from the gateway's ``x-preft-adapter*`` headers.
* mutation ``{"k": "upload"|"swap"|"bind"|"delete", "t0", "t1", "tenant", "name",
  "status", ...}``: uploads and swaps add ``version`` (from the reply) and ``sha`` (computed
  here before sending); binds add ``user``.
* fault ``{"kind", "part", "start", "end", "recovered"}``: the fault lasts from ``start``
  to ``end`` (restart issued, or SIGCONT); ``recovered`` is the first success through the
  affected part after ``end`` (None: never).

Times are seconds since the soak started; seeded state (version 1 of every ``a*`` adapter,
the initial bindings) counts as acknowledged at ``-inf``.
"""

from __future__ import annotations

import argparse
import bisect
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.stats import percentile

if TYPE_CHECKING:
    from bench.soak.churn import Tenants
    from bench.soak.journal import Journal

Record = dict[str, Any]
KINDS = (
    "worker_kill",
    "registry_kill",
    "redis_kill",
    "s3_stop",
    "worker_stop",
    "trainer_kill",
    "registry_kill_registering",
)
"""The faults the soak injects; every kind must have happened and recovered."""
CHAOS_STATUSES = (502, 503)
# A worker as the gateway names it in its errors.
WORKER_URL = re.compile(r"http://[\w.-]+(?::[0-9]+)?")
FAULT_COLOURS = {
    "worker_kill": "#f4a6a6",
    "worker_stop": "#f8d5a0",
    "registry_kill": "#b7d7f2",
    "redis_kill": "#d4b8ec",
    "s3_stop": "#b9e4c4",
    "trainer_kill": "#e8e39a",
    "registry_kill_registering": "#9fc9c9",
}


def ok(status: int) -> bool:
    return 200 <= status < 300


def windows(faults: Sequence[Record], grace: float, end: float) -> list[tuple[float, float]]:
    """Each fault's chaos window: start - grace .. recovered + grace (end of run if never)."""
    out = []
    for f in faults:
        last = f["recovered"] if f.get("recovered") is not None else end
        out.append((f["start"] - grace, last + grace))
    return out


def inside(t0: float, t1: float, spans: Iterable[tuple[float, float]]) -> bool:
    """Whether the request [t0, t1] overlaps any span."""
    return any(t0 <= b and t1 >= a for a, b in spans)


# -- errors accounted for -----------------------------------------------------------------


def account_errors(
    records: Sequence[Record], faults: Sequence[Record], grace: float, end: float
) -> dict[str, Any]:
    """Every non-2xx must be a 429, a cancel that lost the race to its job's end (409
    ``job_not_cancellable``), or a 502/503 (a broken stream, or for registry calls no answer
    at all while the registry is down) inside a chaos window, with an error envelope.
    Returns counts by class and the offending records (at most 20)."""
    spans = windows(faults, grace, end)
    classes: Counter[str] = Counter()
    bad: list[Record] = []
    for r in records:
        status = r["status"]
        # A worker's failure is accounted for only by a fault on a worker it names: a
        # killed worker's minutes of restart must not cover errors of the healthy one
        # alone ("no worker is reachable" names every worker it tried).
        named = set(WORKER_URL.findall(r.get("msg") or ""))
        # Likewise "Redis unavailable" only by a fault on Redis.
        redis_error = "Redis" in (r.get("msg") or "")
        own = [
            w
            for f, w in zip(faults, spans, strict=True)
            if (not named or f.get("url") in named)
            and (not redis_error or f["kind"] == "redis_kill")
        ]
        if ok(status) and not r.get("err"):
            classes["ok"] += 1
            continue
        if status == 500:
            classes["http_500"] += 1
            bad.append(r)
        elif status == 429:
            classes["rate_limited_429"] += 1
            if not r.get("shape_ok"):
                classes["bad_error_body"] += 1
                bad.append(r)
        elif status == 409 and r.get("code") == "job_not_cancellable":
            classes["cancel_after_job_ended"] += 1  # the job ended while the cancel was sent
        elif inside(r["t0"], r["t1"], own) and (
            status in CHAOS_STATUSES or r.get("err") or (status == 0 and r["k"] != "chat")
        ):
            classes["chaos_window"] += 1
            if status in CHAOS_STATUSES and not r.get("shape_ok"):
                classes["bad_error_body"] += 1
                bad.append(r)
        else:
            key = f"unexpected_{status or r.get('err') or 'no_answer'}"
            classes[key] += 1
            bad.append(r)
    return {"classes": dict(classes), "unaccounted": len(bad), "examples": bad[:20]}


def error_shape_ok(body: Any) -> bool:
    """The error envelope both services use, OpenAI's:
    ``{"error": {"message": str, "type": str, "param": str | None, "code": str}}``."""
    if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
        return False
    error = body["error"]
    return (
        isinstance(error.get("message"), str)
        and isinstance(error.get("type"), str)
        and isinstance(error.get("code"), str)
        and "param" in error
    )


# -- no wrong answer -----------------------------------------------------------------------


class Truth:
    """What the registry acknowledged, and when, as the clients saw it."""

    def __init__(self, mutations: Sequence[Record], seeded: Sequence[Record]) -> None:
        # (tenant, name) -> sorted [(t1, version, sha)] of acknowledged versions
        self.versions: dict[tuple[int, str], list[tuple[float, int, str]]] = defaultdict(list)
        # (tenant, user) -> sorted [(t1, name)] of acknowledged bindings
        self.binds: dict[tuple[int, str], list[tuple[float, str]]] = defaultdict(list)
        # (tenant, user) -> every bind attempt not refused with a 4xx: (t0, t1, name)
        self.attempts: dict[tuple[int, str], list[tuple[float, float, str]]] = defaultdict(list)
        self.names: dict[int, set[str]] = defaultdict(set)  # every name a tenant tried
        self.shas: dict[int, set[str]] = defaultdict(set)  # every content a tenant sent
        for s in seeded:
            self.versions[(s["tenant"], s["name"])].append((-math.inf, 1, s["sha"]))
            self.binds[(s["tenant"], s["user"])].append((-math.inf, s["name"]))
            self.names[s["tenant"]].add(s["name"])
            self.shas[s["tenant"]].add(s["sha"])
        for m in sorted(mutations, key=lambda m: m["t1"]):
            tenant = m["tenant"]
            if m["k"] in ("upload", "swap"):
                self.names[tenant].add(m["name"])
                self.shas[tenant].add(m["sha"])
                if ok(m["status"]):
                    self.versions[(tenant, m["name"])].append((m["t1"], m["version"], m["sha"]))
            elif m["k"] == "bind":
                if ok(m["status"]):
                    self.binds[(tenant, m["user"])].append((m["t1"], m["name"]))
                if not 400 <= m["status"] < 500:
                    self.attempts[(tenant, m["user"])].append((m["t0"], m["t1"], m["name"]))

    def min_version(self, tenant: int, name: str, at: float) -> int:
        acked = self.versions.get((tenant, name), [])
        i = bisect.bisect_right([t for t, _, _ in acked], at)
        return max((v for _, v, _ in acked[:i]), default=0)

    def sha_of(self, tenant: int, name: str, version: int) -> str | None:
        return next((s for _, v, s in self.versions.get((tenant, name), []) if v == version), None)

    def allowed_names(self, tenant: int, user: str, at: float, until: float) -> set[str]:
        """The binding acknowledged last before ``at``, plus any bind in flight or sent
        later that may have landed before the answer (sent before ``until``)."""
        acked = self.binds.get((tenant, user), [])
        i = bisect.bisect_right([t for t, _ in acked], at)
        last_t, last_name = acked[i - 1] if i else (-math.inf, None)
        names = {last_name} if last_name else set()
        for t0, t1, name in self.attempts.get((tenant, user), []):
            if t0 < until and t1 > last_t:
                names.add(name)
        return names


def wrong_answers(requests: Sequence[Record], truth: Truth, grace: float) -> dict[str, Any]:
    """Answers served by another tenant's adapter, by content that is not the version the
    headers name, by a name the user was not bound to, or by a version older than one
    acknowledged ``grace`` seconds before the request was sent."""
    counts: Counter[str] = Counter()
    examples: list[Record] = []
    checked = 0
    for r in requests:
        if not ok(r["status"]) or r.get("err"):
            continue
        checked += 1
        tenant, name, version, sha = r["tenant"], r.get("name"), r.get("version"), r.get("sha")
        problem = None
        if name is None or version is None or sha is None:
            problem = "no_adapter_headers"
        elif name not in truth.names[tenant] or sha not in truth.shas[tenant]:
            problem = "other_tenant"
        elif (known := truth.sha_of(tenant, name, version)) is not None and known != sha:
            problem = "content_not_version"
        elif name not in truth.allowed_names(tenant, r["user"], r["t0"] - grace, r["t1"]):
            problem = "stale_binding"
        elif version < truth.min_version(tenant, name, r["t0"] - grace):
            problem = "stale_version"
        if problem:
            counts[problem] += 1
            if len(examples) < 20:
                examples.append(r)
    return {
        "checked": checked,
        "wrong": sum(counts.values()),
        "by_kind": dict(counts),
        "examples": examples,
    }


# -- recovery, resources -------------------------------------------------------------------


def recovery(faults: Sequence[Record]) -> dict[str, Any]:
    """Seconds from each fault's end to the first success through the affected part."""
    by_kind: dict[str, list[float | None]] = defaultdict(list)
    for f in faults:
        rec = f.get("recovered")
        by_kind[f["kind"]].append(None if rec is None else round(rec - f["end"], 2))
    return {
        kind: {
            "faults": len(xs),
            "recovered": sum(x is not None for x in xs),
            "max_s": max((x for x in xs if x is not None), default=None),
            "each_s": xs,
        }
        for kind, xs in sorted(by_kind.items())
    }


def resources(samples: Sequence[Record], faults: Sequence[Record] = ()) -> dict[str, Any]:
    """Per service: RSS and open FDs at the first and last sample, the peak, and whether
    it was restarted in between. Growth compares the process alive at the end with itself,
    from its first sample after its part last recovered from a fault (a restarted worker
    is still loading the model before that)."""
    out: dict[str, Any] = {}
    parts = {p for s in samples for p in s["parts"]}
    settled = {
        f["part"]: f["recovered"]
        for f in sorted(
            faults, key=lambda f: f["recovered"] if f.get("recovered") is not None else math.inf
        )
    }
    for part in sorted(parts):
        seen = [(s["t"], s["parts"][part]) for s in samples if part in s["parts"]]
        if not seen:
            continue
        first, last = seen[0][1], seen[-1][1]
        since = settled.get(part)
        since = -math.inf if since is None and part not in settled else since
        same = [
            v
            for t, v in seen
            if v["incarnation"] == last["incarnation"] and since is not None and t >= since
        ]
        out[part] = {
            "rss_mb_start": first["rss_mb"],
            "rss_mb_end": last["rss_mb"],
            "rss_mb_max": max(v["rss_mb"] for _, v in seen),
            "fds_start": first["fds"],
            "fds_end": last["fds"],
            "restarts": last["incarnation"] - first["incarnation"],
            # Growth of the process alive at the end, from its first sample to its last.
            "rss_growth_same_process": round(last["rss_mb"] / same[0]["rss_mb"], 2)
            if same and same[0]["rss_mb"]
            else None,
            "fds_growth_same_process": last["fds"] - same[0]["fds"] if same else None,
        }
    return out


# -- tenants bounded, clients that leave billed, no field ignored -------------------------

P99_RATIO, P99_SLACK_S = 3.0, 0.5
"""The honest tenants' latency p99 beside the hostile tenant may be at most 3x the calm
window's plus 0.5 s. Both windows are short (tens of seconds, a hundred or two answers), so
a p99 is close to the slowest answer, and this 2-core machine is shared with the hostile
client itself and with other work: one scheduler hiccup moves it by hundreds of ms. A
tenant that exhausts a shared resource (a connection pool, a worker's event loop) moves it
by seconds or to timeouts, far past the bound."""
REFUSALS = (413, 429)
BILL_LAG_S = 5.0
"""An aborted stream is billed after the worker's stream closes (and a prompt count), then
flushed within a second; a Redis fault in that time may drop the batch by design."""
TENANT_FAULT_PARTS = ("registry", "redis", "s3", "trainer")
"""Faults that may fail a files or fine-tuning call through the gateway (a worker's may not)."""


def p99_latency(
    requests: Sequence[Record], start: float, end: float
) -> tuple[float | None, int, int]:
    """p99 (nearest rank) of successful chat answers sent in [start, end), how many, and
    how many chat requests sent then were refused with a 429."""
    sent = [r for r in requests if r["k"] == "chat" and start <= r["t0"] < end]
    lat = [r["t1"] - r["t0"] for r in sent if ok(r["status"]) and not r.get("err")]
    return percentile(lat, 99), len(lat), sum(r["status"] == 429 for r in sent)


def isolation(
    requests: Sequence[Record], phases: dict[str, list[float]], min_answers: int = 20
) -> dict[str, Any]:
    """The honest tenants' chat p99 in the calm window against the window right after it,
    with the hostile tenant at work and no fault yet; beside it they may not be refused
    more often than without it (they have no limits of their own)."""
    calm, calm_n, calm_429 = p99_latency(requests, *phases["calm"])
    hostile, hostile_n, hostile_429 = p99_latency(requests, *phases["hostile_calm"])
    ratio = round(hostile / calm, 2) if calm and hostile is not None else None
    passed = (
        calm is not None
        and hostile is not None
        and min(calm_n, hostile_n) >= min_answers
        and hostile <= P99_RATIO * calm + P99_SLACK_S
        and hostile_429 <= calm_429
    )
    return {
        "p99_calm_s": None if calm is None else round(calm, 3),
        "answers_calm": calm_n,
        "p99_hostile_s": None if hostile is None else round(hostile, 3),
        "answers_hostile": hostile_n,
        "ratio": ratio,
        "refused_calm": calm_429,
        "refused_hostile": hostile_429,
        "pass": passed,
    }


def names_own_limit(r: Record, others: Iterable[str]) -> bool:
    """A refusal in the error envelope whose message states a limit (a number) and names
    no other tenant."""
    msg = r.get("msg") or ""
    return (
        bool(r.get("shape_ok"))
        and any(c.isdigit() for c in msg)
        and not any(o in msg for o in others)
    )


def hostile_refusals(records: Sequence[Record], others: Iterable[str]) -> dict[str, Any]:
    """Per kind of hostile call: statuses seen, refusals (429/413), refusals that name the
    hostile tenant's own limit, an example message. Passes when each kind was refused at
    least once, every refusal names its own limit, and nothing answered 500."""
    others = list(others)
    out: dict[str, Any] = {}
    for kind in sorted({r["k"] for r in records}):
        mine = [r for r in records if r["k"] == kind]
        refused = [r for r in mine if r["status"] in REFUSALS]
        named = [r for r in refused if names_own_limit(r, others)]
        out[kind] = {
            "calls": len(mine),
            "statuses": dict(Counter(str(r["status"] or r.get("err") or 0) for r in mine)),
            "refused": len(refused),
            "named_own_limit": len(named),
            "example": next((r.get("msg") for r in refused), None),
            "http_500": sum(r["status"] == 500 for r in mine),
        }
        out[kind]["pass"] = (
            bool(refused) and len(named) == len(refused) and out[kind]["http_500"] == 0
        )
    return out


def tenant_calls_beside_hostile(
    mutations: Sequence[Record],
    faults: Sequence[Record],
    hostile: list[float],
    grace: float,
    end: float,
) -> dict[str, Any]:
    """The honest tenant's files and fine-tuning calls through the gateway (``ft_*``) while
    the hostile tenant ran: none may be refused for load (429, 503) or get no answer,
    except a 503 or no answer inside the window of a fault on the registry, Redis, S3 or a
    trainer. (The honest tenant stays far under its own limits.)"""
    spans = windows([f for f in faults if f.get("part") in TENANT_FAULT_PARTS], grace, end)
    calls = [
        m for m in mutations if m["k"].startswith("ft_") and hostile[0] <= m["t0"] < hostile[1]
    ]
    bad = [
        m
        for m in calls
        if m["status"] == 429 or (m["status"] in (0, 503) and not inside(m["t0"], m["t1"], spans))
    ]
    return {
        "calls": len(calls),
        "by_status": dict(Counter(str(m["status"]) for m in calls)),
        "unavailable": len(bad),
        "examples": bad[:10],
    }


def billing(
    leaving: Sequence[Record],
    billed: dict[str, int],
    faults: Sequence[Record],
    grace: float,
    end: float,
) -> dict[str, Any]:
    """What the clients that left must have been billed at least: each answered request
    (a 200's headers), its prompt's tokens, and the text deltas it read; requests whose
    billing fell in a fault's window are left out (a Redis outage drops usage by design).
    ``billed`` is the leaving tenant's usage since before they started."""
    spans = windows(faults, grace, end)
    counted = [
        r
        for r in leaving
        if r["status"] == 200 and not inside(r["t0"], r["t1"] + BILL_LAG_S, spans)
    ]
    expected = {
        "requests": len(counted),
        "prompt_tokens": sum(r["prompt_tokens"] for r in counted),
        "completion_tokens": sum(r["deltas"] for r in counted),
    }
    modes = Counter(f"{r['api']}/{r['mode']}" for r in counted)
    short = {k: [billed.get(k, 0), v] for k, v in expected.items() if billed.get(k, 0) < v}
    return {
        "sent": len(leaving),
        "counted": len(counted),
        "by_mode": dict(modes),
        "expected_at_least": expected,
        "billed": billed,
        "short": short,
        "pass": (
            bool(counted)
            and not short
            and any(m.endswith("/headers") for m in modes)
            and any(m.endswith("/midstream") for m in modes)
        ),
    }


def unsupported_fields(
    probes: Sequence[Record], faults: Sequence[Record], grace: float, end: float
) -> dict[str, Any]:
    """Requests with a field no worker honours here: each must be a 400 in the error
    envelope with the probe's code (``tool_calling_disabled``, ``unsupported_parameter``).
    A 502/503 or no answer inside a fault's window is left out."""
    spans = windows(faults, grace, end)
    judged = [
        p
        for p in probes
        if not (p["status"] in (0, *CHAOS_STATUSES) and inside(p["t0"], p["t1"], spans))
    ]
    wrong = [
        p
        for p in judged
        if not (p["status"] == 400 and p.get("shape_ok") and p.get("code") == p["expected_code"])
    ]
    return {
        "sent": len(probes),
        "judged": len(judged),
        "by_field": dict(
            Counter(f"{p['path']} {p['field']}: {p['status']} {p.get('code')}" for p in judged)
        ),
        "wrong": len(wrong),
        "examples": wrong[:6],
        "pass": bool(judged)
        and not wrong
        and {(p["path"], p["field"]) for p in judged} == {(p["path"], p["field"]) for p in probes},
    }


def tenancy_rows(
    journal: Journal,
    faults: Sequence[Record],
    grace: float,
    end: float,
    billed: dict[str, int] | None,
    others: Sequence[str],
) -> tuple[list[tuple[str, str, bool]], dict[str, Any]]:
    """The rows of the three principles (tenants bounded, leaving clients billed, no field
    ignored), with their numbers; none when the run had no hostile tenant."""
    if "hostile" not in journal.phases:
        return [], {}
    iso = isolation(journal.requests, journal.phases)
    refused = hostile_refusals(journal.hostile, others)
    beside = tenant_calls_beside_hostile(
        journal.mutations, faults, journal.phases["hostile"], grace, end
    )
    bill = billing(journal.leaving, billed or {}, faults, grace, end)
    fields = unsupported_fields(journal.probes, faults, grace, end)
    rows = [
        (
            "honest p99 beside a hostile tenant (<= 3x calm + 0.5 s)",
            f"calm {iso['p99_calm_s']} s ({iso['answers_calm']} answers, "
            f"{iso['refused_calm']} 429), hostile {iso['p99_hostile_s']} s "
            f"({iso['answers_hostile']}, {iso['refused_hostile']} 429), ratio {iso['ratio']}",
            iso["pass"],
        ),
        (
            "hostile tenant refused (429/413) naming its own limit",
            "; ".join(
                f"{k}: {v['calls']} calls {v['statuses']}, {v['named_own_limit']}/{v['refused']} "
                "named"
                for k, v in refused.items()
            )
            or "no hostile calls",
            bool(refused)
            and all(v["pass"] for v in refused.values())
            and set(refused) == {"slow_upload", "tokenize"},
        ),
        (
            "honest files/fine-tuning via gateway: no 429/503 beside it",
            f"{beside['calls']} calls {beside['by_status']}, {beside['unavailable']} "
            "unavailable outside a fault",
            beside["calls"] > 0 and beside["unavailable"] == 0,
        ),
        (
            "streams clients left are billed (requests, tokens)",
            f"{bill['counted']} of {bill['sent']} counted {bill['by_mode']}; billed "
            f"{bill['billed']} >= {bill['expected_at_least']}",
            bill["pass"],
        ),
        (
            "unsupported fields refused with 400",
            f"{fields['judged']} judged {fields['by_field']}, {fields['wrong']} wrong",
            fields["pass"],
        ),
    ]
    return rows, {
        "isolation": iso,
        "hostile": refused,
        "tenant_calls": beside,
        "billing": bill,
        "unsupported": fields,
    }


# -- all checks ----------------------------------------------------------------------------


def verdicts(
    args: argparse.Namespace,
    journal: Journal,
    state: dict[str, Any],
    tenants: Tenants,
    end: float,
    billed: dict[str, int] | None = None,
    others: Sequence[str] = (),
) -> dict[str, Any]:
    """Every check as a ``(check, result, passed)`` row, with the numbers behind them
    (``billed``: the leaving tenant's usage during the soak; ``others``: the names of the
    tenants other than the hostile one)."""
    truth = Truth(journal.mutations, tenants.seeded)
    wrong = wrong_answers(journal.requests, truth, args.swap_grace)
    errors = account_errors(
        [*journal.requests, *journal.mutations, *journal.leaving], journal.faults, args.grace, end
    )
    tenancy, tenancy_numbers = tenancy_rows(
        journal, journal.faults, args.grace, end, billed, others
    )
    recovered = recovery(journal.faults)
    used = resources(journal.samples, journal.faults)
    kinds_seen = set(recovered)
    all_recovered = all(r["recovered"] == r["faults"] for r in recovered.values())
    rows = [
        (
            "uploads acknowledged: listed, downloadable, sha256 as sent",
            (
                f"{state['uploads_acknowledged']} checked, "
                f"{len(state['not_listed'])} not listed, {len(state['not_downloadable'])} not "
                f"downloadable, {state['sha_reply_mismatch']} sha256 mismatches"
            ),
            not (state["not_listed"] or state["not_downloadable"] or state["sha_reply_mismatch"]),
        ),
        (
            "acknowledged deletes stay deleted",
            f"{len(state['deleted_but_listed'])} listed",
            not state["deleted_but_listed"],
        ),
        (
            "acknowledged bindings resolve",
            (f"{state['bindings_checked']} checked, {len(state['bindings_wrong'])} wrong"),
            not state["bindings_wrong"],
        ),
        (
            "no blob referenced but missing",
            (f"{state['blobs_referenced']} referenced, {len(state['blobs_missing'])} missing"),
            not state["blobs_missing"],
        ),
        (
            "no wrong answer (tenant, version after swap)",
            f"{wrong['checked']} answers checked, {wrong['wrong']} wrong {wrong['by_kind']}",
            wrong["wrong"] == 0,
        ),
        (
            "zero 500s",
            f"{errors['classes'].get('http_500', 0)}",
            errors["classes"].get("http_500", 0) == 0,
        ),
        (
            "errors accounted for (429 / 502-503 in a window)",
            f"{errors['classes']}",
            errors["unaccounted"] == 0,
        ),
        (
            "every fault recovered",
            ", ".join(
                f"{k} {r['recovered']}/{r['faults']} (max {r['max_s']} s)"
                for k, r in recovered.items()
            ),
            all_recovered and kinds_seen == set(KINDS),
        ),
        *finetune_rows(state.get("finetune")),
        *tenancy,
        (
            "resources (RSS MB, FDs: start -> end)",
            "; ".join(
                f"{p} {r['rss_mb_start']:.0f}->{r['rss_mb_end']:.0f} MB "
                f"{r['fds_start']}->{r['fds_end']} fds"
                + (f" ({r['restarts']} restarts)" if r["restarts"] else "")
                for p, r in used.items()
            ),
            all(
                r["rss_growth_same_process"] is None or r["rss_growth_same_process"] < 1.5
                for r in used.values()
            ),
        ),
    ]
    return {
        "rows": rows,
        "wrong": wrong,
        "errors": errors,
        "recovery": recovered,
        "resources": used,
        "tenancy": tenancy_numbers,
        "passed": all(passed for _, _, passed in rows),
    }


def finetune_rows(jobs: dict[str, Any] | None) -> list[tuple[str, str, bool]]:
    """The fine-tuning checks, from :func:`bench.soak.finetune.verify_jobs`."""
    if jobs is None:
        return []
    succeeded = jobs["by_status"].get("succeeded", 0)
    return [
        (
            "fine-tuning jobs acknowledged: all ended, cancels kept",
            (
                f"{jobs['acknowledged']} jobs {jobs['by_status']}, failures {jobs['errors']}, "
                f"{len(jobs['not_terminal'])} not ended, {len(jobs['cancel_ignored'])} cancels "
                "ignored"
            ),
            jobs["acknowledged"] > 0
            and succeeded > 0
            and not jobs["not_terminal"]
            and not jobs["cancel_ignored"],
        ),
        (
            "succeeded jobs' adapters listed and served",
            (
                f"{jobs['served']}/{succeeded} served, {len(jobs['not_listed'])} not listed, "
                f"{len(jobs['not_served'])} not served"
            ),
            not jobs["not_listed"] and not jobs["not_served"],
        ),
        (
            "no trainer output left in the store",
            f"{len(jobs['output_left'])} jobs' left",
            not jobs["output_left"],
        ),
    ]


# -- presentation --------------------------------------------------------------------------


def table(rows: Sequence[tuple[str, str, bool]]) -> str:
    """``check | result | verdict`` as fixed-width text."""
    width = max(len(name) for name, _, _ in rows)
    lines = [f"{'check':<{width}}  {'verdict':<7}  result", "-" * (width + 40)]
    lines += [
        f"{name:<{width}}  {'PASS' if passed else 'FAIL':<7}  {result}"
        for name, result, passed in rows
    ]
    return "\n".join(lines)


def bins(requests: Sequence[Record], end: float, width: float = 5.0) -> list[Record]:
    """Per ``width``-second bin (by completion time): successes/s, errors/s, latency p95."""
    n = max(1, math.ceil(end / width))
    okc, errc = [0] * n, [0] * n
    lat: list[list[float]] = [[] for _ in range(n)]
    for r in requests:
        i = min(n - 1, max(0, int(r["t1"] / width)))
        if ok(r["status"]) and not r.get("err"):
            okc[i] += 1
            lat[i].append(r["t1"] - r["t0"])
        else:
            errc[i] += 1
    out = []
    for i in range(n):
        p95 = percentile(lat[i], 95, method="lower")
        out.append(
            {
                "t": i * width,
                "ok_per_s": round(okc[i] / width, 2),
                "errors_per_s": round(errc[i] / width, 2),
                "p95_s": None if p95 is None else round(p95, 3),
            }
        )
    return out


def plot(timeline: Sequence[Record], faults: Sequence[Record], title: str, path: Path) -> None:
    """Throughput and errors, latency, and one strip per fault kind below: dark while the
    fault lasts, light until the first success through the part. The plots above are
    shaded only while a fault lasts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [b["t"] for b in timeline]
    fig, (top, middle, strip) = plt.subplots(
        3, 1, figsize=(13, 7.5), sharex=True, gridspec_kw={"height_ratios": [3, 2, 1.4]}
    )
    top.plot(t, [b["ok_per_s"] for b in timeline], label="successful requests/s")
    top.plot(t, [b["errors_per_s"] for b in timeline], color="tab:red", label="errors/s")
    top.set_ylabel("requests / s\n(5 s bins)")
    top.legend(loc="upper right", fontsize=8)
    middle.plot(t, [b["p95_s"] for b in timeline], color="tab:purple")
    middle.set_ylabel("latency p95 (s)")
    kinds = sorted({f["kind"] for f in faults})
    for f in faults:
        row = kinds.index(f["kind"])
        colour = FAULT_COLOURS.get(f["kind"], "#ddd")
        last = f["recovered"] if f.get("recovered") is not None else f["end"]
        strip.broken_barh(
            [(f["start"], max(f["end"] - f["start"], 0.5))],
            (row - 0.4, 0.8),
            color=colour,
            edgecolor="black",
            linewidth=0.5,
        )
        strip.broken_barh(
            [(f["end"], last - f["end"])], (row - 0.25, 0.5), color=colour, alpha=0.45
        )
        for ax in (top, middle):
            ax.axvspan(f["start"], f["end"], color=colour, alpha=0.6, zorder=0)
    strip.set_yticks(range(len(kinds)), kinds, fontsize=8)
    strip.set_ylim(-0.6, max(len(kinds), 1) - 0.4)
    strip.set_xlabel(
        "seconds since the soak started (fault: dark = down, light = until "
        "the first success through the part)"
    )
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
