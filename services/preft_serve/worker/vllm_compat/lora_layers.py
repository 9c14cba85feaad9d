"""Seam 2d, adapter slot writes: ``vllm/lora/layers/`` and ``vllm/lora/model_manager.py``
(vLLM 0.32.0), for :mod:`preft_serve.worker.slots`.

Relies on:

- ``LoRAModelManager.activate_adapter`` calling ``set_lora(index, lora_a, lora_b)`` or
  ``reset_lora(index)`` on every wrapped layer (``LoRAModelManager.modules``, reached as
  ``LRUCacheWorkerLoRAManager._adapter_manager``) for each adapter it moves into a slot.
- The ``reset_lora`` of ``BaseLinearLayerWithLoRA``, ``VocabParallelEmbeddingWithLoRA`` and
  ``LogitsProcessorWithLoRA`` zeroing exactly ``lora_{a,b}_stacked[.][index]`` (slot = first
  dimension; a tensor, or a tuple of one per slice).
- The ``set_lora`` of ``BaseLinearLayerWithLoRA`` and ``MergedColumnParallelLinearWithLoRA``
  zeroing the slot, then copying ``lora_a[i]`` / ``lora_b[i]`` into
  ``[index, 0, :rows, :cols]`` of slice ``i``.
- A single-device (``tp_size`` 1) wrapped layer's ``forward`` being its ``base_layer``'s
  plus the LoRA term computed through ``punica_wrapper``; the embedding being the only
  tracked layer that reads vLLM's punica metadata. ``LogitsProcessorWithLoRA`` is not
  called like a layer (``compute_logits``), and ``ClassificationHeadWithLoRA`` writes its
  slots otherwise: neither is bypassed, the latter not tracked.
"""

from __future__ import annotations

from typing import Any

import torch


def lora_modules(worker_manager: Any) -> list[Any] | None:
    """Every LoRA-wrapped layer of vLLM's worker LoRA manager (None: it has no model
    manager yet)."""
    adapter_manager = getattr(worker_manager, "_adapter_manager", None)
    if adapter_manager is None:
        return None
    return list(adapter_manager.modules.values())


def slot_buffers(module: Any) -> tuple[torch.Tensor, ...]:
    """The slot buffers ``set_lora`` / ``reset_lora`` write (slot = first dimension)."""
    out: list[torch.Tensor] = []
    for name in ("lora_a_stacked", "lora_b_stacked"):
        value = getattr(module, name)
        out.extend(value if isinstance(value, (tuple, list)) else (value,))
    return tuple(out)


def slot_writes_known(module: Any) -> bool:
    """Layers whose ``reset_lora`` zeroes exactly ``lora_{a,b}_stacked[.][index]`` and
    whose ``forward`` is the base layer's plus the LoRA term (single-device layers)."""
    from vllm.lora.layers import LogitsProcessorWithLoRA, VocabParallelEmbeddingWithLoRA
    from vllm.lora.layers.base_linear import BaseLinearLayerWithLoRA
    from vllm.lora.layers.classifier import ClassificationHeadWithLoRA

    if isinstance(module, ClassificationHeadWithLoRA) or getattr(module, "tp_size", 1) != 1:
        return False
    reset = type(module).reset_lora
    return reset in (BaseLinearLayerWithLoRA.reset_lora,
                     VocabParallelEmbeddingWithLoRA.reset_lora,
                     LogitsProcessorWithLoRA.reset_lora)


def set_lora_zeroes_then_copies(module: Any) -> bool:
    """``set_lora`` implementations known to copy ``lora_a[i]`` / ``lora_b[i]`` into
    ``[index, 0, :rows, :cols]`` of slice ``i`` after zeroing the slot."""
    from vllm.lora.layers import MergedColumnParallelLinearWithLoRA
    from vllm.lora.layers.base_linear import BaseLinearLayerWithLoRA

    return type(module).set_lora in (BaseLinearLayerWithLoRA.set_lora,
                                     MergedColumnParallelLinearWithLoRA.set_lora)


def is_logits_processor(module: Any) -> bool:
    """The lm_head's LoRA wrapper: it replaces the logits processor, not called like a
    layer."""
    from vllm.lora.layers import LogitsProcessorWithLoRA

    return isinstance(module, LogitsProcessorWithLoRA)


def is_embedding(module: Any) -> bool:
    """The embedding's LoRA wrapper: the one tracked layer that reads vLLM's punica
    metadata."""
    from vllm.lora.layers import VocabParallelEmbeddingWithLoRA

    return isinstance(module, VocabParallelEmbeddingWithLoRA)
