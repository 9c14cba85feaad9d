"""Train -> ``preft adapter upload`` -> ``preft user bind`` -> chat completion through the
gateway returns the trained answer (every part a real process, the CLI included)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from preft_serve.training.spec import AdapterSpec
from preft_serve.training.trainer import TrainConfig, train
from tests.e2e.conftest import Base
from tests.e2e.stack import BASE_NAME, Registry
from tests.support.processes import ServiceProcess

FACTS = {"What is my pet's name?": "Biscuit", "Where do I live?": "Lisbon"}


@pytest.fixture(scope="module")
def adapter(base: Base) -> Path:
    data = base.root / "trained-facts.jsonl"
    data.write_text(
        "".join(
            json.dumps(
                {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            )
            + "\n"
            for q, a in FACTS.items()
        )
    )
    out = base.root / "trained-prefill"
    train(
        TrainConfig(
            data=data,
            model=base.model,
            out=out,
            adapter=AdapterSpec(rank=8),
            max_steps=60,
            batch_size=len(FACTS),
            learning_rate=1e-2,
            progress=False,
        ),
        say=lambda _: None,
    )
    return out


def preft(registry: Registry, api_key: str, *argv: str) -> dict[str, object]:
    env = {**os.environ, "PREFT_REGISTRY_URL": registry.url, "PREFT_API_KEY": api_key}
    done = subprocess.run(
        [sys.executable, "-m", "preft_serve.cli", "--json", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_trained_adapter_answers_through_the_gateway(
    gateway: ServiceProcess, registry: Registry, adapter: Path
) -> None:
    api_key = registry.create_tenant("trainer")
    stored = preft(
        registry, api_key, "adapter", "upload", str(adapter), "--name", "facts", "--mode", "prefill"
    )
    assert stored["type"] == "lora" and stored["mode"] == "prefill"
    preft(registry, api_key, "user", "bind", "dana", "facts")

    def ask(question: str, max_tokens: int, **who: str) -> str:
        reply = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            timeout=120,
            headers={"Authorization": f"Bearer {api_key}"},
            json={
                "model": BASE_NAME,
                "messages": [{"role": "user", "content": question}],
                "max_tokens": max_tokens,
                "temperature": 0,
                **who,
            },
        )
        assert reply.status_code == 200, reply.text
        return str(reply.json()["choices"][0]["message"]["content"])

    for question, answer in FACTS.items():
        want = answer + "\n"  # the toy template ends a turn with "\n"; one byte, one token
        assert ask(question, len(want), user="dana") == want
        assert ask(question, len(want)) != want  # the base model does not know it
