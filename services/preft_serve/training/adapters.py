"""Trainable adapters with the serving semantics built in: which tokens see the adapter.

* LoRA (peft): a forward hook on every ``lora_A`` module multiplies its output by a
  per-token gate, so the low-rank path ``B·A·x`` is on exactly where the gate is 1. Mode
  ``prefill`` gates it on prompt tokens (including the last, whose output predicts the
  first response token) and off on response tokens, which then see the adapter only
  through the prompt's keys and values: one causal forward pass computes what serving
  does in two (adapted prefill, then base-model decode on that cache). Mode ``all`` never
  gates.
* ReFT (DiReFT / LoReFT): forward hooks on the chosen decoder layers add the intervention
  to the residual stream at the prompt positions pyreft's rule picks
  (:func:`preft_serve.adapters.reft_positions.part_codes`, the worker's own rule), never at
  response positions.

Both save in the format the registry validates and the worker serves (docs/adapters.md).
"""

from __future__ import annotations

import abc
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from preft_serve.adapters.format import (
    CONFIG_FILE,
    MODE_KEY,
    REFT_TYPE_KEY,
    WEIGHTS_FILE,
    AdapterMode,
    AdapterType,
)
from preft_serve.adapters.reft_format import (
    FIRST,
    LAST,
    PREFILL_POSITIONS,
    SHARED,
    parse_positions,
    tensor_name,
)
from preft_serve.adapters.reft_positions import NONE, part_codes
from preft_serve.training.batch import Batch
from preft_serve.training.spec import LORA_MODULES, AdapterSpec

__all__ = ["LORA_MODULES", "AdapterSpec", "TrainableAdapter", "attach_adapter"]


def decoder_layers(causal_lm: nn.Module) -> nn.ModuleList:
    """The decoder blocks of a Hugging Face causal LM (Llama, Qwen2 and alike)."""
    layers: nn.ModuleList = causal_lm.get_decoder().layers  # type: ignore[operator]
    return layers


class TrainableAdapter(abc.ABC):
    """An adapter attached to a frozen causal LM; :meth:`set_batch` arms its gates."""

    def __init__(self, causal_lm: nn.Module, spec: AdapterSpec) -> None:
        self.spec = spec
        self.causal_lm = causal_lm  # the HF model with the adapter inside; call this

    @abc.abstractmethod
    def parameters(self) -> list[nn.Parameter]:
        """The trainable tensors (everything else is frozen)."""

    @abc.abstractmethod
    def set_batch(self, batch: Batch | None) -> None:
        """Gate the adapter for ``batch``'s layout; None = adapter off everywhere."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, torch.Tensor]:
        """Trainable state, for checkpoints."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None: ...

    @abc.abstractmethod
    def save(self, out: Path, base_model: str) -> None:
        """Write adapter_config.json + adapter_model.safetensors for the registry."""


class LoraAdapter(TrainableAdapter):
    """A peft LoRA whose low-rank path is gated per token (see the module docstring)."""

    def __init__(self, causal_lm: nn.Module, spec: AdapterSpec) -> None:
        from peft import LoraConfig, get_peft_model
        from peft.tuners.lora import LoraLayer

        config = LoraConfig(
            r=spec.rank,
            lora_alpha=spec.alpha or spec.rank,  # type: ignore[arg-type]  # peft accepts floats
            target_modules=list(spec.target_modules),
            lora_dropout=spec.dropout,
            bias="none",
            use_rslora=spec.rslora,
            task_type="CAUSAL_LM",
        )
        self.peft_model = get_peft_model(causal_lm, config)
        super().__init__(self.peft_model.get_base_model(), spec)
        self._gate: torch.Tensor | None = None
        self._off = False
        for module in self.peft_model.modules():
            if isinstance(module, LoraLayer):
                for lora_a in module.lora_A.values():
                    lora_a.register_forward_hook(self._apply_gate)

    def _apply_gate(self, _module: nn.Module, _inputs: Any, output: torch.Tensor) -> torch.Tensor:
        if self._off:
            return output * 0
        return output if self._gate is None else output * self._gate.to(output.dtype)

    def set_batch(self, batch: Batch | None) -> None:
        self._off = batch is None
        if batch is None or self.spec.mode is AdapterMode.ALL:
            self._gate = None
        else:
            self._gate = batch.prompt_mask()[..., None]  # (B, S, 1)

    def set_generation_phase(self, prefill: bool) -> None:
        """For sampling token by token (RL): the prompt's forward always sees the adapter;
        a decode step sees it only in mode ``all``, as the worker serves them."""
        self._gate = None
        self._off = not prefill and self.spec.mode is AdapterMode.PREFILL

    def parameters(self) -> list[nn.Parameter]:
        return [p for p in self.peft_model.parameters() if p.requires_grad]

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {
            n: p.detach().clone() for n, p in self.peft_model.named_parameters() if p.requires_grad
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        params = dict(self.peft_model.named_parameters())
        with torch.no_grad():
            for name, value in state.items():
                params[name].copy_(value)

    def save(self, out: Path, base_model: str) -> None:
        self.peft_model.save_pretrained(str(out), safe_serialization=True)
        (out / "README.md").unlink(missing_ok=True)  # peft's model card: not an adapter file
        config = json.loads((out / CONFIG_FILE).read_text())
        config.update(
            {
                "base_model_name_or_path": base_model,
                "inference_mode": True,
                MODE_KEY: self.spec.mode.value,
            }
        )
        (out / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True))


class _Intervention(nn.Module):
    """``delta = (h·proj_inᵀ + b)·proj_out`` with DiReFT's or LoReFT's parametrisation."""

    def __init__(
        self, kind: AdapterType, rank: int, hidden: int, generator: torch.Generator
    ) -> None:
        super().__init__()
        self.kind = kind
        self.b = nn.Parameter(torch.zeros(rank))
        if kind is AdapterType.DIREFT:
            # W2 = 0: the adapter starts as the identity and W2 gets gradient at once.
            self.w1 = nn.Parameter(torch.randn(rank, hidden, generator=generator) / hidden**0.5)
            self.w2 = nn.Parameter(torch.zeros(rank, hidden))
        else:
            # R has orthonormal rows (an orthogonal parametrisation keeps it so); W = R makes
            # the intervention start as the identity, as LoRA's B = 0 does.
            q, _ = torch.linalg.qr(torch.randn(hidden, rank, generator=generator))
            self.rotate = nn.Linear(hidden, rank, bias=False)
            with torch.no_grad():
                self.rotate.weight.copy_(q.T)
            torch.nn.utils.parametrizations.orthogonal(self.rotate)
            self.w = nn.Parameter(self.rotate.weight.detach().clone())

    def delta(self, h: torch.Tensor) -> torch.Tensor:
        if self.kind is AdapterType.DIREFT:
            return (h @ self.w1.T + self.b) @ self.w2
        r = self.rotate.weight
        return (h @ self.w.T + self.b - h @ r.T) @ r

    def tensors(self) -> dict[str, torch.Tensor]:
        """The saved tensors (docs/adapters.md names), float32."""
        out: dict[str, torch.Tensor]
        if self.kind is AdapterType.DIREFT:
            out = {"w1": self.w1, "b": self.b, "w2": self.w2}
        else:
            out = {"r": self.rotate.weight, "w": self.w, "b": self.b}
        return {k: v.detach().float().cpu().contiguous() for k, v in out.items()}


class ReftAdapter(TrainableAdapter):
    """DiReFT / LoReFT interventions on decoder-layer outputs at chosen prompt positions."""

    def __init__(self, causal_lm: nn.Module, spec: AdapterSpec, seed: int = 0) -> None:
        super().__init__(causal_lm, spec)
        for p in causal_lm.parameters():
            p.requires_grad_(False)
        blocks = decoder_layers(causal_lm)
        hidden = int(causal_lm.config.hidden_size)  # type: ignore[union-attr, arg-type]
        layers = list(range(len(blocks))) if spec.layers is None else list(spec.layers)
        if bad := [x for x in layers if not 0 <= x < len(blocks)]:
            raise ValueError(f"--layers {bad} out of range: the model has {len(blocks)} layers")
        self.layers = layers
        self.shared = spec.share_weights or spec.positions == PREFILL_POSITIONS
        self.parts = (SHARED,) if self.shared else (FIRST, LAST)
        self.spec_positions = parse_positions(spec.positions)
        generator = torch.Generator().manual_seed(seed)
        param = next(causal_lm.parameters())
        self.interventions = nn.ModuleDict(
            {
                f"{layer}_{part}": _Intervention(spec.type, spec.rank, hidden, generator)
                for layer in layers
                for part in self.parts
            }
        ).to(device=param.device, dtype=torch.float32)
        self._codes: torch.Tensor | None = None  # (B, S) part code per position, -1 none
        for layer in layers:
            blocks[layer].register_forward_hook(self._hook(layer))

    def _intervention(self, key: str) -> _Intervention:
        """ModuleDict items are typed as plain modules."""
        return cast(_Intervention, self.interventions[key])

    def _hook(self, layer: int) -> Any:
        def hook(_module: nn.Module, _args: Any, output: Any) -> Any:
            if self._codes is None:
                return output
            hidden = output[0] if isinstance(output, tuple) else output
            h = hidden.float()
            delta = torch.zeros_like(h)
            for code, part in enumerate((FIRST, LAST)):
                where = (self._codes == code)[..., None]
                if not bool(where.any()):
                    continue
                iv = self._intervention(f"{layer}_{SHARED if self.shared else part}")
                delta = delta + where * iv.delta(h)
            hidden = (h + delta).to(hidden.dtype)
            return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

        return hook

    def set_batch(self, batch: Batch | None) -> None:
        if batch is None:
            self._codes = None
            return
        width = batch.input_ids.shape[1]
        codes = np.stack(
            [
                np.where(
                    np.arange(width) < int(length),
                    part_codes(np.arange(width), int(prompt_len), self.spec_positions),
                    NONE,
                )
                for prompt_len, length in zip(batch.prompt_lens.tolist(), batch.lengths.tolist())
            ]
        )
        self._codes = torch.from_numpy(codes).to(batch.input_ids.device)

    def parameters(self) -> list[nn.Parameter]:
        return list(self.interventions.parameters())

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.interventions.state_dict().items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.interventions.load_state_dict(state)

    def _tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for layer in self.layers:
            for part in self.parts:
                for suffix, tensor in self._intervention(f"{layer}_{part}").tensors().items():
                    yield tensor_name(layer, part, suffix), tensor

    def save(self, out: Path, base_model: str) -> None:
        from safetensors.torch import save_file

        out.mkdir(parents=True, exist_ok=True)
        save_file(dict(self._tensors()), str(out / WEIGHTS_FILE))
        config = {
            "peft_type": "REFT",
            REFT_TYPE_KEY: self.spec.type.value,
            "rank": self.spec.rank,
            "layers": self.layers,
            "positions": self.spec.positions,
            "share_weights": self.shared,
            "base_model_name_or_path": base_model,
            MODE_KEY: AdapterMode.PREFILL.value,
        }
        (out / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True))


def attach_adapter(causal_lm: nn.Module, spec: AdapterSpec, seed: int = 0) -> TrainableAdapter:
    """Wrap a loaded causal LM with a fresh trainable adapter of ``spec``."""
    if spec.type is AdapterType.LORA:
        return LoraAdapter(causal_lm, spec)
    return ReftAdapter(causal_lm, spec, seed)
