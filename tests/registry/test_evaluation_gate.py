"""The evaluation gate on the registry: attaching an evaluation file (checked, bounded,
tenant-scoped), storing a version's result (the registry decides ``passed``), and the
promote that refuses a staged version without a passing result unless ``force``.

The gateway's run (which measures the counts through the serving path) is tested end to
end in ``tests/e2e/test_evaluation_gate.py``; here the counts are posted directly, as the
gateway does, to check the registry's side of the contract."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from preft_serve.common.evaluation_wire import MAX_EXAMPLES
from tests.registry import factories
from tests.support.registry_api import error_message, upload

LINE = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}


@pytest.fixture(scope="module")
def lora_dir3(base_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return factories.lora(base_model_dir, tmp_path_factory.mktemp("lora3"), seed=3)


def _file(client: TestClient, headers: dict[str, str], lines: list[Any]) -> str:
    text = "".join(json.dumps(line) + "\n" for line in lines)
    reply = client.post(
        "/v1/files",
        headers=headers,
        data={"purpose": "fine-tune"},
        files={"file": ("eval.jsonl", text.encode(), "application/jsonl")},
    )
    assert reply.status_code == 200, reply.text
    return str(reply.json()["id"])


@pytest.fixture
def staged(client, acme, lora_dir, lora_dir2) -> dict[str, Any]:
    """bot: v1 served, v2 staged; an evaluation file of 4 examples."""
    assert upload(client, acme, "bot", lora_dir).status_code == 201
    files = [
        ("files", (p.name, p.read_bytes(), "application/octet-stream"))
        for p in sorted(lora_dir2.iterdir())
    ]
    v2 = client.put(
        "/v1/adapters/bot",
        params={"promote": "false"},
        data={"mode": "prefill"},
        files=files,
        headers=acme,
    )
    assert v2.status_code == 201 and v2.json()["state"] == "staged", v2.text
    return {"file": _file(client, acme, [LINE] * 4)}


def _attach(client, headers, file_id, margin=0.1, metric="exact") -> Any:
    body = {"file_id": file_id, "metric": metric, "margin": margin, "max_tokens": 16}
    return client.put("/v1/adapters/bot/evaluation", json=body, headers=headers)


def _result(client, headers, file_id, version, correct, serving_correct, serving=1) -> Any:
    body = {
        "file_id": file_id,
        "metric": "exact",
        "examples": 4,
        "correct": correct,
        "serving_version": serving,
        "serving_correct": serving_correct,
    }
    return client.put(f"/v1/adapters/bot/versions/{version}/evaluation", json=body, headers=headers)


def _policy(client, headers) -> dict[str, Any]:
    reply = client.get("/v1/adapters/bot/policy", headers=headers)
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


def test_attach_show_and_detach(client, acme, staged):
    reply = _attach(client, acme, staged["file"], margin=0.05)
    assert reply.status_code == 200, reply.text
    config = reply.json()
    assert (config["file_id"], config["metric"], config["margin"], config["examples"]) == (
        staged["file"],
        "exact",
        0.05,
        4,
    )
    assert client.get("/v1/adapters/bot/evaluation", headers=acme).json() == config
    assert client.delete("/v1/adapters/bot/evaluation", headers=acme).json() == config
    gone = client.get("/v1/adapters/bot/evaluation", headers=acme)
    assert gone.status_code == 404 and "has no evaluation" in error_message(gone)


@pytest.mark.parametrize(
    ("case", "status", "says"),
    [
        ("unknown file", 404, "no file"),
        ("other tenant's file", 404, "no file"),
        ("margin above 1", 422, "margin"),
        ("negative margin", 422, "margin"),
        ("max_tokens too large", 422, "max_tokens"),
        ("loss margin above 10", 422, "margin"),
        ("share margin above 1 with a loss-sized margin", 422, "margins up to 10 are nats"),
        ("last message not the answer", 400, "line 2: the last message must be the assistant"),
        ("too many examples", 400, f"at most {MAX_EXAMPLES}"),
        ("unknown adapter", 404, "does not exist"),
    ],
)
def test_a_bad_config_is_refused_and_stores_nothing(
    client, acme, new_tenant, staged, state_snapshot, case, status, says
):
    file_id, body, path = staged["file"], {}, "/v1/adapters/bot/evaluation"
    if case == "unknown file":
        file_id = "file-" + "0" * 24
    elif case == "other tenant's file":
        file_id = _file(client, new_tenant("other"), [LINE])
    elif case == "last message not the answer":
        ends_with_a_question = {"messages": [*LINE["messages"], {"role": "user", "content": "?"}]}
        file_id = _file(client, acme, [LINE, ends_with_a_question])
    elif case == "too many examples":
        file_id = _file(client, acme, [LINE] * (MAX_EXAMPLES + 1))
    elif case == "unknown adapter":
        path = "/v1/adapters/nobot/evaluation"
    body = {"file_id": file_id, "metric": "exact", "margin": 0.1}
    body |= {
        "margin above 1": {"margin": 1.5},
        "negative margin": {"margin": -0.1},
        "max_tokens too large": {"max_tokens": 100_000},
        "loss margin above 10": {"metric": "loss", "margin": 10.5},
        "share margin above 1 with a loss-sized margin": {"metric": "contains", "margin": 2},
    }.get(case, {})
    before = state_snapshot()
    reply = client.put(path, json=body, headers=acme)
    assert reply.status_code == status, reply.text
    assert says in error_message(reply)
    assert state_snapshot() == before


def test_promote_without_a_passing_result_is_409_and_changes_nothing(
    client, acme, staged, state_snapshot
):
    assert _attach(client, acme, staged["file"]).status_code == 200
    before, policy = state_snapshot(), _policy(client, acme)
    for refused in (
        client.post("/v1/adapters/bot/versions/2/promote", headers=acme),
        client.put("/v1/adapters/bot/policy", json={"version": 2}, headers=acme),
    ):
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "evaluation_required"
        assert "version 2 of adapter 'bot' has no evaluation result" in error_message(refused)
    assert state_snapshot() == before and _policy(client, acme) == policy
    # A failing result: 2 of 4 right against 4 of 4, margin 0.1.
    failed = _result(client, acme, staged["file"], 2, correct=2, serving_correct=4)
    assert failed.status_code == 200, failed.text
    assert (failed.json()["score"], failed.json()["serving_score"]) == (0.5, 1.0)
    assert failed.json()["passed"] is False
    shown = {v["version"]: v.get("evaluation") for v in _policy(client, acme)["versions"]}
    assert shown[2] == failed.json() and shown[1] is None
    refused = client.post("/v1/adapters/bot/versions/2/promote", headers=acme)
    assert refused.status_code == 409
    assert "scored 0.5000 (exact) against 1.0000" in error_message(refused)
    assert _policy(client, acme)["version"] == 1


def test_force_skips_the_gate_and_is_audited(client, acme, staged):
    assert _attach(client, acme, staged["file"]).status_code == 200
    forced = client.post("/v1/adapters/bot/versions/2/promote?force=true", headers=acme)
    assert forced.status_code == 200, forced.text
    assert forced.json()["version"] == 2
    entries = client.get("/v1/audit", headers=acme).json()["data"]
    assert entries[-1]["action"] == "adapter.policy"
    assert entries[-1]["after"].endswith("(evaluation gate skipped: force)")


def test_a_passing_result_lets_the_promote_through(client, acme, staged):
    assert _attach(client, acme, staged["file"], margin=0.25).status_code == 200
    # 3 of 4 against 4 of 4: worse by exactly the margin, which passes.
    passed = _result(client, acme, staged["file"], 2, correct=3, serving_correct=4)
    assert passed.status_code == 200 and passed.json()["passed"] is True, passed.text
    promoted = client.post("/v1/adapters/bot/versions/2/promote", headers=acme)
    assert promoted.status_code == 200, promoted.text
    assert {v["version"]: v["state"] for v in promoted.json()["versions"]} == {
        1: "retired",
        2: "serving",
    }


def test_results_are_for_the_current_config_and_serving_version(client, acme, staged, lora_dir3):
    assert _attach(client, acme, staged["file"]).status_code == 200
    stale = _result(client, acme, staged["file"], 2, correct=4, serving_correct=4, serving=2)
    assert stale.status_code == 409 and "version 1 of adapter 'bot' is served now" in (
        error_message(stale)
    )
    assert _result(client, acme, staged["file"], 2, 4, 4).json()["passed"] is True
    # Another file attached since: the result no longer opens the gate.
    other = _file(client, acme, [LINE] * 4)
    assert _attach(client, acme, other).status_code == 200
    refused = client.post("/v1/adapters/bot/versions/2/promote", headers=acme)
    assert refused.status_code == 409 and f"was evaluated on {staged['file']}" in (
        error_message(refused)
    )
    # A canary of a staged version needs no result.
    canary = {"version": 1, "canary": {"version": 2, "weight": 0.1}}
    assert client.put("/v1/adapters/bot/policy", json=canary, headers=acme).status_code == 200


def test_another_tenant_can_neither_read_nor_write_the_evaluation(
    client, acme, new_tenant, staged, state_snapshot
):
    assert _attach(client, acme, staged["file"]).status_code == 200
    other = new_tenant("other")
    before = state_snapshot()
    assert client.get("/v1/adapters/bot/evaluation", headers=other).status_code == 404
    assert client.delete("/v1/adapters/bot/evaluation", headers=other).status_code == 404
    assert _attach(client, other, staged["file"]).status_code == 404
    assert _result(client, other, staged["file"], 2, 4, 0).status_code == 404
    assert state_snapshot() == before


def _loss_result(client, headers, file_id, version, sums, serving_sums) -> Any:
    body = {
        "file_id": file_id,
        "metric": "loss",
        "examples": 4,
        "loss_sum": sums[0],
        "tokens": sums[1],
        "serving_version": 1,
        "serving_loss_sum": serving_sums[0],
        "serving_tokens": serving_sums[1],
    }
    return client.put(f"/v1/adapters/bot/versions/{version}/evaluation", json=body, headers=headers)


def test_loss_scores_per_token_and_lower_is_better(client, acme, staged, state_snapshot):
    reply = _attach(client, acme, staged["file"], margin=0.5, metric="loss")
    assert reply.status_code == 200 and reply.json()["metric"] == "loss", reply.text
    # 30 nats over 12 tokens (2.5 per token) against 24 over 12 (2.0): worse by 0.5, passes.
    at_margin = _loss_result(client, acme, staged["file"], 2, (30.0, 12), (24.0, 12))
    assert at_margin.status_code == 200, at_margin.text
    result = at_margin.json()
    assert (result["score"], result["serving_score"], result["passed"]) == (2.5, 2.0, True)
    assert (result["loss_sum"], result["tokens"]) == (30.0, 12)
    # 31 nats: 2.5833 per token, worse by more than the margin; the promote waits.
    worse = _loss_result(client, acme, staged["file"], 2, (31.0, 12), (24.0, 12))
    assert worse.json()["passed"] is False
    refused = client.post("/v1/adapters/bot/versions/2/promote", headers=acme)
    assert refused.status_code == 409
    assert "scored 2.5833 (loss (lower is better)) against 2.0000" in error_message(refused)
    # A lower loss than the serving version's passes whatever the margin.
    better = _loss_result(client, acme, staged["file"], 2, (6.0, 12), (24.0, 12))
    assert better.json()["passed"] is True
    # Counts for a loss metric, or no sums, are refused with nothing stored.
    before = state_snapshot()
    for bad, says in (
        (_result(client, acme, staged["file"], 2, 4, 4), "changed while this run went on"),
        (_loss_result(client, acme, staged["file"], 2, (6.0, None), (24.0, 12)), "tokens"),
        (_loss_result(client, acme, staged["file"], 2, (-1.0, 12), (24.0, 12)), "loss_sum"),
    ):
        assert bad.status_code in (400, 409, 422), bad.text
        assert says in error_message(bad)
    assert state_snapshot() == before
    promoted = client.post("/v1/adapters/bot/versions/2/promote", headers=acme)
    assert promoted.status_code == 200, promoted.text
