"""A streamed request's usage, counted exactly once however its stream ends.

A worker starts on a request as soon as it has it, and the gateway sends the client the
answer's headers before the worker's first chunk. The usage the worker reports in its chunks
(``continuous_usage_stats``: the running totals on every chunk, the prompt's count on the
first) counts a stream that ends early, but only once one chunk arrived: a client that
leaves right after the headers, or a stream that breaks before its first chunk (and every
``/v1/responses`` stream that ends before its final event: vLLM reports no running usage
there) would be billed nothing, though the worker took the request and its prompt. After
such a stream the bill asks a worker's ``/tokenize`` for the prompt's count (only then,
and after the worker's stream was closed, so vLLM has already aborted the request) and
counts the request, that prompt, and the output the client was sent.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from preft_serve.gateway.proxy import Upstream

logger = logging.getLogger(__name__)
# What counts a request's prompt tokens when its stream reported none (gateway.prompt_count).
PromptCounter = Callable[[], Awaitable[int | None]]


class StreamBill:
    """Counts one request's usage once: the worker's (:meth:`usage`), else at the end
    the request, its prompt's tokens and the output relayed (:meth:`settle`)."""

    def __init__(self, count: Callable[[Any], None], prompt_tokens: PromptCounter) -> None:
        self._count = count
        self._prompt_tokens = prompt_tokens
        self.counted = False
        self.relayed_tokens = 0  # output relayed, for streams without running totals

    def usage(self, usage: Any) -> None:
        """The worker's usage for the request (its last running totals, or the final)."""
        if not self.counted:
            self.counted = True
            self._count(usage)

    async def settle(self) -> None:
        """The stream is over: bill it from the prompt's count if the worker reported no
        usage for it. A prompt the worker cannot count now still bills the request."""
        if self.counted:
            return
        self.counted = True
        prompt = await self._prompt_tokens()
        if prompt is None:
            logger.warning(
                "a stream that ended before its usage was billed without its "
                "prompt's tokens: no worker counted them"
            )
        self._count({"prompt_tokens": prompt, "completion_tokens": self.relayed_tokens})


async def close_and_settle(upstream: Upstream, bill: StreamBill) -> None:
    """A stream's last step (its response's background task, which runs also when the
    client left before the first byte): release the worker, vLLM aborting what is left,
    then :meth:`StreamBill.settle`."""
    try:
        await upstream.aclose()
    finally:
        await bill.settle()
