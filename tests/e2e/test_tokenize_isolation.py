"""One tenant's large ``/tokenize`` calls leave another tenant's chat on the same worker
as fast as it is alone.

Tenant A, limited to 1 request/s in the registry, sends prompts just under the gateway's
body limit and just over it from several threads at once; tenant B's chat latency is
measured alone and then while A sends, side by side in one test. A's bodies over the limit
are 413 at the gateway, those over its rate 429, and the few that reach the worker are
refused before they are tokenized (longer than the context could hold): none is answered
with a million token ids while B waits.
"""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.e2e.stack import BASE_NAME, Registry
from tests.support.processes import ServiceProcess

BODY_LIMIT = 1 << 20  # the gateway's default
UNDER = "x" * (BODY_LIMIT - 4096)  # a prompt just under the body limit
OVER = "x" * (BODY_LIMIT + 4096)
SENDERS = 4
CHATS = 6


def _chat_seconds(gateway: str, api_key: str) -> float:
    start = time.perf_counter()
    reply = httpx.post(
        f"{gateway}/v1/chat/completions",
        timeout=120,
        headers={"Authorization": f"Bearer {api_key}"},
        json={
            "model": BASE_NAME,
            "max_tokens": 16,
            "temperature": 0,
            "messages": [{"role": "user", "content": "hello there"}],
        },
    )
    assert reply.status_code == 200, reply.text
    return time.perf_counter() - start


def _latencies(gateway: str, api_key: str) -> list[float]:
    return [_chat_seconds(gateway, api_key) for _ in range(CHATS)]


def _send_until(stop: threading.Event, gateway: str, api_key: str) -> list[int]:
    """Big tokenize calls, alternately under and over the body limit, until ``stop``."""
    statuses = []
    with httpx.Client(timeout=120, headers={"Authorization": f"Bearer {api_key}"}) as client:
        while not stop.is_set():
            for prompt in (UNDER, OVER):
                statuses.append(
                    client.post(f"{gateway}/tokenize", json={"prompt": prompt}).status_code
                )
            time.sleep(0.05)
    return statuses


def test_big_tokenize_calls_of_one_tenant_leave_anothers_chat_latency_alone(
    gateway: ServiceProcess, registry: Registry
) -> None:
    sender, chatter = registry.create_tenant("tok-a"), registry.create_tenant("tok-b")
    limits = httpx.put(
        f"{registry.url}/v1/tenants/tok-a/limits",
        timeout=30,
        headers={"Authorization": f"Bearer {registry.admin}"},
        json={"tenant_rps": 1, "tenant_burst": 2},
    )
    assert limits.status_code == 200, limits.text
    _chat_seconds(gateway.url, chatter)  # warm-up
    alone = _latencies(gateway.url, chatter)

    stop = threading.Event()
    with ThreadPoolExecutor(SENDERS) as pool:
        senders = [pool.submit(_send_until, stop, gateway.url, sender) for _ in range(SENDERS)]
        time.sleep(1.0)  # A's calls are under way before B's are timed
        try:
            loaded = _latencies(gateway.url, chatter)
        finally:
            stop.set()
        statuses = [status for future in senders for status in future.result()]

    solo_p50, solo_max = statistics.median(alone), max(alone)
    report = (
        f"B's chat seconds alone {alone}, while A sends big tokenize calls {loaded}; "
        f"A's answers {sorted(set(statuses))}"
    )
    assert statistics.median(loaded) <= 3 * solo_p50 + 0.5, report
    assert max(loaded) <= 3 * solo_max + 1.5, report
    assert 200 not in statuses, report
    assert {413, 429} <= set(statuses) <= {400, 413, 429}, report
