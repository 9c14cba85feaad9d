"""Seam 2d, adapter slot writes: ``vllm/lora/layers/`` and ``vllm/lora/model_manager.py``
(vLLM 0.32.0). Each LoRA-wrapped layer's slot writes go through
:class:`~preft_serve.worker.slots.ZeroSlots`, which skips those that change nothing, and
each step a layer whose slots in the step are all zero runs its base layer directly.

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

from collections.abc import Callable
from typing import Any

import torch

from preft_kernels.lora_grouped import fuse_lora_a_buffers
from preft_serve.worker.slots import ZeroSlots
from preft_serve.worker.vllm_compat.punica_cpu import GroupedPunicaWrapperCPU


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
    return reset in (
        BaseLinearLayerWithLoRA.reset_lora,
        VocabParallelEmbeddingWithLoRA.reset_lora,
        LogitsProcessorWithLoRA.reset_lora,
    )


def set_lora_zeroes_then_copies(module: Any) -> bool:
    """``set_lora`` implementations known to copy ``lora_a[i]`` / ``lora_b[i]`` into
    ``[index, 0, :rows, :cols]`` of slice ``i`` after zeroing the slot."""
    from vllm.lora.layers import MergedColumnParallelLinearWithLoRA
    from vllm.lora.layers.base_linear import BaseLinearLayerWithLoRA

    return type(module).set_lora in (
        BaseLinearLayerWithLoRA.set_lora,
        MergedColumnParallelLinearWithLoRA.set_lora,
    )


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


class SlotState(ZeroSlots):
    """One of vLLM's LoRA-wrapped layers, its slot writes made through :class:`ZeroSlots`.

    vLLM's ``activate_adapter`` writes every wrapped layer for every adapter it moves into a
    slot: ``reset_lora`` (zero the slot) where the adapter has no weights, ``set_lora``
    (zero, then copy) where it has. For an adapter on q,k,v,o that zeroes the MLP and
    embedding slots again and again (on SmolLM2, ~12 MB per activation), and the zeroing
    before a copy that covers the whole slot is wasted. Both are skipped here.
    """

    def __init__(self, module: Any) -> None:
        super().__init__(slot_buffers(module))
        self.module = module
        self.full_copy = set_lora_zeroes_then_copies(module)
        self.stock_reset = module.reset_lora
        self.stock_set = module.set_lora
        self.bypassed = False
        # The lm_head's LoRA wrapper replaces the logits processor, which is not called
        # like a layer (``compute_logits``): its writes are tracked, its path is not routed.
        self.bypassable = hasattr(module, "base_layer") and not is_logits_processor(module)
        module.reset_lora = self.reset_lora
        module.set_lora = self.set_lora

    @classmethod
    def tracks(cls, module: Any) -> bool:
        """Whether ``module``'s slot writes are known well enough to be tracked here."""
        return slot_writes_known(module)

    def reset_lora(self, index: int) -> None:
        self.reset(index, self.stock_reset)

    def set_lora(self, index: int, lora_a: Any, lora_b: Any) -> None:
        self.write(
            index,
            lambda: self.stock_set(index, lora_a, lora_b),
            covers=self.full_copy and self._covers(lora_a, lora_b),
        )

    def _covers(self, lora_a: Any, lora_b: Any) -> bool:
        """Whether the copy writes every element of the slot (then zeroing it first is
        wasted): one weight per slice, each exactly the slot's shape."""
        a_list = lora_a if isinstance(lora_a, list) else [lora_a]
        b_list = lora_b if isinstance(lora_b, list) else [lora_b]
        a_stacked, b_stacked = self.module.lora_a_stacked, self.module.lora_b_stacked
        if not len(a_list) == len(b_list) == len(a_stacked) == len(b_stacked):
            return False
        return all(
            a is not None
            and b is not None
            and tuple(a.shape) == tuple(sa.shape[2:])
            and tuple(b.shape) == tuple(sb.shape[2:])
            for a, b, sa, sb in zip(a_list, b_list, a_stacked, b_stacked)
        )

    def set_bypass(self, on: bool) -> None:
        """Run the base layer's ``forward`` directly (``on``) or vLLM's LoRA layer's."""
        if on == self.bypassed or not self.bypassable:
            return
        if on:
            self.module.forward = self.module.base_layer.forward
        else:
            del self.module.forward
        self.bypassed = on


class SlotRouter:
    """Per step, lets each tracked layer skip vLLM's LoRA wrapper when none of the step's
    adapter slots has weights in it (decode steps of prefill-only adapters: every layer)."""

    def __init__(self, states: list[SlotState], bypass: bool) -> None:
        self.states = states
        self.bypass = bypass
        # Each layer's punica wrapper (one per language model; set once by vLLM).
        self.wrappers = list(
            {id(s.module.punica_wrapper): s.module.punica_wrapper for s in states}.values()
        )
        self._key: tuple[Any, ...] | None = None

    @classmethod
    def install(cls, worker_manager: Any, bypass: bool) -> SlotRouter | None:
        """Track the slot writes of every eligible layer of vLLM's LoRA manager."""
        all_modules = lora_modules(worker_manager)
        if all_modules is None:
            return None
        modules = [m for m in all_modules if SlotState.tracks(m)]
        for module in modules:
            if isinstance(module.punica_wrapper, GroupedPunicaWrapperCPU) and isinstance(
                module.lora_a_stacked, tuple
            ):
                # q,k,v (gate,up) A slices as row blocks of one buffer: one shrink GEMM
                # per adapter reads them without a per-call copy (see fused_lora_a).
                module.lora_a_stacked = fuse_lora_a_buffers(module.lora_a_stacked)
        router = cls([SlotState(m) for m in modules], bypass)
        for state in router.states:
            wrapper = state.module.punica_wrapper
            if isinstance(wrapper, GroupedPunicaWrapperCPU):
                b = state.module.lora_b_stacked
                wrapper.nonzero.register(
                    b if isinstance(b, (tuple, list)) else (b,), state.zero_slots
                )
        untracked = {
            id(getattr(m, "punica_wrapper", None)) for m in all_modules if not SlotState.tracks(m)
        }
        for wrapper in router.wrappers:
            if isinstance(wrapper, GroupedPunicaWrapperCPU) and id(wrapper) not in untracked:
                wrapper.needs_vllm_metadata = router.embedding_check(wrapper)
        return router

    def embedding_check(self, wrapper: Any) -> Callable[[frozenset[int]], bool]:
        """For ``wrapper``'s ``needs_vllm_metadata``: whether an embedding layer has
        weights in one of the step's slots (no other tracked layer reads vLLM's metadata;
        our punica methods use their own groups)."""
        embeddings = [
            s for s in self.states if s.module.punica_wrapper is wrapper and is_embedding(s.module)
        ]

        def needed(slots: frozenset[int]) -> bool:
            return any(not slots <= s.known_zero() for s in embeddings)

        return needed

    def route(self) -> None:
        """Set every tracked layer's path for the step (after the slots were written)."""
        if not self.bypass:
            return
        slots = {
            id(w): frozenset(w.token_groups.slots)
            if isinstance(w, GroupedPunicaWrapperCPU)
            else None
            for w in self.wrappers
        }
        key = (tuple(slots.values()), ZeroSlots.generation)
        if key == self._key:
            return
        self._key = key
        for state in self.states:
            live = slots[id(state.module.punica_wrapper)]
            state.set_bypass(live is not None and live <= state.known_zero())
