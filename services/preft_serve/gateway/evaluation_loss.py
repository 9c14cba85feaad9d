"""Metric ``loss``: the expected answers scored with PreFT semantics through this gateway's
own serving path.

``/tokenize`` gives each example's prompt ids (with the generation prompt) and the whole
conversation's; per version, a ``/v1/completions`` of the whole ids with ``max_tokens`` 1,
``prompt_logprobs`` 0 and the adapter boundary at the prompt's end
(``common.adapter_boundary``: the worker runs the answer's tokens on the base model over the
adapted prompt's KV) gives each answer token's log-probability. A version's loss is its
summed negative log-probabilities over the summed answer tokens (token-weighted; the
registry divides). The boundary is worker-internal: only requests sent from this module's
tasks may carry it (``validation.GATEWAY_XARGS``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from typing import Any

import httpx

from preft_serve.common.adapter_boundary import ADAPTER_TOKENS_XARG
from preft_serve.common.evaluation_wire import Example
from preft_serve.gateway.evaluation_calls import CONCURRENCY, error, post
from preft_serve.gateway.validation import GATEWAY_XARGS, XARGS


@dataclasses.dataclass(frozen=True)
class Scored:
    """One example as token ids: the prompt's (with the generation prompt) and the whole
    conversation's, which starts with them."""

    line: int
    prompt: list[int]
    full: list[int]


def _ids(payload: dict[str, Any]) -> list[int]:
    tokens = payload.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise error(502, "the worker's /tokenize answer has no token ids", "evaluation_failed")
    return tokens


async def _tokenized(client: httpx.AsyncClient, model: str, example: Example, line: int) -> Scored:
    """The example's ids through the worker's tokenizer and chat template; refused when the
    template does not render the prompt as a prefix of the conversation."""
    asked = {"model": model, "messages": example.messages, "add_generation_prompt": True}
    prompt = _ids(await post(client, "/tokenize", asked, model, line))
    whole = [*example.messages, {"role": "assistant", "content": example.expected}]
    asked = {"model": model, "messages": whole, "add_generation_prompt": False}
    full = _ids(await post(client, "/tokenize", asked, model, line))
    if len(full) <= len(prompt) or full[: len(prompt)] != prompt:
        raise error(
            400,
            f"example {line}: the model's chat template does not render the prompt (with "
            "its generation prompt) as the start of the conversation with the expected "
            "answer, so the answer's tokens cannot be scored; use metric exact or contains",
            "evaluation_failed",
        )
    return Scored(line, prompt, full)


async def _nll(client: httpx.AsyncClient, model: str, scored: Scored) -> float:
    """Summed negative log-probability of the example's answer tokens on ``model``, the
    adapter on the prompt only (the boundary at the prompt's end)."""
    body = {
        "model": model,
        "prompt": scored.full,
        "max_tokens": 1,
        "temperature": 0,
        "prompt_logprobs": 0,
        XARGS: {ADAPTER_TOKENS_XARG: len(scored.prompt)},
    }
    payload = await post(client, "/v1/completions", body, model, scored.line)
    rows = payload["choices"][0].get("prompt_logprobs")
    if not isinstance(rows, list) or len(rows) != len(scored.full):
        raise error(
            502, f"example {scored.line} on {model}: no prompt logprobs", "evaluation_failed"
        )
    total = 0.0
    for position in range(len(scored.prompt), len(scored.full)):
        entry = (rows[position] or {}).get(str(scored.full[position]))
        logprob = entry.get("logprob") if isinstance(entry, dict) else None
        if not isinstance(logprob, int | float) or not math.isfinite(logprob):
            raise error(
                502,
                f"example {scored.line} on {model}: no finite logprob for answer token "
                f"{position - len(scored.prompt)}",
                "evaluation_failed",
            )
        total -= float(logprob)
    return total


async def _loss(client: httpx.AsyncClient, model: str, examples: list[Scored]) -> float:
    """Summed negative log-probability of every example's answer tokens on ``model``."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(scored: Scored) -> float:
        GATEWAY_XARGS.set(frozenset({ADAPTER_TOKENS_XARG}))  # this task's context only
        async with gate:
            return await _nll(client, model, scored)

    return math.fsum(await asyncio.gather(*(one(s) for s in examples)))


async def _tokenize_all(
    client: httpx.AsyncClient, model: str, examples: list[Example]
) -> list[Scored]:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(line: int, example: Example) -> Scored:
        async with gate:
            return await _tokenized(client, model, example, line)

    return list(await asyncio.gather(*(one(n, e) for n, e in enumerate(examples, 1))))


async def measure_loss(
    client: httpx.AsyncClient, name: str, version: int, serving: int, examples: list[Example]
) -> dict[str, Any]:
    """Summed nats and answer tokens for the version and the serving one (the tokenizer is
    the base model's, so both score the same tokens)."""
    scored = await _tokenize_all(client, f"{name}@{version}", examples)
    tokens = sum(len(s.full) - len(s.prompt) for s in scored)
    loss = await _loss(client, f"{name}@{version}", scored)
    serving_loss = loss if serving == version else await _loss(client, f"{name}@{serving}", scored)
    return {
        "loss_sum": loss,
        "tokens": tokens,
        "serving_loss_sum": serving_loss,
        "serving_tokens": tokens,
    }
