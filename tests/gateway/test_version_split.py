"""The gateway serves each user the version the adapter's serving policy gives them: the
real registry app writes the policy into a real Redis, the gateway's real registry client
reads it (its cache dropped by the policy's event), and fake workers record the
``model: sha256:<digest>`` each request was sent with. Which users are in the canary is
computed here independently of the code under test."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from preft_serve.common.objectstore import ObjectStoreSettings
from preft_serve.gateway.app import create_app as create_gateway
from preft_serve.gateway.settings import GatewaySettings
from preft_serve.registry.app import create_app as create_registry
from preft_serve.registry.settings import RegistrySettings
from preft_serve.toymodels import make_model
from tests.registry import factories
from tests.support.canary_split import in_canary as _in_canary
from tests.support.gateway import MSGS, Workers
from tests.support.registry_writer import eventually

ADMIN = "split-admin-0123456789abcdef"
USERS = [f"user-{i}" for i in range(40)]
WEIGHT = 0.5


@dataclass
class Stack:
    registry: TestClient
    gateway: TestClient
    workers: Workers
    auth: dict[str, str]
    shas: list[str]
    app: Any


def _files(folder: Path) -> list[tuple[str, tuple[str, bytes, str]]]:
    return [
        ("files", (p.name, p.read_bytes(), "application/octet-stream"))
        for p in sorted(folder.iterdir())
    ]


@pytest.fixture
def stack(tmp_path: Path, redis_server: str) -> Iterator[Stack]:
    model = make_model("tiny-llama", tmp_path / "model")
    namespace = f"vs{uuid.uuid4().hex[:10]}"
    registry_settings = RegistrySettings(
        admin_token=ADMIN,
        redis_url=redis_server,
        namespace=namespace,
        base_model=model,
        object_store=ObjectStoreSettings(url=str(tmp_path / "objects")),
        staging_dir=tmp_path,
    )
    workers = Workers()
    gateway_settings = GatewaySettings(
        worker_urls=["http://w1:8000"],
        base_model_name="tiny",
        redis_url=redis_server,
        namespace=namespace,
    )
    gateway_app = create_gateway(gateway_settings, transport=httpx.MockTransport(workers))
    with (
        TestClient(create_registry(registry_settings)) as registry,
        TestClient(gateway_app, raise_server_exceptions=False) as gateway,
    ):
        tenant = registry.post(
            "/v1/tenants", json={"name": "acme"}, headers={"Authorization": f"Bearer {ADMIN}"}
        )
        auth = {"Authorization": f"Bearer {tenant.json()['api_key']}"}
        shas = []
        for seed, promote in ((1, "true"), (2, "false")):
            folder = factories.lora(model, tmp_path / f"lora{seed}", seed=seed)
            resp = registry.put(
                "/v1/adapters/bot",
                params={"promote": promote},
                data={"mode": "prefill"},
                files=_files(folder),
                headers=auth,
            )
            assert resp.status_code == 201, resp.text
            shas.append(resp.json()["sha256"])
        for user in USERS:
            bound = registry.put(f"/v1/users/{user}", json={"adapter": "bot"}, headers=auth)
            assert bound.status_code == 200, bound.text
        yield Stack(registry, gateway, workers, auth, shas, gateway_app)


def _ask(stack: Stack, user: str, **extra: Any) -> httpx.Response:
    resp = stack.gateway.post(
        "/v1/chat/completions", json={"messages": MSGS, "user": user, **extra}, headers=stack.auth
    )
    assert resp.status_code == 200, resp.text
    return resp


def _variant_count(stack: Stack, variant: str) -> float:
    text = stack.gateway.get("/metrics").text
    found = re.search(
        rf'preft_gateway_adapter_variant_requests_total\{{adapter="bot",variant="{variant}"\}} '
        r"([0-9.e+]+)",
        text,
    )
    return float(found.group(1)) if found else 0.0


def test_staged_version_serves_nobody_until_the_policy_splits_users(stack: Stack) -> None:
    v1, v2 = stack.shas
    for user in USERS[:5]:
        resp = _ask(stack, user)
        assert stack.workers.seen[-1]["model"] == f"sha256:{v1}"
        assert resp.headers["x-preft-adapter-version"] == "1"
    staged = _ask(stack, USERS[0], model="bot@2")  # a staged version can be tried pinned
    assert staged.headers["x-preft-adapter-version"] == "2"
    assert stack.workers.seen[-1]["model"] == f"sha256:{v2}"
    cache = stack.app.state.gateway.registry._cache
    assert ("acme", "bot") in cache.adapters  # cached: the policy's event must drop it
    body = {"version": 1, "canary": {"version": 2, "weight": WEIGHT}}
    assert stack.registry.put("/v1/adapters/bot/policy", json=body, headers=stack.auth).is_success
    assert eventually(lambda: ("acme", "bot") not in cache.adapters)

    canary = [u for u in USERS if _in_canary("bot", u, WEIGHT)]
    assert 0 < len(canary) < len(USERS)  # both sides are exercised
    before = _variant_count(stack, "canary"), _variant_count(stack, "serving")
    for user in USERS:
        want = (2, v2) if user in canary else (1, v1)
        for stream in (False, True):
            resp = _ask(stack, user, stream=stream)
            assert stack.workers.seen[-1]["model"] == f"sha256:{want[1]}", user
            assert resp.headers["x-preft-adapter-version"] == str(want[0])
            assert resp.headers["x-preft-adapter-sha256"] == want[1]
    after = _variant_count(stack, "canary"), _variant_count(stack, "serving")
    assert after[0] - before[0] == 2 * len(canary)
    assert after[1] - before[1] == 2 * (len(USERS) - len(canary))

    # Naming the adapter splits by user too; name@version pins, whoever asks.
    inside, outside = canary[0], next(u for u in USERS if u not in canary)
    assert _ask(stack, inside, model="bot").headers["x-preft-adapter-version"] == "2"
    assert _ask(stack, outside, model="bot").headers["x-preft-adapter-version"] == "1"
    pinned = _ask(stack, inside, model="bot@1")
    assert pinned.headers["x-preft-adapter-version"] == "1"
    assert stack.workers.seen[-1]["model"] == f"sha256:{v1}"
    assert _variant_count(stack, "pinned") == 2
    # The registry tells the same split for a user.
    for user in (inside, outside):
        pick = stack.registry.get(
            "/v1/adapters/bot/policy", params={"user": user}, headers=stack.auth
        ).json()["user"]
        assert pick["version"] == (2 if user in canary else 1)


def test_promoting_the_canary_moves_everyone(stack: Stack) -> None:
    v1, v2 = stack.shas
    cache = stack.app.state.gateway.registry._cache
    _ask(stack, USERS[0])
    assert stack.workers.seen[-1]["model"] == f"sha256:{v1}"
    promoted = stack.registry.post("/v1/adapters/bot/versions/2/promote", headers=stack.auth)
    assert promoted.status_code == 200, promoted.text
    assert eventually(lambda: ("acme", "bot") not in cache.adapters)
    for user in USERS[:10]:
        assert _ask(stack, user).headers["x-preft-adapter-version"] == "2"
        assert stack.workers.seen[-1]["model"] == f"sha256:{v2}"
    back = stack.registry.put("/v1/adapters/bot/policy", json={"version": 1}, headers=stack.auth)
    assert back.status_code == 200
    assert eventually(lambda: ("acme", "bot") not in cache.adapters)
    assert _ask(stack, USERS[0]).headers["x-preft-adapter-version"] == "1"
    assert stack.workers.seen[-1]["model"] == f"sha256:{v1}"
