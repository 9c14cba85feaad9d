"""Applies ReFT interventions inside vLLM's forward pass, batched per (adapter, part).

Per step, :meth:`ReftRuntime.prepare_step` turns the batch layout into groups of token rows
that share an intervention, says which group uses which intervention at each layer, and
has the kernel prepare its inputs once (``reft.kernels``); a forward hook on every decoder
layer adds the deltas to the residual stream (vLLM keeps it as ``hidden_states +
residual``). A step with no ReFT token (every pure-decode step) leaves the plan empty and
the hooks return immediately.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from preft_kernels.lora_grouped import AdapterGroups
from preft_serve.adapters.reft_positions import NONE, part_codes
from preft_serve.worker.reft.adapter import Intervention, ReftAdapter, load_reft_adapter
from preft_serve.worker.reft.kernels import ReftKernel, TorchReft
from preft_serve.worker.token_mapping import NO_ADAPTER

logger = logging.getLogger(__name__)
Weights = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # stacked proj_in, bias, proj_out


@dataclasses.dataclass
class ReftStepPlan:
    """Rows of this step per (adapter id, part code), the kernel's inputs for every layer
    (prepared once), and per-layer stacked weights (stacked on first use)."""

    num_tokens: int
    groups: list[tuple[int, int, slice | torch.Tensor]]  # (adapter id, part, rows on host)
    layer_slots: dict[int, int] = dataclasses.field(default_factory=dict)  # layer -> slot
    kernel_inputs: Any = None  # ReftKernel.prepare's answer
    _layers: dict[int, Weights] = dataclasses.field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.groups


EMPTY_PLAN = ReftStepPlan(0, [])


class ReftRuntime:
    """Loaded ReFT adapters (LRU by adapter id) and the current step's plan."""

    def __init__(
        self,
        hidden_size: int,
        num_layers: int,
        capacity: int,
        device: torch.device | str = "cpu",
        kernel: ReftKernel | None = None,
    ) -> None:
        self.hidden_size, self.num_layers, self.capacity = hidden_size, num_layers, capacity
        self.device = torch.device(device)
        self.kernel: ReftKernel = kernel or TorchReft()
        self.adapters: collections.OrderedDict[int, ReftAdapter] = collections.OrderedDict()
        self.plan = EMPTY_PLAN
        self._hooks: list[Any] = []

    # -- adapters ----------------------------------------------------------------------

    def load(self, adapter_id: int, path: str) -> ReftAdapter:
        """Load (or touch) an adapter; evicts the least recently used beyond capacity."""
        if adapter_id in self.adapters:
            self.adapters.move_to_end(adapter_id)
            return self.adapters[adapter_id]
        adapter = load_reft_adapter(path, self.hidden_size, self.num_layers)
        adapter = dataclasses.replace(
            adapter,
            layers={
                layer: (self._to_device(first), self._to_device(last))
                for layer, (first, last) in adapter.layers.items()
            },
        )
        self.adapters[adapter_id] = adapter
        while len(self.adapters) > self.capacity:
            evicted, _ = self.adapters.popitem(last=False)
            logger.debug("evicted ReFT adapter %s", evicted)
        return adapter

    def _to_device(self, part: Intervention) -> Intervention:
        return Intervention(*(t.to(self.device) for t in (part.proj_in, part.bias, part.proj_out)))

    def remove(self, adapter_id: int) -> bool:
        return self.adapters.pop(adapter_id, None) is not None

    def loaded_ids(self) -> set[int]:
        return set(self.adapters)

    # -- per step ----------------------------------------------------------------------

    def prepare_step(
        self,
        adapter_ids: np.ndarray,  # (num_reqs,) ReFT adapter id per request, 0 = none
        paths: dict[int, str],  # adapter id -> directory
        num_computed: np.ndarray,
        num_prompt: np.ndarray,
        num_scheduled: np.ndarray,
    ) -> ReftStepPlan:
        """Group this step's prompt tokens by (adapter, first/last part), and prepare the
        kernel's inputs for every layer."""
        num_tokens = int(np.sum(num_scheduled))
        if not np.any(adapter_ids != NO_ADAPTER):
            self.plan = EMPTY_PLAN
            return self.plan
        codes = np.full(num_tokens, -1, dtype=np.int64)  # (adapter slot * 2 + part) per row
        ids = sorted({int(i) for i in adapter_ids if i != NO_ADAPTER})
        slot_of = {adapter_id: n for n, adapter_id in enumerate(ids)}
        start = 0
        for req, adapter_id in enumerate(adapter_ids.tolist()):
            count = int(num_scheduled[req])
            if adapter_id != NO_ADAPTER and count:
                adapter = self.load(adapter_id, paths[adapter_id])
                pos = int(num_computed[req]) + np.arange(count)
                parts = part_codes(pos, int(num_prompt[req]), adapter.positions)
                codes[start : start + count] = np.where(
                    parts == NONE, -1, slot_of[adapter_id] * 2 + parts
                )
            start += count
        grouped = AdapterGroups.from_slots(codes)
        plan = ReftStepPlan(
            num_tokens, [(ids[code // 2], code % 2, rows) for code, rows in grouped.groups]
        )
        # Per layer, each group's index into that layer's stacked weights (-1: none there).
        layers = sorted({layer for a, _, _ in plan.groups for layer in self.adapters[a].layers})
        layer_index = np.full((len(layers), len(plan.groups)), -1, dtype=np.int64)
        for slot, layer in enumerate(layers):
            used = [
                self.adapters[a].intervention(layer, part) is not None for a, part, _ in plan.groups
            ]
            layer_index[slot, used] = np.arange(sum(used))
        plan.layer_slots = {layer: slot for slot, layer in enumerate(layers)}
        if plan.groups:
            plan.kernel_inputs = self.kernel.prepare(
                [rows for _, _, rows in plan.groups], layer_index, num_tokens, self.device
            )
        self.plan = plan
        return self.plan

    def _layer_weights(self, layer: int) -> Weights:
        """Stacked weights of the interventions this step uses at ``layer``, in group
        order (cached for the step)."""
        plan = self.plan
        if layer not in plan._layers:
            ins, biases, outs = [], [], []
            rank = max((self.adapters[a].rank for a, _, _ in plan.groups), default=0)
            for adapter_id, part, _ in plan.groups:
                iv = self.adapters[adapter_id].intervention(layer, part)
                if iv is None:
                    continue
                pad = rank - iv.proj_in.shape[0]  # zero rows leave the delta unchanged
                ins.append(torch.nn.functional.pad(iv.proj_in, (0, 0, 0, pad)))
                biases.append(torch.nn.functional.pad(iv.bias, (0, pad)))
                outs.append(torch.nn.functional.pad(iv.proj_out, (0, 0, 0, pad)))
            plan._layers[layer] = (torch.stack(ins), torch.stack(biases), torch.stack(outs))
        return plan._layers[layer]

    # -- hooks -------------------------------------------------------------------------

    def install(self, decoder_layers: list[torch.nn.Module]) -> None:
        """Register one forward hook per decoder layer (idempotent)."""
        if self._hooks:
            return
        for index, layer in enumerate(decoder_layers):
            self._hooks.append(layer.register_forward_hook(self._make_hook(index)))

    def _make_hook(self, layer: int) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            if self.plan.empty:
                return
            hidden, residual = output  # vLLM decoder layers: stream = hidden + residual
            if hidden.shape[0] < self.plan.num_tokens:
                return  # a dummy/profile run with a stale plan
            slot = self.plan.layer_slots.get(layer)
            if slot is None:
                return  # no intervention of this step at this layer
            self.kernel.apply(
                hidden,
                hidden + residual,
                self.plan.kernel_inputs,
                slot,
                *self._layer_weights(layer),
            )

        return hook
