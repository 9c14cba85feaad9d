"""Adapter slots: which slots of each LoRA-wrapped layer hold weights, and per step, the
layers that can skip vLLM's LoRA wrapper.

vLLM wraps every linear layer and the embedding, whatever the adapters target, and writes
every wrapped layer for every adapter it moves into a slot. Knowing which slots are zero
saves the writes that change nothing, and lets a layer whose slots in the step are all
zero (every layer in a decode step of prefill-only adapters; the MLP and the embedding for
q,k,v,o adapters) run its base layer directly. What this relies on in vLLM's layers is
listed in :mod:`preft_serve.worker.vllm_compat.lora_layers` (seam 2d); the CPU punica
wrapper (seam 3) skips the zero slots' GEMMs when a layer runs wrapped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from preft_kernels.lora_grouped import fuse_lora_a_buffers
from preft_serve.worker.vllm_compat import lora_layers
from preft_serve.worker.vllm_compat.punica_cpu import GroupedPunicaWrapperCPU


def _tensor_versions(tensors: tuple[torch.Tensor, ...]) -> tuple[int, ...] | None:
    try:
        return tuple(t._version for t in tensors)
    except RuntimeError:  # inference tensors have no version counter: nothing is known
        return None


class SlotState:
    """Which slots of one LoRA-wrapped layer are all zero, kept by wrapping its writes.

    vLLM's ``activate_adapter`` writes every wrapped layer for every adapter it moves into a
    slot: ``reset_lora`` (zero the slot) where the adapter has no weights, ``set_lora``
    (zero, then copy) where it has. For an adapter on q,k,v,o that zeroes the MLP and
    embedding slots again and again (on SmolLM2, ~12 MB per activation), and the zeroing
    before a copy that covers the whole slot is wasted. Both are skipped here. What is
    known is trusted only while the buffers' version counters show no other write.
    """

    generation = 0  # bumped on every write through any SlotState: routing caches on it

    def __init__(self, module: Any) -> None:
        self.module = module
        self.tensors = lora_layers.slot_buffers(module)
        self.zero: set[int] = set()
        self.versions: tuple[int, ...] | None = None
        self._scan()
        self.full_copy = lora_layers.set_lora_zeroes_then_copies(module)
        self.stock_reset = module.reset_lora
        self.stock_set = module.set_lora
        self.skip_reset = False
        self.bypassed = False
        # The lm_head's LoRA wrapper replaces the logits processor, which is not called
        # like a layer (``compute_logits``): its writes are tracked, its path is not routed.
        self.bypassable = (hasattr(module, "base_layer")
                           and not lora_layers.is_logits_processor(module))
        module.reset_lora = self.reset_lora
        module.set_lora = self.set_lora

    @classmethod
    def tracks(cls, module: Any) -> bool:
        """Whether ``module``'s slot writes are known well enough to be tracked here."""
        return lora_layers.slot_writes_known(module)

    def _scan(self) -> None:
        """Read which slots are zero (at start, and after a write not made through us)."""
        live = torch.zeros(self.tensors[0].shape[0], dtype=torch.bool,
                           device=self.tensors[0].device)
        for t in self.tensors:  # one reduction per buffer, not one per slot
            live |= t.reshape(t.shape[0], -1).any(dim=1)
        self.zero = {int(s) for s in torch.nonzero(~live).flatten().tolist()}
        self.versions = _tensor_versions(self.tensors)

    def known_zero(self) -> set[int]:
        """Slots known to be all zero; none for buffers without version counters."""
        versions = _tensor_versions(self.tensors)
        if versions is None:
            return set()
        if versions != self.versions:
            self._scan()
        return self.zero

    def zero_slots(self) -> set[int] | None:
        """``known_zero`` for the kernels' ``NonzeroSlots``; None: unknowable here (no
        version counters), read the weights instead."""
        return None if self.versions is None else self.known_zero()

    def _begin_write(self) -> None:
        self.zero = set(self.known_zero())
        self.versions = _tensor_versions(self.tensors)
        SlotState.generation += 1

    def reset_lora(self, index: int) -> None:
        if self.skip_reset or index in self.known_zero():
            return
        self._begin_write()
        self.stock_reset(index)
        self.versions = _tensor_versions(self.tensors)
        self.zero.add(index)

    def set_lora(self, index: int, lora_a: Any, lora_b: Any) -> None:
        self._begin_write()
        self.skip_reset = self.full_copy and self._covers(lora_a, lora_b)
        try:
            self.stock_set(index, lora_a, lora_b)
        finally:
            self.skip_reset = False
        self.versions = _tensor_versions(self.tensors)
        self.zero.discard(index)

    def _covers(self, lora_a: Any, lora_b: Any) -> bool:
        """Whether the copy writes every element of the slot (then zeroing it first is
        wasted): one weight per slice, each exactly the slot's shape."""
        a_list = lora_a if isinstance(lora_a, list) else [lora_a]
        b_list = lora_b if isinstance(lora_b, list) else [lora_b]
        a_stacked, b_stacked = self.module.lora_a_stacked, self.module.lora_b_stacked
        if not len(a_list) == len(b_list) == len(a_stacked) == len(b_stacked):
            return False
        return all(
            a is not None and b is not None and tuple(a.shape) == tuple(sa.shape[2:])
            and tuple(b.shape) == tuple(sb.shape[2:])
            for a, b, sa, sb in zip(a_list, b_list, a_stacked, b_stacked))

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
        self.wrappers = list({id(s.module.punica_wrapper): s.module.punica_wrapper
                              for s in states}.values())
        self._key: tuple[Any, ...] | None = None

    @classmethod
    def install(cls, worker_manager: Any, bypass: bool) -> SlotRouter | None:
        """Track the slot writes of every eligible layer of vLLM's LoRA manager."""
        all_modules = lora_layers.lora_modules(worker_manager)
        if all_modules is None:
            return None
        modules = [m for m in all_modules if SlotState.tracks(m)]
        for module in modules:
            if isinstance(module.punica_wrapper, GroupedPunicaWrapperCPU) and isinstance(
                    module.lora_a_stacked, tuple):
                # q,k,v (gate,up) A slices as row blocks of one buffer: one shrink GEMM
                # per adapter reads them without a per-call copy (see fused_lora_a).
                module.lora_a_stacked = fuse_lora_a_buffers(module.lora_a_stacked)
        router = cls([SlotState(m) for m in modules], bypass)
        for state in router.states:
            wrapper = state.module.punica_wrapper
            if isinstance(wrapper, GroupedPunicaWrapperCPU):
                b = state.module.lora_b_stacked
                wrapper.nonzero.register(b if isinstance(b, (tuple, list)) else (b,),
                                         state.zero_slots)
        untracked = {id(getattr(m, "punica_wrapper", None)) for m in all_modules
                     if not SlotState.tracks(m)}
        for wrapper in router.wrappers:
            if isinstance(wrapper, GroupedPunicaWrapperCPU) and id(wrapper) not in untracked:
                wrapper.needs_vllm_metadata = router.embedding_check(wrapper)
        return router

    def embedding_check(self, wrapper: Any) -> Callable[[frozenset[int]], bool]:
        """For ``wrapper``'s ``needs_vllm_metadata``: whether an embedding layer has
        weights in one of the step's slots (no other tracked layer reads vLLM's metadata;
        our punica methods use their own groups)."""
        embeddings = [s for s in self.states if s.module.punica_wrapper is wrapper
                      and lora_layers.is_embedding(s.module)]

        def needed(slots: frozenset[int]) -> bool:
            return any(not slots <= s.known_zero() for s in embeddings)

        return needed

    def route(self) -> None:
        """Set every tracked layer's path for the step (after the slots were written)."""
        if not self.bypass:
            return
        slots = {id(w): frozenset(w.token_groups.slots)
                 if isinstance(w, GroupedPunicaWrapperCPU) else None for w in self.wrappers}
        key = (tuple(slots.values()), SlotState.generation)
        if key == self._key:
            return
        self._key = key
        for state in self.states:
            live = slots[id(state.module.punica_wrapper)]
            state.set_bypass(live is not None and live <= state.known_zero())
