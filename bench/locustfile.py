"""Locust users against the gateway: many end users across thousands of bound adapters.

Every request picks a random (tenant key, user id) from the plan written by
``python -m bench.loadtest`` (``PREFT_LOADTEST_PLAN``), so requests spread over all
bound adapters: uniformly, or with the plan's ``zipf`` > 0 with Zipf popularity
(:mod:`bench.popularity`, ranks and each locust user's draws seeded by the plan's
``seed``); a fraction are streamed. Each sample keeps the gateway's ``X-Request-Id``
(the runner finds the request's gateway-side time by it in the access log). Besides
locust's own stats (``chat``: whole non-streamed requests; ``chat (stream) headers``:
streamed requests until the response headers only, locust's way; ``TTFT chat (stream)``:
time to the first generated text),
every request is kept as one sample and written as JSON lines to
``PREFT_LOADTEST_SAMPLES`` when locust quits; the runner's summary is computed from those.

    PREFT_LOADTEST_PLAN=plan.json PREFT_LOADTEST_SAMPLES=samples.jsonl \
      locust -f bench/locustfile.py --headless -u 50 -r 10 -t 60s --host http://gw:8080
"""

from __future__ import annotations

import itertools
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from locust import HttpUser, events, task

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # locust -f from anywhere
from bench.popularity import Zipf

PLAN: dict[str, Any] = (
    json.loads(Path(os.environ["PREFT_LOADTEST_PLAN"]).read_text())
    if os.environ.get("PREFT_LOADTEST_PLAN")
    else {}
)
SAMPLES: list[dict[str, Any]] = []
SEED = int(PLAN.get("seed", 0))
ZIPF = (
    Zipf(len(PLAN["users"]), float(PLAN["zipf"]), SEED)
    if float(PLAN.get("zipf", 0.0)) > 0
    else None
)
_USER_NUMBERS = itertools.count()
WORDS = (
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "wizards",
    "quietly",
    "judge",
    "boxing",
    "matches",
    "near",
    "the",
    "old",
    "harbour",
)


def _prompt(rng: random.Random) -> str:
    low, high = PLAN.get("prompt_words", [4, 40])
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def _error_type(status: int, body: bytes) -> str:
    """``http_<status>`` plus the gateway's error code when the body has one."""
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return f"http_{status}"
    return f"http_{status}:{code}"


class ChatUser(HttpUser):
    """An end user of some tenant's app, sending chat completions back to back."""

    def on_start(self) -> None:
        self.rng = random.Random(f"{SEED}:{next(_USER_NUMBERS)}")
        self.model = PLAN.get("model", "base")
        self.stream_fraction = float(PLAN.get("stream_fraction", 0.5))
        self.max_tokens = PLAN.get("max_tokens", [8, 32])

    def wait_time(self) -> float:
        return float(PLAN.get("think_time_s", 0.0))

    @task
    def chat(self) -> None:
        users = PLAN["users"]
        api_key, user = users[ZIPF.pick(self.rng)] if ZIPF is not None else self.rng.choice(users)
        stream = self.rng.random() < self.stream_fraction
        body: dict[str, Any] = {
            "model": self.model,
            "user": user,
            "temperature": 0,
            "ignore_eos": True,
            "max_tokens": self.rng.randint(*self.max_tokens),
            "messages": [{"role": "user", "content": _prompt(self.rng)}],
        }
        headers = {"Authorization": f"Bearer {api_key}"}
        sample: dict[str, Any] = {
            "t": time.time(),
            "stream": stream,
            "user": user,
            "error": None,
            "tokens": 0,
            "ttft_s": None,
            "id": None,
        }
        start = time.perf_counter()
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
            self._stream(body, headers, sample, start)
        else:
            self._block(body, headers, sample)
        sample["latency_s"] = time.perf_counter() - start
        SAMPLES.append(sample)

    def _block(self, body: dict[str, Any], headers: dict[str, str], sample: dict[str, Any]) -> None:
        with self.client.post(
            "/v1/chat/completions", json=body, headers=headers, name="chat", catch_response=True
        ) as resp:
            sample["id"] = resp.headers.get("x-request-id")
            if resp.status_code != 200:
                sample["error"] = (
                    _error_type(resp.status_code, resp.content)
                    if resp.status_code
                    else type(resp.error).__name__
                )
                resp.failure(sample["error"])
                return
            usage = resp.json().get("usage") or {}
            sample["tokens"] = int(usage.get("completion_tokens") or 0)
            if sample["tokens"] == 0:
                sample["error"] = "no_tokens"
                resp.failure("no completion tokens")

    def _stream(
        self, body: dict[str, Any], headers: dict[str, str], sample: dict[str, Any], start: float
    ) -> None:
        with self.client.post(
            "/v1/chat/completions",
            json=body,
            headers=headers,
            name="chat (stream) headers",
            stream=True,
            catch_response=True,
        ) as resp:
            sample["id"] = resp.headers.get("x-request-id")
            if resp.status_code != 200:
                sample["error"] = (
                    _error_type(resp.status_code, resp.content)
                    if resp.status_code
                    else type(resp.error).__name__
                )
                resp.failure(sample["error"])
                return
            try:
                for line in resp.iter_lines():
                    if not line.startswith(b"data: ") or line == b"data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        sample["error"] = "stream_error"
                        break
                    choices = event.get("choices") or []
                    if (
                        sample["ttft_s"] is None
                        and choices
                        and (choices[0].get("delta") or {}).get("content")
                    ):
                        sample["ttft_s"] = time.perf_counter() - start
                    if event.get("usage"):
                        sample["tokens"] = int(event["usage"].get("completion_tokens") or 0)
            except Exception as exc:  # noqa: BLE001 (a broken stream is a result, not a crash)
                sample["error"] = f"stream_{type(exc).__name__}"
            if sample["error"] is None and not sample["tokens"]:
                sample["error"] = "no_tokens"
            if sample["error"]:
                resp.failure(sample["error"])
                return
        if sample["ttft_s"] is None:
            # Tokens were generated but no text arrived: the demo model's byte tokenizer can
            # emit bytes that never form valid UTF-8. A success without a TTFT.
            return
        events.request.fire(
            request_type="TTFT",
            name="chat (stream)",
            response_time=sample["ttft_s"] * 1000,
            response_length=0,
            exception=None,
            context={},
        )


@events.quitting.add_listener
def _write_samples(environment: Any, **_: Any) -> None:
    path = os.environ.get("PREFT_LOADTEST_SAMPLES")
    if path:
        Path(path).write_text("".join(json.dumps(s) + "\n" for s in SAMPLES))
