"""The gateway benchmark's floor reference (``bench/floor_proxy.py``) must really proxy:
every answer it returns is the upstream's, whole or streamed, with the request's ``model``
carried through. A floor that answered without the upstream would make the gateway look
expensive by comparison."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from bench.stack_setup import start_fake_upstream, start_floor_proxy
from preft_serve.onebox import OneBox, StackConfig


def test_floor_proxy_relays_whole_and_streamed_answers(tmp_path: Path) -> None:
    stack = OneBox(StackConfig(var=tmp_path), say=lambda _: None)
    try:
        upstream = start_fake_upstream(stack)
        floor = start_floor_proxy(stack, upstream.url)
        body = {"model": "sha256:abc", "prompt": "hi", "max_tokens": 5}
        whole = httpx.post(f"{floor.url}/v1/completions", json=body, timeout=30)
        direct = httpx.post(f"{upstream.url}/v1/completions", json=body, timeout=30)
        assert whole.status_code == 200
        got, want = whole.json(), direct.json()
        assert got["model"] == "sha256:abc" and got["choices"] == want["choices"]
        chat = {
            "model": "m1",
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 3,
            "stream": True,
        }
        with httpx.stream(
            "POST", f"{floor.url}/v1/chat/completions", json=chat, timeout=30
        ) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert [c["choices"][0]["delta"]["content"] for c in chunks] == ["x", "x", "x"]
        assert {c["model"] for c in chunks} == {"m1"}
    finally:
        stack.stop()


def test_the_floor_takes_its_turn_in_the_gateways_rounds(tmp_path: Path) -> None:
    """``make bench-gateway`` reads the gateway's CPU against the floor's round by round,
    the floor a third side in the same rotation. With the same proxy as both "gateway"
    and "floor", the per-round ratio must come out near 1: the two sides are measured
    alike."""
    import asyncio
    import dataclasses

    from bench.gateway_bench import direct_target, request_mix, throughput
    from bench.stack_setup import BoundUser

    stack = OneBox(StackConfig(var=tmp_path), say=lambda _: None)
    try:
        upstream = start_fake_upstream(stack)
        floor = start_floor_proxy(stack, upstream.url)
        users = [BoundUser("k", f"u{i}", f"a{i}", f"{i:064x}", "prefill") for i in range(4)]
        reqs = request_mix(users, 150, (4, 8))
        proxy = direct_target(floor.url)
        got = asyncio.run(
            throughput(
                direct_target(upstream.url),
                dataclasses.replace(proxy, label="gateway"),
                reqs,
                rounds=3,
                concurrency=4,
                cpu={"gateway": [floor.pid], "floor": [floor.pid], "upstream": [upstream.pid]},
                floor=dataclasses.replace(proxy, label="floor"),
            )
        )
    finally:
        stack.stop()
    assert [row["first"] for row in got["rounds"]] == ["direct", "gateway", "floor"]
    for row in got["rounds"]:
        assert row["floor_floor_cpu_ms"] > 0 and row["gateway_gateway_cpu_ms"] > 0
        # The proxy idles during the direct side's batch.
        assert row["direct_gateway_cpu_ms"] < 0.5 * row["gateway_gateway_cpu_ms"]
    assert 0.5 < got["gateway_to_floor_cpu_median_of_rounds"] < 2.0
    assert got["floor_cpu_ms_per_request"] > 0
