"""GET /v1/usage?by=version: the requests, tokens, errors and time to first token of each
adapter version that served, read from the real registry app after a real gateway served a
canary split (fake workers over a real socket). What each version should show is counted
here from the answers the client got: the version from ``x-preft-adapter-version``, the
tokens from the answer's usage, the errors from the status, the TTFT count from the streams
(and its sum bounded by the client's own timing of them)."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from fastapi.testclient import TestClient

from preft_serve.common.objectstore import ObjectStoreSettings
from preft_serve.gateway.app import create_app as create_gateway
from preft_serve.gateway.settings import GatewaySettings
from preft_serve.registry.app import create_app as create_registry
from preft_serve.registry.settings import RegistrySettings
from preft_serve.toymodels import make_model
from tests.gateway.test_variant_metrics import (
    CANARY,
    SERVING,
    Worker,
    _sse_usage,
    canary_tenant,
)
from tests.support.gateway import MSGS
from tests.support.inprocess import serving

ADMIN = "usage-versions-admin-0123456789"


@contextmanager
def _stack(
    tmp_path: Path, redis_server: str, worker: Worker
) -> Iterator[tuple[TestClient, httpx.Client, dict[str, str]]]:
    """Adapter 'bot': version 1 serving, version 2 the canary at WEIGHT, every user bound;
    the registry app, a gateway client on a real socket, and the tenant's auth header."""
    model = make_model("tiny-llama", tmp_path / "model")
    settings = RegistrySettings(
        admin_token=ADMIN,
        redis_url=redis_server,
        namespace=f"uv{uuid.uuid4().hex[:10]}",
        base_model=model,
        object_store=ObjectStoreSettings(url=str(tmp_path / "objects")),
        staging_dir=tmp_path,
    )
    with TestClient(create_registry(settings)) as registry:
        auth = canary_tenant(registry, model, tmp_path, ADMIN)
        gateway = GatewaySettings(
            base_model_name="tiny",
            worker_base_model="/models/tiny",
            redis_url=redis_server,
            namespace=settings.namespace,
            worker_urls=["http://w1:8000"],
        )
        app = create_gateway(gateway, transport=httpx.MockTransport(worker))
        with serving(app) as url, httpx.Client(base_url=url, headers=auth, timeout=30) as client:
            yield registry, client, auth


def _totals(report: dict[str, Any]) -> dict[str, dict[str, float]]:
    found: dict[str, Counter[str]] = {}
    for bucket in report["buckets"]:
        for item in bucket["items"]:
            total = found.setdefault(item["name"], Counter())
            for kind, value in item.items():
                if kind not in ("name", "ttft_seconds_mean"):
                    total[kind] += value
    return {name: dict(counts) for name, counts in found.items()}


def test_each_version_shows_what_it_served(tmp_path: Path, redis_server: str) -> None:
    failing = {CANARY[0]: 500, SERVING[0]: 400}
    worker = Worker(failing, endless=set(), silent=set())
    expected: dict[str, Counter[str]] = {}
    stream_wall = 0.0
    with _stack(tmp_path, redis_server, worker) as (registry, gateway, auth):
        for user in [*CANARY[:4], *SERVING[:5]]:
            for stream in (False, True):
                body: dict[str, Any] = {"messages": MSGS, "user": user, "stream": stream}
                if stream:
                    body["stream_options"] = {"include_usage": True}
                started = time.perf_counter()
                answer = gateway.post("/v1/chat/completions", json=body)
                # Which side of the split the user is on is computed independently.
                version = "2" if user in CANARY else "1"
                counts = expected.setdefault(f"bot@{version}", Counter())
                if user in failing:  # the worker fails it, after the version was chosen
                    assert answer.status_code == failing[user]
                    counts["errors"] += 1
                    continue
                assert answer.status_code == 200, answer.text
                assert answer.headers["x-preft-adapter-version"] == version
                usage = _sse_usage(answer.text) if stream else answer.json()["usage"]
                counts["requests"] += 1
                counts["completion_tokens"] += usage["completion_tokens"]
                counts["prompt_tokens"] += usage["prompt_tokens"]
                if stream:
                    counts["ttft_count"] += 1
                    stream_wall += time.perf_counter() - started
        # A pinned version counts under that version, whoever asks.
        pinned = gateway.post(
            "/v1/chat/completions", json={"messages": MSGS, "model": "bot@2", "user": SERVING[1]}
        )
        assert pinned.headers["x-preft-adapter-version"] == "2"
        expected["bot@2"]["requests"] += 1
        expected["bot@2"]["prompt_tokens"] += pinned.json()["usage"]["prompt_tokens"]
        expected["bot@2"]["completion_tokens"] += pinned.json()["usage"]["completion_tokens"]

        want = {
            name: {
                kind: c[kind]
                for kind in ("requests", "prompt_tokens", "completion_tokens", "errors")
            }
            for name, c in expected.items()
        }
        assert want["bot@1"]["errors"] == 2 and want["bot@2"]["errors"] == 2

        def read(**params: str) -> dict[str, Any]:
            got = registry.get("/v1/usage", params={"by": "version", **params}, headers=auth)
            assert got.status_code == 200, got.text
            return got.json()  # type: ignore[no-any-return]

        deadline = time.monotonic() + 10  # the gateway writes once a second
        while True:
            totals = _totals(read())
            if {n: {k: totals.get(n, {}).get(k, 0) for k in want[n]} for n in want} == want:
                break
            assert time.monotonic() < deadline, (totals, want)
            time.sleep(0.1)
        assert set(totals) == set(want)
        for name, counts in expected.items():
            assert totals[name]["ttft_count"] == counts["ttft_count"]
            assert totals[name]["ttft_seconds_sum"] > 0
        assert sum(t["ttft_seconds_sum"] for t in totals.values()) <= stream_wall
        hourly = read(group_by="hour")
        assert hourly["by"] == "version" and _totals(hourly) == totals
        for bucket in hourly["buckets"]:
            for item in bucket["items"]:
                mean = item["ttft_seconds_sum"] / item["ttft_count"]
                assert abs(item["ttft_seconds_mean"] - mean) < 1e-9
        # The model breakdown keeps its shape: no version fields, errors not requests.
        model = registry.get("/v1/usage", params={"by": "model"}, headers=auth).json()
        (bot,) = [i for b in model["buckets"] for i in b["items"] if i["name"] == "bot"]
        assert set(bot) == {"name", "requests", "prompt_tokens", "completion_tokens"}
        assert bot["requests"] == sum(w["requests"] for w in want.values())
