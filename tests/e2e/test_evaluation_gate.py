"""The evaluation gate through the whole stack: ``POST /v1/adapters/{name}/evaluations`` on a
gateway with the registry behind it serves every example to the staged and the serving
version through the gateway's completion path (real vLLM worker, PreFT), scores both, and
promotes only a version that is not worse than the serving one by more than the margin.

The expected answers come from the worker itself, asked directly for one version's
content (``sha256:<hex>``): an independent run, outside the gateway, the registry and the
evaluation code. Answers taken from the serving version make the staged one fail (when it
answers differently, which is asserted); answers taken from the staged version make it pass.
Metric ``loss`` scores the expected answers with PreFT semantics (the adapter on the prompt,
the answer on the base model): the version whose own greedy answers they are has the lower
loss, and the summed loss equals the HF+peft oracle's on the same token ids.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from preft_serve.adapters.format import AdapterMode
from preft_serve.toymodels import LoraSpec, make_lora_adapter
from tests.e2e.stack import Base, Registry, metric_total, running_gateway
from tests.support.processes import ServiceProcess
from tests.training.oracle import lora_nll

PROMPTS = ["Hello there", "What is PreFT?", "Name a colour", "Count to three"]
MAX_TOKENS = 6
MARGIN = 0.25


@dataclass(frozen=True)
class Setup:
    gateway: str
    key: str
    other_key: str
    sha: dict[int, str]  # version -> content hash
    scorer: dict[int, Path]  # adapter "scorer": version -> its folder (for the oracle)
    model: Path


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
    sha[2] = _stage(registry, key, "bot", folders[1])
    scorer = {
        v: make_lora_adapter(
            base.model, root / f"scorer{v}", seed=s, spec=LoraSpec(mode=AdapterMode.PREFILL)
        )
        for v, s in ((1, 71), (2, 72))
    }
    registry.upload(key, "scorer", scorer[1], "prefill")
    _stage(registry, key, "scorer", scorer[2])
    env = {"PREFT_GATEWAY_REGISTRY_URL": registry.url}
    with running_gateway(
        base.root, redis_server, namespace, base.model, [worker.url], "gateway-eval", env
    ) as gateway:
        yield Setup(gateway.url, key, other, sha, scorer, base.model)


def _stage(registry: Registry, key: str, name: str, folder: Path) -> str:
    """Upload ``folder`` as a staged version of ``name``; its content hash."""
    files = [
        ("files", (p.name, p.read_bytes(), "application/octet-stream"))
        for p in sorted(folder.iterdir())
    ]
    staged = httpx.put(
        f"{registry.url}/v1/adapters/{name}",
        params={"promote": "false"},
        data={"mode": "prefill"},
        files=files,
        headers=_bearer(key),
        timeout=60,
    )
    assert staged.status_code == 201 and staged.json()["state"] == "staged", staged.text
    return str(staged.json()["sha256"])


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


def _attach(
    setup: Setup,
    answers: list[str],
    name: str = "bot",
    metric: str = "exact",
    margin: float = MARGIN,
) -> dict[str, Any]:
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
        "metric": metric,
        "margin": margin,
        "max_tokens": MAX_TOKENS,
    }
    attached = httpx.put(
        f"{setup.gateway}/v1/adapters/{name}/evaluation",
        json=body,
        headers=_bearer(setup.key),
        timeout=60,
    )
    assert attached.status_code == 200, attached.text
    return dict(attached.json())


def _evaluate(setup: Setup, key: str, name: str = "bot", **body: Any) -> httpx.Response:
    return httpx.post(
        f"{setup.gateway}/v1/adapters/{name}/evaluations",
        json=body,
        headers=_bearer(key),
        timeout=600,
    )


def _policy(setup: Setup, name: str = "bot") -> dict[str, Any]:
    reply = httpx.get(
        f"{setup.gateway}/v1/adapters/{name}/policy", headers=_bearer(setup.key), timeout=30
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


def _token_ids(worker: str, messages: list[dict[str, str]], generation_prompt: bool) -> list[int]:
    reply = httpx.post(
        f"{worker}/tokenize",
        json={"messages": messages, "add_generation_prompt": generation_prompt},
        timeout=60,
    )
    assert reply.status_code == 200, reply.text
    return list(reply.json()["tokens"])


def test_loss_prefers_the_version_the_answers_came_from_and_agrees_with_the_oracle(
    setup: Setup, worker: ServiceProcess
):
    sha = {v["version"]: v["sha256"] for v in _policy(setup, "scorer")["versions"]}
    served = [_worker_answer(worker.url, sha[1], p) for p in PROMPTS]
    staged = [_worker_answer(worker.url, sha[2], p) for p in PROMPTS]
    assert served != staged  # else both versions fit the answers alike

    # Expected answers = the serving version's: the staged one has the higher loss.
    config = _attach(setup, served, "scorer", "loss", margin=0.0)
    assert (config["metric"], config["margin"]) == ("loss", 0.0)
    reply = _evaluate(setup, setup.key, "scorer", promote=True)
    assert reply.status_code == 200, reply.text
    run = reply.json()
    result = run["result"]
    assert (run["version"], run["promoted"], result["passed"]) == (2, False, False)
    assert result["score"] > result["serving_score"] > 0
    assert result["score"] == pytest.approx(result["loss_sum"] / result["tokens"])
    # The sums are the oracle's: each answer's tokens (as the worker's chat template renders
    # them) scored teacher-forced, the LoRA on the prompt only.
    oracle = {1: 0.0, 2: 0.0}
    tokens = 0
    for prompt, answer in zip(PROMPTS, served, strict=True):
        messages = [{"role": "user", "content": prompt}]
        head = _token_ids(worker.url, messages, True)
        full = _token_ids(worker.url, [*messages, {"role": "assistant", "content": answer}], False)
        assert full[: len(head)] == head
        tokens += len(full) - len(head)
        for version in oracle:
            oracle[version] += lora_nll(
                setup.model, setup.scorer[version], head, full[len(head) :], "prefill"
            )
    assert (result["tokens"], result["serving_tokens"]) == (tokens, tokens)
    assert result["loss_sum"] == pytest.approx(oracle[2], rel=1e-4)
    assert result["serving_loss_sum"] == pytest.approx(oracle[1], rel=1e-4)
    refused = httpx.post(
        f"{setup.gateway}/v1/adapters/scorer/versions/2/promote",
        headers=_bearer(setup.key),
        timeout=30,
    )
    assert refused.status_code == 409, refused.text
    assert "(loss (lower is better))" in refused.json()["error"]["message"]
    assert _policy(setup, "scorer")["version"] == 1

    # Expected answers = the staged version's own: its loss is lower, so it is promoted.
    _attach(setup, staged, "scorer", "loss", margin=0.0)
    reply = _evaluate(setup, setup.key, "scorer", promote=True)
    assert reply.status_code == 200, reply.text
    run = reply.json()
    assert run["result"]["score"] < run["result"]["serving_score"]
    assert (run["result"]["passed"], run["promoted"]) == (True, True)
    assert _policy(setup, "scorer")["version"] == 2


def test_clients_cannot_set_the_adapter_boundary(setup: Setup):
    reply = httpx.post(
        f"{setup.gateway}/v1/completions",
        json={"model": "bot", "prompt": "hi", "vllm_xargs": {"preft_adapter_tokens": 1}},
        headers=_bearer(setup.key),
        timeout=60,
    )
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "vllm_xargs.preft_adapter_tokens"
