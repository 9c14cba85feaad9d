"""A forwarded request body that must keep arriving.

An upload streamed to the registry holds a registry connection for as long as the client
takes to send it; a client that sends a few bytes and stalls would hold it for the whole
read timeout. :func:`paced` cuts such a body off with 408: nothing for ``idle_s``, or on
average slower than ``min_rate`` bytes per second once ``idle_s`` has passed. Only time
spent waiting for the client counts, not time the registry took to read what came.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from preft_serve.common.errors import ServiceError


class BodyTooSlow(ServiceError):
    """The client stopped sending its body, or sent it too slowly."""

    http_status = 408
    code = "request_timeout"


async def paced(
    chunks: AsyncIterator[bytes], idle_s: float, min_rate: float
) -> AsyncIterator[bytes]:
    """``chunks`` as they come, or :class:`BodyTooSlow` once the client is too slow."""
    received, waited = 0, 0.0
    iterator = aiter(chunks)
    while True:
        allowed = idle_s
        if min_rate > 0:
            allowed = min(allowed, idle_s + received / min_rate - waited)
        started = time.monotonic()
        try:
            chunk = await asyncio.wait_for(anext(iterator), max(allowed, 0.0))
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise _too_slow(received, idle_s, min_rate, stalled=allowed >= idle_s) from None
        waited += time.monotonic() - started
        received += len(chunk)
        yield chunk


def _too_slow(received: int, idle_s: float, min_rate: float, stalled: bool) -> BodyTooSlow:
    rate = f"at least {min_rate:g} bytes per second on average" if min_rate > 0 else ""
    if stalled:
        what = f"the request body stopped arriving: nothing for {idle_s:g} s"
    else:
        what = f"the request body arrived too slowly: {received} bytes, under {rate}"
    rule = f"a body must keep coming (a pause of at most {idle_s:g} s" + (
        f", {rate} after that)" if rate else ")"
    )
    return BodyTooSlow(f"{what}; {rule}. Nothing was stored: send it again")
