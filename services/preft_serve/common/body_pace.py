"""A request body that must keep arriving, and an answer that must keep being read.

An upload holds a connection (the gateway's to the registry) or a transfer slot and scratch
disk (the registry's) for as long as the client takes to send it; a client that sends a few
bytes and stalls would hold it until the connection dies. :func:`paced` (an iterator of
chunks) and :func:`paced_receive` (an ASGI ``receive``) cut such a body off with 408:
nothing for ``idle_s``, or on average slower than ``min_rate`` bytes per second once
``idle_s`` has passed. Only time spent waiting for the client counts, not time the server
took to handle what came. :func:`paced_send` is the same bound on a client that stops
reading an answer, or reads it too slowly: the answer is cut off.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from starlette.types import Message, Receive, Send

from preft_serve.common.errors import ServiceError


class BodyTooSlow(ServiceError):
    """The client stopped sending its body, or sent it too slowly."""

    http_status = 408
    code = "request_timeout"


class ReaderStalled(Exception):
    """The client stopped reading the answer: it is cut off (no status can be sent)."""


class _Pace:
    """How long the next wait for the client may last, from what came so far."""

    def __init__(self, idle_s: float, min_rate: float) -> None:
        self.idle_s, self.min_rate = idle_s, min_rate
        self.received, self.waited = 0, 0.0

    def allowed(self) -> float:
        allowed = self.idle_s
        if self.min_rate > 0:
            allowed = min(allowed, self.idle_s + self.received / self.min_rate - self.waited)
        return max(allowed, 0.0)

    def came(self, size: int, waited: float) -> None:
        self.received += size
        self.waited += waited

    def stalled(self, allowed: float) -> bool:
        """Whether a wait of ``allowed`` that ran out was the idle bound, not the rate's
        (nothing came yet, or the full pause was allowed)."""
        return self.received == 0 or allowed >= self.idle_s

    def too_slow(self, allowed: float) -> BodyTooSlow:
        idle_s, min_rate = self.idle_s, self.min_rate
        rate = f"at least {min_rate:g} bytes per second on average" if min_rate > 0 else ""
        if self.stalled(allowed):
            what = f"the request body stopped arriving: nothing for {idle_s:g} s"
        else:
            what = f"the request body arrived too slowly: {self.received} bytes, under {rate}"
        rule = f"a body must keep coming (a pause of at most {idle_s:g} s" + (
            f", {rate} after that)" if rate else ")"
        )
        return BodyTooSlow(f"{what}; {rule}. Nothing was stored: send it again")


async def paced(
    chunks: AsyncIterator[bytes], idle_s: float, min_rate: float
) -> AsyncIterator[bytes]:
    """``chunks`` as they come, or :class:`BodyTooSlow` once the client is too slow."""
    pace = _Pace(idle_s, min_rate)
    iterator = aiter(chunks)
    while True:
        allowed = pace.allowed()
        started = time.monotonic()
        try:
            chunk = await asyncio.wait_for(anext(iterator), allowed)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise pace.too_slow(allowed) from None
        pace.came(len(chunk), time.monotonic() - started)
        yield chunk


def paced_receive(receive: Receive, idle_s: float, min_rate: float) -> Receive:
    """``receive`` that raises :class:`BodyTooSlow` once the client is too slow (an
    ``HTTPException``: FastAPI re-raises it from body parsing and renders the 408)."""
    pace = _Pace(idle_s, min_rate)

    async def timed() -> Message:
        allowed = pace.allowed()
        started = time.monotonic()
        try:
            message = await asyncio.wait_for(receive(), allowed)
        except TimeoutError:
            raise pace.too_slow(allowed) from None
        if message["type"] == "http.request":
            pace.came(len(message.get("body", b"")), time.monotonic() - started)
        return message

    return timed


def paced_send(send: Send, idle_s: float, min_rate: float) -> Send:
    """``send`` that raises :class:`ReaderStalled` when the client stops reading: a
    message that cannot go out within ``idle_s``, or the answer read on average slower
    than ``min_rate`` bytes per second once ``idle_s`` has passed (only time spent waiting
    for the client counts)."""
    pace = _Pace(idle_s, min_rate)

    async def timed(message: Message) -> None:
        allowed = pace.allowed()
        started = time.monotonic()
        try:
            await asyncio.wait_for(send(message), allowed)
        except TimeoutError:
            if pace.stalled(allowed):
                raise ReaderStalled(f"the client read nothing for {idle_s:g} s") from None
            raise ReaderStalled(
                f"the client read {pace.received} bytes, under {min_rate:g} bytes per second "
                "on average"
            ) from None
        pace.came(len(message.get("body", b"")), time.monotonic() - started)

    return timed
