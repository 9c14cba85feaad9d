"""What to train: the adapter's family, mode and shape (no torch, so the CLI stays light)."""

from __future__ import annotations

import dataclasses

from preft_serve.adapters.families.lora import LORA_MODULES
from preft_serve.adapters.format import AdapterMode, AdapterType
from preft_serve.adapters.reft_format import PREFILL_POSITIONS, parse_positions
from preft_serve.common.text import shown

__all__ = ["LORA_MODULES", "AdapterSpec"]


@dataclasses.dataclass(frozen=True)
class AdapterSpec:
    """What to train. LoRA fields apply to ``lora``, ReFT fields to ``direft``/``loreft``."""

    type: AdapterType = AdapterType.LORA
    mode: AdapterMode = AdapterMode.PREFILL
    rank: int = 8
    alpha: float | None = None  # LoRA; None = rank (scale 1)
    target_modules: tuple[str, ...] = LORA_MODULES
    rslora: bool = False
    dropout: float = 0.0
    layers: tuple[int, ...] | None = None  # ReFT; None = every layer
    positions: str = PREFILL_POSITIONS  # ReFT: f{n}+l{n} | f{n} | l{n} | prefill
    share_weights: bool = False  # ReFT: one intervention for first and last positions

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"--rank must be at least 1 (got {self.rank})")
        if self.type is not AdapterType.LORA:
            if self.mode is not AdapterMode.PREFILL:
                raise ValueError("ReFT adapters are prefill-only: use --mode prefill")
            parse_positions(self.positions)  # raises with the accepted forms
        elif unknown := sorted(set(self.target_modules) - set(LORA_MODULES)):
            names = ", ".join(shown(name) for name in unknown[:7])
            raise ValueError(
                f"--target-modules {names} are not supported; choose from {', '.join(LORA_MODULES)}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"--dropout must be in [0, 1) (got {self.dropout})")

    def describe(self) -> str:
        if self.type is AdapterType.LORA:
            return (
                f"LoRA r={self.rank} alpha={self.alpha or self.rank} mode={self.mode.value} "
                f"on {','.join(self.target_modules)}"
            )
        return (
            f"{self.type.value} rank={self.rank} positions={self.positions} "
            f"layers={'all' if self.layers is None else list(self.layers)}"
        )
