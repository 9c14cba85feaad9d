"""A training run's configuration (no torch at import, so the CLI stays light)."""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import Any

from preft_serve.training.data import Overlong
from preft_serve.training.spec import AdapterSpec


class Schedule(str, enum.Enum):
    COSINE = "cosine"
    LINEAR = "linear"
    CONSTANT = "constant"


@dataclasses.dataclass
class TrainConfig:
    """Everything a run depends on (recorded in the metrics JSON)."""

    data: Path
    model: Path
    out: Path
    adapter: AdapterSpec = dataclasses.field(default_factory=AdapterSpec)
    validation: Path | None = None
    epochs: int = 3
    max_steps: int | None = None  # overrides epochs
    batch_size: int = 8  # examples per optimizer step
    micro_batch_size: int | None = None  # examples per forward pass (None = batch_size)
    learning_rate: float = 2e-3
    weight_decay: float = 0.0
    warmup_steps: int | None = None  # None: 5% of the steps
    schedule: Schedule = Schedule.COSINE
    max_grad_norm: float = 1.0
    seed: int = 0
    dtype: str = "float32"  # float32 | bfloat16
    device: str = "auto"  # auto | cpu | cuda
    max_seq_len: int = 1024
    overlong: Overlong = Overlong.TRUNCATE
    eval_every: int = 0  # steps; 0 = only at the end
    save_every: int = 0  # steps; 0 = no intermediate checkpoints
    resume: bool = False
    progress: bool = True

    def resolved_device(self) -> Any:
        """The torch.device to train on."""
        import torch

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def as_json(self) -> dict[str, Any]:
        def plain(value: Any) -> Any:
            if isinstance(value, Path):
                return str(value)
            if isinstance(value, enum.Enum):
                return value.value
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return [plain(v) for v in value]
            return value

        result: dict[str, Any] = plain(dataclasses.asdict(self))  # JSON values
        return result
