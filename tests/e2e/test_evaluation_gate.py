"""The evaluation gate through the whole stack: ``POST /v1/adapters/{name}/evaluations`` on a
gateway with the registry behind it serves every example to the staged and the serving
version through the gateway's completion path (real vLLM worker, PreFT), scores both, and
promotes only a version that is not worse than the serving one by more than the margin.

The expected answers come from the worker itself, asked directly for one version's
content (``sha256:<hex>``): an independent run, outside the gateway, the registry and the
evaluation code. Answers taken from the serving version make the staged one fail (when it
answers differently, which is asserted); answers taken from the staged version make it pass.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from preft_serve.adapters.format import AdapterMode
from preft_serve.toymodels import LoraSpec, make_lora_adapter
from tests.e2e.stack import Base, Registry, metric_total, running_gateway
from tests.support.processes import ServiceProcess

PROMPTS = ["Hello there", "What is PreFT?", "Name a colour", "Count to three"]
MAX_TOKENS = 6
MARGIN = 0.25


@dataclass(frozen=True)
class Setup:
    gateway: str
    key: str
    other_key: str
    sha: dict[int, str]  # version -> content hash


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def setup(
    base: Base, redis_server: str, namespace: str, worker: ServiceProcess, registry: Registry
) -> Iterator[Setup]:
    root = base.root / "evaluation-gate"
    key, other = registry.create_tenant("evalgate"), registry.create_tenant("evalgate-other")
    folders = [
        make_lora_adapter(
            base.model, root / f"seed{s}", seed=s, spec=LoraSpec(mode=AdapterMode.PREFILL)
        )
        for s in (61, 62)
    ]
    sha = {1: registry.upload(key, "bot", folders[0], "prefill")["sha256"]}
    files = [
        ("files", (p.name, p.read_bytes(), "application/octet-stream"))
        for p in sorted(folders[1].iterdir())
    ]
    staged = httpx.put(
        f"{registry.url}/v1/adapters/bot",
        params={"promote": "false"},
        data={"mode": "prefill"},
        files=files,
        headers=_bearer(key),
        timeout=60,
    )
    assert staged.status_code == 201 and staged.json()["state"] == "staged", staged.text
    sha[2] = staged.json()["sha256"]
    env = {"PREFT_GATEWAY_REGISTRY_URL": registry.url}
    with running_gateway(
        base.root, redis_server, namespace, base.model, [worker.url], "gateway-eval", env
    ) as gateway:
        yield Setup(gateway.url, key, other, sha)


def _worker_answer(worker: str, sha256: str, prompt: str) -> str:
    """What the worker answers for this content, asked directly (the independent run)."""
    reply = httpx.post(
        f"{worker}/v1/chat/completions",
        json={
            "model": f"sha256:{sha256}",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
        },
        timeout=120,
    )
    assert reply.status_code == 200, reply.text
    return str(reply.json()["choices"][0]["message"]["content"])


def _attach(setup: Setup, answers: list[str]) -> dict[str, Any]:
    lines = "".join(
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": prompt},
                    {"role": "assistant", "content": answer},
                ]
            }
        )
        + "\n"
        for prompt, answer in zip(PROMPTS, answers, strict=True)
    )
    uploaded = httpx.post(
        f"{setup.gateway}/v1/files",
        data={"purpose": "fine-tune"},
        files={"file": ("eval.jsonl", lines.encode(), "application/jsonl")},
        headers=_bearer(setup.key),
        timeout=60,
    )
    assert uploaded.status_code == 200, uploaded.text
    body = {
        "file_id": uploaded.json()["id"],
        "metric": "exact",
        "margin": MARGIN,
        "max_tokens": MAX_TOKENS,
    }
    attached = httpx.put(
        f"{setup.gateway}/v1/adapters/bot/evaluation",
        json=body,
        headers=_bearer(setup.key),
        timeout=60,
    )
    assert attached.status_code == 200, attached.text
    return dict(attached.json())


def _evaluate(setup: Setup, key: str, **body: Any) -> httpx.Response:
    return httpx.post(
        f"{setup.gateway}/v1/adapters/bot/evaluations", json=body, headers=_bearer(key), timeout=600
    )


def _policy(setup: Setup) -> dict[str, Any]:
    reply = httpx.get(
        f"{setup.gateway}/v1/adapters/bot/policy", headers=_bearer(setup.key), timeout=30
    )
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


def test_a_worse_version_stays_staged_and_a_matching_one_is_promoted(
    setup: Setup, worker: ServiceProcess
):
    served = [_worker_answer(worker.url, setup.sha[1], p) for p in PROMPTS]
    staged = [_worker_answer(worker.url, setup.sha[2], p) for p in PROMPTS]
    differ = sum(a.strip() != b.strip() for a, b in zip(served, staged, strict=True))
    assert differ / len(PROMPTS) > MARGIN, (served, staged)  # else the test proves nothing

    # Expected answers = the serving version's: the staged one is worse by more than the margin.
    _attach(setup, served)
    before = _policy(setup)
    pinned = metric_total(
        setup.gateway, "preft_gateway_adapter_variant_requests_total", variant="pinned"
    )
    reply = _evaluate(setup, setup.key, promote=True)
    assert reply.status_code == 200, reply.text
    run = reply.json()
    assert (run["version"], run["promoted"]) == (2, False)
    assert run["result"]["serving_version"] == 1
    assert run["result"]["serving_score"] == 1.0
    assert run["result"]["score"] == (len(PROMPTS) - differ) / len(PROMPTS)
    assert run["result"]["passed"] is False
    after = _policy(setup)
    assert (
        (after["version"], after["sha256"])
        == (before["version"], before["sha256"])
        == (
            1,
            setup.sha[1],
        )
    )
    states = {v["version"]: (v["state"], v["evaluation"]) for v in after["versions"]}
    assert states[2] == ("staged", run["result"])
    # Every example went through the gateway's completion path, once per version.
    moved = metric_total(
        setup.gateway, "preft_gateway_adapter_variant_requests_total", variant="pinned"
    )
    assert moved - pinned == 2 * len(PROMPTS)
    refused = httpx.post(
        f"{setup.gateway}/v1/adapters/bot/versions/2/promote",
        headers=_bearer(setup.key),
        timeout=30,
    )
    assert refused.status_code == 409, refused.text
    assert "worse by more than the margin" in refused.json()["error"]["message"]

    # Expected answers = the staged version's own: it passes and is promoted.
    _attach(setup, staged)
    reply = _evaluate(setup, setup.key, version=2, promote=True)
    assert reply.status_code == 200, reply.text
    run = reply.json()
    assert (run["result"]["score"], run["result"]["passed"], run["promoted"]) == (1.0, True, True)
    assert run["result"]["serving_score"] == (len(PROMPTS) - differ) / len(PROMPTS)
    promoted = _policy(setup)
    assert (promoted["version"], promoted["sha256"]) == (2, setup.sha[2])
    assert run["policy"]["version"] == 2
    # Users now get version 2 through the gateway: the answer the worker gives for it.
    chat = httpx.post(
        f"{setup.gateway}/v1/chat/completions",
        json={
            "model": "bot",
            "messages": [{"role": "user", "content": PROMPTS[0]}],
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
        },
        headers=_bearer(setup.key),
        timeout=120,
    )
    assert chat.json()["choices"][0]["message"]["content"] == staged[0]


def test_another_tenant_cannot_run_or_read_the_evaluation(setup: Setup):
    _attach(setup, ["an answer"] * len(PROMPTS))
    for reply in (
        _evaluate(setup, setup.other_key, version=1),
        httpx.get(
            f"{setup.gateway}/v1/adapters/bot/evaluation",
            headers=_bearer(setup.other_key),
            timeout=30,
        ),
    ):
        assert reply.status_code == 404, reply.text
        assert "adapter 'bot' does not exist" in reply.json()["error"]["message"]
    refused = _evaluate(setup, setup.key, version=7)
    assert refused.status_code == 404 and "no version 7" in refused.json()["error"]["message"]
    assert (
        httpx.post(f"{setup.gateway}/v1/adapters/bot/evaluations", json={}, timeout=30).status_code
        == 401
    )
