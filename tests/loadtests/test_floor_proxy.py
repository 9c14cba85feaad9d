"""The gateway benchmark's floor reference (``loadtests/floor_proxy.py``) must really proxy:
every answer it returns is the upstream's, whole or streamed, with the request's ``model``
carried through. A floor that answered without the upstream would make the gateway look
expensive by comparison."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from preft_serve.localstack import LocalStack, StackConfig

from loadtests.stack_setup import start_fake_upstream, start_floor_proxy


def test_floor_proxy_relays_whole_and_streamed_answers(tmp_path: Path) -> None:
    stack = LocalStack(StackConfig(var=tmp_path), say=lambda _: None)
    try:
        upstream = start_fake_upstream(stack)
        floor = start_floor_proxy(stack, upstream.url)
        body = {"model": "sha256:abc", "prompt": "hi", "max_tokens": 5}
        whole = httpx.post(f"{floor.url}/v1/completions", json=body, timeout=30)
        direct = httpx.post(f"{upstream.url}/v1/completions", json=body, timeout=30)
        assert whole.status_code == 200
        got, want = whole.json(), direct.json()
        assert got["model"] == "sha256:abc" and got["choices"] == want["choices"]
        chat = {"model": "m1", "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 3, "stream": True}
        with httpx.stream("POST", f"{floor.url}/v1/chat/completions", json=chat,
                          timeout=30) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert [c["choices"][0]["delta"]["content"] for c in chunks] == ["x", "x", "x"]
        assert {c["model"] for c in chunks} == {"m1"}
    finally:
        stack.stop()
