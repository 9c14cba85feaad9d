"""An evaluation run's promote is conditional on the policy it measured against: a split
another client sets while the run goes on is not ended by the run's promote (a real
registry behind the gateway; the mock workers answer every completion alike, so the staged
version passes, and the first completion is when the other client acts)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx

from tests.fuzz.support import lora_files, upload_parts
from tests.gateway import test_tenant_forwarding as forwarding
from tests.gateway.test_tenant_forwarding import Stack
from tests.support.gateway import Workers

model_dir, stack = forwarding.model_dir, forwarding.stack
SPLIT = {"version": 1, "canary": {"version": 2, "weight": 0.3}}


class SplitDuringTheRun(Workers):
    """Workers whose first completion sets a split through the registry, as another
    client would while the evaluation runs."""

    def __init__(self) -> None:
        super().__init__()
        self.split: Callable[[], httpx.Response] | None = None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and self.split is not None:
            split, self.split = self.split, None
            assert split().status_code == 200
        return super().__call__(request)


def test_a_split_set_during_the_run_is_not_ended_by_its_promote(
    stack: Callable[..., Stack],
) -> None:
    workers = SplitDuringTheRun()
    s = stack(workers=workers)
    key = s.registry.tenant("acme")
    for seed, params in ((1, {}), (2, {"promote": "false"})):
        made = s.call(
            key,
            "PUT",
            "/v1/adapters/bot",
            params=params,
            data={"mode": "prefill"},
            files=upload_parts(*lora_files(seed)),
        )
        assert made.status_code == 201, made.text
    line = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "hi"}]}
    stored = s.call(
        key,
        "POST",
        "/v1/files",
        data={"purpose": "fine-tune"},
        files={"file": ("eval.jsonl", (json.dumps(line) + "\n") * 2, "application/jsonl")},
    )
    assert stored.status_code in (200, 201), stored.text
    attached = s.call(
        key,
        "PUT",
        "/v1/adapters/bot/evaluation",
        json={"file_id": stored.json()["id"], "metric": "exact", "margin": 0.1},
    )
    assert attached.status_code == 200, attached.text
    workers.split = lambda: s.registry.call(key, "PUT", "/v1/adapters/bot/policy", json=SPLIT)

    run = s.call(key, "POST", "/v1/adapters/bot/evaluations", json={"promote": True})
    assert run.status_code == 200, run.text
    answer: dict[str, Any] = run.json()
    assert (answer["version"], answer["result"]["passed"]) == (2, True)
    assert (answer["promoted"], answer["policy"]) == (False, None)
    assert "changed since it was read" in answer["promote_refused"]
    assert "serves version 1 with version 2 to 0.3 of users" in answer["promote_refused"]
    policy = s.registry.call(key, "GET", "/v1/adapters/bot/policy").json()
    assert (policy["version"], policy["canary"]["version"], policy["canary"]["weight"]) == (
        1,
        2,
        0.3,
    )
    # Without anyone acting meanwhile, the same run (version 2 is the canary now) promotes.
    again = s.call(
        key, "POST", "/v1/adapters/bot/evaluations", json={"version": 2, "promote": True}
    )
    assert again.status_code == 200, again.text
    assert (again.json()["promoted"], again.json()["promote_refused"]) == (True, None)
    assert s.registry.call(key, "GET", "/v1/adapters/bot/policy").json()["version"] == 2


def test_a_refusal_relayed_from_an_evaluation_step_keeps_its_retry_after() -> None:
    """A registry that is busy (429 ``too_many_transfers`` for the evaluation file, say)
    says when to retry; the gateway's answer says it too, so clients can wait it out."""
    from preft_serve.gateway.evaluation import relay
    from preft_serve.gateway.evaluation_calls import Refused

    payload = {
        "error": {"message": "busy", "type": "rate_limit_error", "code": "too_many_transfers"}
    }
    answer = relay(Refused(429, payload, retry_after="1"))
    assert answer.status_code == 429 and answer.headers["retry-after"] == "1"
    assert json.loads(answer.body) == payload
    assert "retry-after" not in relay(Refused(404, payload)).headers
