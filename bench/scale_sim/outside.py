"""Where a load-test request's time goes outside the engines, measured, for the simulator.

On the 2-core VM the API servers, the gateway and locust's 50 users compete with the
engines for the cores, and a request spends much of its life waiting for CPU outside any
engine. That time counts twice: in TTFT, and in the gateway's bounded-load cap, which holds
a request against its worker from the moment it is forwarded until the answer is relayed.
The load test measures it per component (:func:`scrape`, before and after locust runs):

* **client**: locust's latency less the gateway's own time for the same request (its
  access log, joined on ``X-Request-Id``): locust and the gateway's HTTP server waiting
  for CPU, outside the cap;
* **slot**: the gateway's time less vLLM's end-to-end time (``vllm:e2e_request_latency``:
  from the request's arrival in the engine's front end to its last output) and less the
  adapter fetches (``preft_worker_adapter_load_seconds{tier=disk}``, run in the API server
  before the engine sees the request, and simulated apart): the gateway and the API server
  forwarding, tokenising and streaming, inside the cap.

The simulator (``validate.py``) adds both to every request before it reaches the engine
(they delay the first token as much as the last): the client time before the gateway
routes it, drawn from the run's per-request values; the slot time after the gateway routes
it (the request holds its in-flight slot), exponential with the measured mean, since only
its mean is measured. Nothing here is fitted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

GATEWAY_HISTOGRAMS = ("preft_gateway_request_seconds", "preft_gateway_ttft_seconds")
WORKER_HISTOGRAMS = (
    "vllm:e2e_request_latency_seconds",
    "vllm:time_to_first_token_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_inference_time_seconds",
    "preft_worker_adapter_load_seconds",
)
COMPLETIONS_ROUTES = ("/v1/chat/completions", "/v1/completions")


@dataclass(frozen=True)
class Outside:
    """A recorded run's time outside the engines, per request (seconds)."""

    client_s: tuple[float, ...]  # per request: locust's latency less the gateway's
    slot_mean_s: float  # mean: the gateway's time less the engine's and the fetch
    source: str = ""

    def client(self, rng: np.random.Generator) -> float:
        return self.client_s[int(rng.integers(len(self.client_s)))] if self.client_s else 0.0

    def slot(self, rng: np.random.Generator) -> float:
        return float(rng.exponential(self.slot_mean_s)) if self.slot_mean_s > 0 else 0.0


def histograms(text: str, names: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """The named histograms in a ``/metrics`` page: per name (and labels other than ``le``,
    ``model_name``, ``engine``, ``adapter``: those are summed over) sum, count and
    cumulative bucket counts."""
    out: dict[str, dict[str, Any]] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in names:
            continue
        for sample in family.samples:
            labels = {
                k: v
                for k, v in sorted(sample.labels.items())
                if k not in ("le", "model_name", "engine", "adapter")
            }
            key = family.name + (
                "{" + ",".join(f"{k}={v}" for k, v in labels.items()) + "}" if labels else ""
            )
            entry = out.setdefault(key, {"sum": 0.0, "count": 0.0, "buckets": {}})
            suffix = sample.name[len(family.name) :]
            if suffix == "_sum":
                entry["sum"] += sample.value
            elif suffix == "_count":
                entry["count"] += sample.value
            elif suffix == "_bucket":
                le = sample.labels["le"]
                entry["buckets"][le] = entry["buckets"].get(le, 0.0) + sample.value
    return out


def scrape(gateway: str, workers: list[str]) -> dict[str, dict[str, Any]]:
    """The gateway's and every worker's (summed) histograms now."""
    import httpx

    out = histograms(httpx.get(f"{gateway}/metrics", timeout=10).text, GATEWAY_HISTOGRAMS)
    for url in workers:
        for key, h in histograms(
            httpx.get(f"{url}/metrics", timeout=10).text, WORKER_HISTOGRAMS
        ).items():
            total = out.setdefault(key, {"sum": 0.0, "count": 0.0, "buckets": {}})
            total["sum"] += h["sum"]
            total["count"] += h["count"]
            for le, n in h["buckets"].items():
                total["buckets"][le] = total["buckets"].get(le, 0.0) + n
    return out


def difference(
    before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """What the histograms gathered between two scrapes, with each one's mean (ms)."""
    out = {}
    for key, h in after.items():
        b = before.get(key, {"sum": 0.0, "count": 0.0, "buckets": {}})
        count = h["count"] - b["count"]
        total = h["sum"] - b["sum"]
        out[key] = {
            "count": int(count),
            "sum_s": round(total, 3),
            "mean_ms": round(1000 * total / count, 1) if count else None,
            "buckets": {le: int(n - b["buckets"].get(le, 0.0)) for le, n in h["buckets"].items()},
        }
    return out


def access_log(path: Path) -> dict[str, tuple[float, str]]:
    """The gateway's JSON access lines of completions: request id -> (ms, worker)."""
    out: dict[str, tuple[float, str]] = {}
    if not path.exists():
        return out
    for line in path.read_text(errors="replace").splitlines():
        if not line.startswith("{") or '"latency_ms"' not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("route") in COMPLETIONS_ROUTES and entry.get("request_id"):
            out[entry["request_id"]] = (float(entry["latency_ms"]), str(entry.get("worker", "")))
    return out


def request_rows(
    samples: list[dict[str, Any]], access: dict[str, tuple[float, str]], workers: list[str]
) -> list[list[Any]]:
    """Per successful request, by send time: [sent s from the first, locust latency ms,
    gateway ms (None: not in the access log), TTFT ms (None: not streamed or no text),
    worker index (-1: unknown)]."""
    if not samples:
        return []
    t0 = min(s["t"] for s in samples)
    rows = []
    for s in sorted(samples, key=lambda s: s["t"]):
        if s["error"] is not None:
            continue
        gateway_ms, worker = access.get(s.get("id") or "", (None, ""))
        rows.append(
            [
                round(s["t"] - t0, 3),
                round(1000 * s["latency_s"], 1),
                gateway_ms,
                None if s["ttft_s"] is None else round(1000 * s["ttft_s"], 1),
                workers.index(worker) if worker in workers else -1,
            ]
        )
    return rows


def breakdown(timing: dict[str, Any]) -> dict[str, Any]:
    """Where the mean request's time went (ms), from a summary's ``timing`` section."""
    h = timing["histograms"]

    def mean(key: str) -> float:
        return float(h.get(key, {}).get("mean_ms") or 0.0)

    fetch = h.get("preft_worker_adapter_load_seconds{tier=disk}", {})
    requests = max(timing["locust"]["requests"], 1)
    fetch_ms = 1000 * float(fetch.get("sum_s", 0.0)) / requests
    gateway = mean("preft_gateway_request_seconds")
    engine = mean("vllm:e2e_request_latency_seconds")
    return {
        "locust_ms": timing["locust"]["latency_mean_ms"],
        "client_ms": round(timing["locust"]["latency_mean_ms"] - gateway, 1),
        "gateway_ms": gateway,
        "fetch_ms": round(fetch_ms, 1),
        "slot_ms": round(gateway - engine - fetch_ms, 1),
        "engine_ms": engine,
        "engine_queue_ms": mean("vllm:request_queue_time_seconds"),
        "engine_ttft_ms": mean("vllm:time_to_first_token_seconds"),
        "gateway_ttft_ms": mean("preft_gateway_ttft_seconds"),
        "locust_ttft_ms": timing["locust"]["ttft_mean_ms"],
    }


def timing_section(
    samples: list[dict[str, Any]],
    rows: list[list[Any]],
    before: dict[str, dict[str, Any]],
    after: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """A summary's ``timing``: the histograms' differences, locust's means, the join's
    coverage and the breakdown."""
    ok = [s for s in samples if s["error"] is None]
    ttft = [s["ttft_s"] for s in ok if s["ttft_s"] is not None]
    section: dict[str, Any] = {
        "locust": {
            "requests": len(ok),
            "latency_mean_ms": round(1000 * float(np.mean([s["latency_s"] for s in ok])), 1)
            if ok
            else None,
            "ttft_mean_ms": round(1000 * float(np.mean(ttft)), 1) if ttft else None,
        },
        "joined": sum(r[2] is not None for r in rows),
        "histograms": difference(before, after),
    }
    if ok:
        section["breakdown_ms"] = breakdown(section)
    return section


def load(summary: Path) -> Outside | None:
    """The time outside the engines recorded with a load-test summary (its ``timing`` and
    the per-request rows of ``<out>_steps.json``); None where not recorded."""
    data = json.loads(summary.read_text())
    timing = data.get("timing")
    steps = summary.with_name(summary.name.replace("_summary.json", "_steps.json"))
    if not timing or not steps.exists():
        return None
    rows = json.loads(steps.read_text()).get("requests") or []
    client = tuple(max(0.0, (r[1] - r[2]) / 1000) for r in rows if r[2] is not None)
    slot = max(0.0, timing["breakdown_ms"]["slot_ms"] / 1000)
    if not client:
        return None
    return Outside(client, slot, steps.name)
