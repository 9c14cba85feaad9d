"""The tenant a request is served for, as the gateway tells the worker.

The gateway adds ``vllm_xargs: {"preft_tenant": <tenant>}`` to a request for an adapter
applied to every token, and vLLM carries it to the scheduler in the request's
``SamplingParams.extra_args``; the worker bounds each tenant's share of its adapter slots
by it (:mod:`preft_serve.worker.decode_slots`), which no gateway replica alone could do.
Clients cannot set it (``gateway/validation.py``). Shared by the gateway, which sends it,
and the worker, which reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TENANT_XARG = "preft_tenant"


def with_tenant(body: dict[str, Any], tenant: str) -> None:
    """Name ``tenant`` in the ``vllm_xargs`` of a request ``body`` bound for a worker."""
    xargs = body.get("vllm_xargs")
    body["vllm_xargs"] = {**(xargs if isinstance(xargs, dict) else {}), TENANT_XARG: tenant}


def tenant_of(extra_args: Mapping[str, Any] | None) -> str | None:
    """The tenant a request's extra arguments name, or None (a request sent to the worker
    directly, or by an older gateway)."""
    value = extra_args.get(TENANT_XARG) if extra_args else None
    return value if isinstance(value, str) and value else None
