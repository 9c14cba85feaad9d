"""Seam 10, vLLM's tokenizer routes (``vllm/entrypoints/serve/tokenize/``, vLLM 0.32.0):
``/tokenize`` and ``/detokenize`` held to what a completion's prompt is held to.

Stock, both ignore the model's context (their ``build_tok_params`` pass
``max_total_tokens=None``): a 1 MB prompt is tokenized whole and answered with a million
ids, serialized on the server's event loop while every other request on the worker waits.
And ``/detokenize`` decodes ids outside the vocabulary to nothing (200, empty text) where a
completion with such a prompt is a 400. :func:`install`:

- gives ``/tokenize`` requests (text and chat) the model's context as ``max_total_tokens``,
  so vLLM's own prompt checks apply as for a completion: a text longer than the context
  times the longest token is refused before it is tokenized, the encoding stops one token
  past the context, and a longer prompt is vLLM's context-length 400;
- refuses a ``/detokenize`` before decoding when it holds more ids than the context or an
  id outside the vocabulary (400, ``param`` "tokens", naming the id and the vocabulary's
  size: the tokenizer's or the model's, whichever is larger, as
  ``BaseRenderer.validate_token_ids`` counts it for a completion's token ids).

Relies on: ``TokenizeCompletionRequest``/``TokenizeChatRequest.build_tok_params(model_config)``
returning a frozen dataclass ``TokenizeParams`` (``dataclasses.replace``), read by
``OnlineRenderer.preprocess_completion``/``preprocess_chat``;
``ServingTokenization.create_detokenize(request, raw_request)`` with ``self.renderer.tokenizer``
(``max_token_id``; None when the server skips its tokenizer), ``self.model_config``
(``max_model_len``, ``get_vocab_size()``) and ``self.create_error_response(message,
param=...)``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

PATCHED = "_preft_bounded"


def detokenize_refusal(
    tokens: Sequence[int], max_model_len: int, vocab_size: int | None
) -> str | None:
    """Why a ``/detokenize`` of ``tokens`` is refused, or None (``vocab_size`` None: the
    vocabulary is not known, only the length is checked)."""
    if len(tokens) > max_model_len:
        return (
            f"'tokens' holds {len(tokens)} token ids, more than the model's context "
            f"length of {max_model_len} tokens; send at most {max_model_len}"
        )
    if vocab_size is not None:
        outside = next((t for t in tokens if not 0 <= t < vocab_size), None)
        if outside is not None:
            return (
                f"token id {outside} is outside the vocabulary of {vocab_size} tokens; "
                f"token ids run from 0 to {vocab_size - 1}"
            )
    return None


def vocabulary_size(serving: Any) -> int | None:
    """The ids a completion's prompt may hold: the tokenizer's or the model's vocabulary,
    whichever is larger (they differ for some models, e.g. Qwen's padded embeddings)."""
    tokenizer = serving.renderer.tokenizer
    if tokenizer is None:
        return None
    return max(int(tokenizer.max_token_id) + 1, int(serving.model_config.get_vocab_size()))


def _within_context(stock: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    @functools.wraps(stock)
    def build_tok_params(self: Any, model_config: Any) -> Any:
        params = stock(self, model_config)
        if params.max_total_tokens is None:
            params = dataclasses.replace(params, max_total_tokens=model_config.max_model_len)
        return params

    setattr(build_tok_params, PATCHED, True)
    return build_tok_params


def _checked_detokenize(stock: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(stock)
    async def create_detokenize(self: Any, request: Any, raw_request: Any) -> Any:
        refusal = detokenize_refusal(
            request.tokens, self.model_config.max_model_len, vocabulary_size(self)
        )
        if refusal is not None:
            return self.create_error_response(refusal, param="tokens")
        return await stock(self, request, raw_request)

    setattr(create_detokenize, PATCHED, True)
    return create_detokenize


@functools.cache
def install() -> None:
    """Bound the tokenizer routes (once per process; the API server's)."""
    from vllm.entrypoints.serve.tokenize import protocol
    from vllm.entrypoints.serve.tokenize.serving import ServingTokenization

    request_class: Any
    for request_class in (protocol.TokenizeCompletionRequest, protocol.TokenizeChatRequest):
        if not getattr(request_class.build_tok_params, PATCHED, False):
            request_class.build_tok_params = _within_context(request_class.build_tok_params)
    if not getattr(ServingTokenization.create_detokenize, PATCHED, False):
        ServingTokenization.create_detokenize = _checked_detokenize(  # type: ignore[method-assign]
            ServingTokenization.create_detokenize
        )
