"""The SSE relay rewrites ``model`` as bytes and parses only the events that matter; what
the client gets is what a parse-and-dump of every event would give."""

from __future__ import annotations

import json
from typing import Any

import pytest

from preft_serve.gateway.proxy import EventRewriter

WORKER = "sha256:" + "ab" * 32


def vllm_chunk(
    content: str | None, usage: dict[str, int] | None = None, choices: bool = True
) -> bytes:
    """A chunk as vLLM 0.32 writes it (pydantic model_dump_json: compact, field order)."""
    chunk: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": WORKER,
    }
    chunk["choices"] = (
        [{"index": 0, "delta": {"content": content}, "logprobs": None, "finish_reason": None}]
        if choices
        else []
    )
    if usage is not None:
        chunk["usage"] = usage
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode()


def stream() -> list[bytes]:
    return [
        vllm_chunk(""),
        vllm_chunk("Hel"),
        vllm_chunk('lo "model":"x" usage'),
        vllm_chunk("!"),
        vllm_chunk(
            None, {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}, choices=False
        ),
        b"data: [DONE]",
    ]


def relay(public: str, strip_usage: bool) -> tuple[list[bytes], list[Any], list[int]]:
    usages: list[Any] = []
    rewriter = EventRewriter(WORKER, public, strip_usage, usages.append)
    out, firsts = [], []
    for i, event in enumerate(stream()):
        rewritten, first = rewriter.rewrite(event)
        if first:
            firsts.append(i)
        if rewritten is not None:
            out.append(rewritten)
    rewriter.finish()
    return out, usages, firsts


@pytest.mark.parametrize("public", ["bot", 'ünï "quoted" bot'])
@pytest.mark.parametrize("strip_usage", [False, True])
def test_events_read_as_if_each_were_parsed_and_rewritten(public: str, strip_usage: bool) -> None:
    out, usages, firsts = relay(public, strip_usage)
    expected = []
    for event in stream():
        if event == b"data: [DONE]":
            expected.append(event)
            continue
        payload = json.loads(event[6:])
        if strip_usage and payload.get("usage") and not payload["choices"]:
            continue
        payload["model"] = public
        expected.append(payload)
    assert len(out) == len(expected)
    for got, want in zip(out, expected, strict=True):
        if isinstance(want, bytes):
            assert got == want
        else:
            assert got.startswith(b"data: ") and json.loads(got[6:]) == want
    assert usages == [{"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}]
    assert firsts == [1]  # the empty first delta is not the first token


def test_text_events_after_the_first_pass_through_as_the_worker_wrote_them() -> None:
    """Byte-identical but for the name: no parse, so no reordering or re-escaping."""
    out, _, _ = relay("bot", strip_usage=False)
    for got, sent in zip(out[2:4], stream()[2:4], strict=True):
        assert got == sent.replace(f'"model":"{WORKER}"'.encode(), b'"model":"bot"')
    assert b'"model":"x"' in json.loads(out[2][6:])["choices"][0]["delta"]["content"].encode()


def test_continuous_usage_stats_count_the_stream_once() -> None:
    """With ``continuous_usage_stats`` vLLM puts running totals on every chunk: the stream
    is counted once, with the final totals, not once per chunk."""
    events = [
        vllm_chunk(c, usage={"prompt_tokens": 5, "completion_tokens": i + 1, "total_tokens": 6 + i})
        for i, c in enumerate("abc")
    ]
    events.append(
        vllm_chunk(
            None,
            usage={"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
            choices=False,
        )
    )
    usages: list[Any] = []
    rewriter = EventRewriter(WORKER, "bot", False, usages.append)
    out = [rewriter.rewrite(e)[0] for e in events]
    assert usages == []  # nothing counted before the stream ends
    out.append(rewriter.rewrite(b"data: [DONE]")[0])  # counted before [DONE] is passed on
    assert len(usages) == 1
    rewriter.finish()
    rewriter.finish()  # idempotent
    assert usages == [{"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}]
    assert all(o is not None for o in out)  # the client asked for usage: all passed on


def running_totals(contents: str) -> list[bytes]:
    """Chunks as vLLM writes them with ``continuous_usage_stats``: totals on every one."""
    return [
        vllm_chunk(c, usage={"prompt_tokens": 5, "completion_tokens": i + 1, "total_tokens": 6 + i})
        for i, c in enumerate(contents)
    ]


@pytest.mark.parametrize("strip_usage", [False, True])
def test_running_totals_the_client_did_not_ask_for_are_cut_as_bytes(strip_usage: bool) -> None:
    """The gateway asks for running totals to count streams that end early; a client that
    did not ask gets each chunk as a parse-and-drop-usage would give it."""
    events = [
        vllm_chunk(""),
        *running_totals("abc"),
        vllm_chunk(
            None,
            usage={"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
            choices=False,
        ),
        b"data: [DONE]",
    ]
    usages: list[Any] = []
    rewriter = EventRewriter(WORKER, "bot", strip_usage, usages.append, keep_chunk_usage=False)
    out = [rewriter.rewrite(e)[0] for e in events]
    rewriter.finish()
    for got, sent in zip(out[1:4], events[1:4], strict=True):
        want = json.loads(sent[6:])
        del want["usage"]
        want["model"] = "bot"
        assert got is not None and b'"usage"' not in got and json.loads(got[6:]) == want
    assert (out[4] is None) == strip_usage  # the final usage chunk: only if asked for
    assert usages == [{"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}]


def test_a_stream_that_ends_early_is_counted_up_to_its_last_totals() -> None:
    usages: list[Any] = []
    rewriter = EventRewriter(WORKER, "bot", True, usages.append, keep_chunk_usage=False)
    for event in running_totals("abcd")[:2]:  # the client leaves after two tokens
        rewriter.rewrite(event)
    rewriter.finish()
    assert usages == [{"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}]
