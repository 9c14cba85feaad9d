"""Seam 3, the CPU punica wrapper: ``vllm/lora/punica_wrapper/punica_cpu.py`` and
``vllm/platforms/cpu.py`` (vLLM 0.32.0).

Relies on:

- ``PunicaWrapperCPU``'s interface (``PunicaWrapperBase``: ``update_metadata``,
  ``add_shrink``, ``add_expand``, ``add_lora_linear``, ``add_lora_embedding``,
  ``add_lora_logits``) and the ``LoRAMapping`` it gets (``index_mapping`` per token,
  ``prompt_mapping`` per sampled row). Grouped per-adapter GEMMs from
  :mod:`preft_kernels.lora_grouped` replace its per-token weight gather, and a step with no
  adapter token does no adapter work.
- ``_embeddings_indices``: what vLLM's embedding LoRA layer reads when this wrapper skips
  vLLM's own metadata.
- ``CpuPlatform.get_punica_wrapper`` returning the wrapper's qualified name, which
  ``vllm/lora/punica_wrapper/punica_selector.py`` imports: :func:`install` points it here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

from preft_kernels.lora_grouped import (
    AdapterGroups,
    NonzeroSlots,
    grouped_lora_expand,
    grouped_lora_linear,
    grouped_lora_shrink,
)
from preft_serve.worker.token_mapping import NO_ADAPTER

GROUPED_PUNICA_QUALNAME = f"{__name__}.GroupedPunicaWrapperCPU"


def _slots_of(ids: tuple[int, ...], lora_index_to_id: list[int | None]) -> np.ndarray:
    """Adapter ids -> slot indices (-1 for no adapter)."""
    lut = {lora_id: slot for slot, lora_id in enumerate(lora_index_to_id) if lora_id}
    arr = np.asarray(ids, dtype=np.int64)
    uniq, inverse = np.unique(arr, return_inverse=True)
    mapped = np.array([lut.get(int(u), -1) if u != NO_ADAPTER else -1 for u in uniq])
    return mapped[inverse] if arr.size else arr


class GroupedPunicaWrapperCPU(PunicaWrapperCPU):
    """CPU LoRA via per-adapter grouped GEMMs; no work at all when no token has an adapter,
    and none in a layer for the adapters whose weights there are zero (vLLM wraps every
    linear layer and the embedding, whatever the adapters target)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.token_groups = AdapterGroups((), 0)
        self.sample_groups = AdapterGroups((), 0)
        self.nonzero = NonzeroSlots()
        # Set by SlotRouter when it tracks every layer of this wrapper: whether a step with
        # these token slots needs vLLM's own metadata (only the embedding LoRA layer reads
        # it); None: always build it.
        self.needs_vllm_metadata: Callable[[frozenset[int]], bool] | None = None

    def update_metadata(
        self,
        mapping: Any,
        lora_index_to_id: list[int | None],
        max_loras: int,
        vocab_size: int,
        **kwargs: Any,
    ) -> None:
        token_slots = _slots_of(mapping.index_mapping, lora_index_to_id)
        sample_slots = _slots_of(mapping.prompt_mapping, lora_index_to_id)
        self.token_groups = AdapterGroups.from_slots(token_slots)
        self.sample_groups = AdapterGroups.from_slots(sample_slots)
        self.nonzero.new_step()
        self.no_lora = self.token_groups.empty and self.sample_groups.empty
        needed = not self.no_lora and (
            self.needs_vllm_metadata is None
            or self.needs_vllm_metadata(frozenset(self.token_groups.slots))
        )
        if needed:
            # vLLM's own metadata feeds the embedding layer's lookup of lora_a rows.
            super().update_metadata(mapping, lora_index_to_id, max_loras, vocab_size, **kwargs)
        else:
            # vLLM's embedding LoRA layer (when it runs) looks up ``x + _embeddings_indices``;
            # keep those in range (its result is discarded: no slot of the step has
            # embedding weights, so add_lora_embedding does nothing).
            self._embeddings_indices[: len(mapping.index_mapping)].zero_()

    def add_shrink(
        self, y: Any, x: torch.Tensor, lora_a_stacked: Any, scale: float, **kwargs: Any
    ) -> None:
        if self.token_groups.empty:
            return
        grouped_lora_shrink(y, x.view(-1, x.shape[-1]), lora_a_stacked, self.token_groups, scale)

    def add_expand(
        self,
        y: torch.Tensor,
        x: Any,
        lora_b_stacked: Any,
        output_slices: tuple[int, ...],
        offset_start: int = 0,
        add_inputs: bool = True,
        **kwargs: Any,
    ) -> None:
        if self.token_groups.empty:
            return
        grouped_lora_expand(
            y.view(-1, y.shape[-1]),
            x,
            lora_b_stacked,
            self.token_groups,
            output_slices,
            offset_start,
            add_inputs,
        )

    def add_lora_linear(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: Any,
        lora_b_stacked: Any,
        scale: float,
        output_slices: tuple[int, ...],
        *,
        buffer: Any = None,
        **kwargs: Any,
    ) -> None:
        groups = self.nonzero.restrict(self.token_groups, lora_b_stacked)
        if groups.empty:
            return
        grouped_lora_linear(y, x, lora_a_stacked, lora_b_stacked, groups, scale, output_slices)

    def add_lora_embedding(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_b_stacked: Any,
        add_inputs: bool = True,
        **kwargs: Any,
    ) -> None:
        if not add_inputs:  # y must be written even where the adapter adds nothing
            if not self.token_groups.empty:
                grouped_lora_expand(
                    y, (x,), (lora_b_stacked,), self.token_groups, (y.shape[-1],), 0, add_inputs
                )
            return
        groups = self.nonzero.restrict(self.token_groups, (lora_b_stacked,))
        if groups.empty:
            return
        grouped_lora_expand(y, (x,), (lora_b_stacked,), groups, (y.shape[-1],), 0, add_inputs)

    def add_lora_logits(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: Any,
        lora_b_stacked: Any,
        scale: float,
        *,
        buffer: Any = None,
        **kwargs: Any,
    ) -> None:
        groups = self.nonzero.restrict(self.sample_groups, (lora_b_stacked,))
        if groups.empty:
            return
        y2 = y.view(-1, y.shape[-1])
        grouped_lora_linear(
            y2,
            x.view(-1, x.shape[-1]),
            (lora_a_stacked,),
            (lora_b_stacked,),
            groups,
            scale,
            (y2.shape[-1],),
        )


def install() -> None:
    """On the CPU platform, have vLLM build :class:`GroupedPunicaWrapperCPU`."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        # A classmethod replaces a method on the platform class: patched through an
        # untyped handle, as vLLM's annotations do not describe it.
        platform_cls: Any = type(current_platform)
        platform_cls.get_punica_wrapper = classmethod(lambda cls: GROUPED_PUNICA_QUALNAME)
