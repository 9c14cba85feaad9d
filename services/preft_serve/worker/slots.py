"""Adapter slots: which slots of a LoRA layer's buffers are all zero, known without
reading them.

vLLM wraps every linear layer and the embedding, whatever the adapters target, and writes
every wrapped layer for every adapter it moves into a slot. Knowing which slots are zero
saves the writes that change nothing, and lets a layer whose slots in the step are all
zero (every layer in a decode step of prefill-only adapters; the MLP and the embedding for
q,k,v,o adapters) run its base layer directly. This is that bookkeeping, over plain
tensors and write callbacks: :mod:`preft_serve.worker.vllm_compat.lora_layers` (seam 2d)
routes vLLM's layers' slot writes through it and picks each step's layer paths, and the
CPU punica wrapper (seam 3) skips the zero slots' GEMMs when a layer runs wrapped.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def _tensor_versions(tensors: tuple[torch.Tensor, ...]) -> tuple[int, ...] | None:
    try:
        return tuple(t._version for t in tensors)
    except RuntimeError:  # inference tensors have no version counter: nothing is known
        return None


class ZeroSlots:
    """Which slots of one layer's slot buffers (slot = first dimension) are all zero.

    Kept by seeing the writes (:meth:`reset`, :meth:`write`): a reset of a slot known to be
    zero is skipped, and so is the zeroing before a copy that covers the whole slot. What
    is known is trusted only while the buffers' version counters show no other write;
    buffers without version counters (inference tensors) are never trusted.
    """

    generation = 0  # bumped on every write through any ZeroSlots: routing caches on it

    def __init__(self, tensors: tuple[torch.Tensor, ...]) -> None:
        self.tensors = tensors
        self.zero: set[int] = set()
        self.versions: tuple[int, ...] | None = None
        self.skip_reset = False
        self._scan()

    def _scan(self) -> None:
        """Read which slots are zero (at start, and after a write not made through us)."""
        live = torch.zeros(
            self.tensors[0].shape[0], dtype=torch.bool, device=self.tensors[0].device
        )
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
        ZeroSlots.generation += 1

    def reset(self, index: int, stock: Callable[[int], None]) -> None:
        """Zero slot ``index`` with ``stock(index)``, unless it is known to be zero or the
        copy under way (:meth:`write` with ``covers``) writes all of it."""
        if self.skip_reset or index in self.known_zero():
            return
        self._begin_write()
        stock(index)
        self.versions = _tensor_versions(self.tensors)
        self.zero.add(index)

    def write(self, index: int, stock: Callable[[], None], covers: bool) -> None:
        """Copy weights into slot ``index`` with ``stock()``. ``covers``: the copy writes
        every element of the slot, so the :meth:`reset` it begins with is skipped."""
        self._begin_write()
        self.skip_reset = covers
        try:
            stock()
        finally:
            self.skip_reset = False
        self.versions = _tensor_versions(self.tensors)
        self.zero.discard(index)
