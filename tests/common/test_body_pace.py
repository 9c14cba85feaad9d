"""A body that must keep arriving and an answer that must keep being read: the bounds the
gateway and the registry put on a slow client (``common.body_pace``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from preft_serve.common.body_pace import BodyTooSlow, ReaderStalled, paced_receive, paced_send
from tests.support.asgi import stalls_after


def _reader(delay_s: float, sent: list[int]) -> Any:
    """An ASGI send whose client takes ``delay_s`` to take each message."""

    async def send(message: dict[str, Any]) -> None:
        await asyncio.sleep(delay_s)
        sent.append(len(message.get("body", b"")))

    return send


def test_an_answer_nobody_reads_is_cut_off_after_the_idle_time() -> None:
    async def never(message: dict[str, Any]) -> None:
        await asyncio.Event().wait()

    send = paced_send(never, idle_s=0.1, min_rate=0)
    with pytest.raises(ReaderStalled, match=r"the client read nothing for 0\.1 s"):
        asyncio.run(send({"type": "http.response.body", "body": b"x"}))


def test_an_answer_read_too_slowly_is_cut_off_once_its_average_is_under_the_rate() -> None:
    """Each 1 KiB chunk takes 0.05 s to be read (~20 KB/s): under a 100 KB/s floor the
    answer may take the idle time (0.2 s) and what its bytes allow, then it is cut off."""
    sent: list[int] = []
    send = paced_send(_reader(0.05, sent), idle_s=0.2, min_rate=100_000)

    async def run() -> None:
        for _ in range(50):
            await send({"type": "http.response.body", "body": b"x" * 1024, "more_body": True})

    with pytest.raises(ReaderStalled, match="under 100000 bytes per second on average"):
        asyncio.run(run())
    assert 2 <= len(sent) <= 6  # ~0.2 s of reading, not the whole answer


def test_a_reader_at_the_rate_is_never_cut_off() -> None:
    sent: list[int] = []
    send = paced_send(_reader(0.01, sent), idle_s=0.2, min_rate=1024)

    async def run() -> None:
        for _ in range(20):
            await send({"type": "http.response.body", "body": b"x" * 1024, "more_body": True})

    asyncio.run(run())
    assert sent == [1024] * 20


def test_a_body_that_stops_is_408_naming_the_pause() -> None:
    timed = paced_receive(stalls_after(b"abc"), idle_s=0.1, min_rate=0)

    async def run() -> None:
        assert (await timed())["body"] == b"abc"
        await timed()

    with pytest.raises(BodyTooSlow, match=r"stopped arriving: nothing for 0\.1 s") as refused:
        asyncio.run(run())
    assert refused.value.status_code == 408
