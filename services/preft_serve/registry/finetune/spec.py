"""What a trainer process is told to do: one JSON document, the same for every backend.

The registry resolves a job's request (hyperparameters, method, files) into a
:class:`TrainerSpec`; the trainer (``python -m preft_serve.registry.finetune.entry``) reads it from
``PREFT_TRAINER_SPEC`` and the object store from ``PREFT_TRAINER_OBJECT_STORE__*``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

OUTPUT_FILES = ("adapter_config.json", "adapter_model.safetensors", "training_metrics.json")
"""What a trainer stores, in this order: the last one present means the output is whole."""


def output_prefix(job_id: str) -> str:
    return f"finetune/{job_id}/"


class TrainerSpec(BaseModel):
    job_id: str
    model: str = Field(description="Base model directory as the trainer sees it")
    training_key: str = Field(description="Object-store key of the training JSONL")
    validation_key: str | None = None
    options: dict[str, Any] = Field(description="TrainConfig/AdapterSpec fields")

    @property
    def output_prefix(self) -> str:
        return output_prefix(self.job_id)


def train_config(spec: TrainerSpec, data: Path, validation: Path | None, out: Path) -> Any:
    """The :class:`TrainConfig` of a spec (imports the trainer's config, no torch)."""
    from preft_serve.adapters.format import AdapterMode, AdapterType
    from preft_serve.training.config import TrainConfig
    from preft_serve.training.spec import LORA_MODULES, AdapterSpec

    o = spec.options
    adapter = AdapterSpec(
        type=AdapterType(o["adapter"]),
        mode=AdapterMode(o["mode"]),
        rank=o["rank"],
        alpha=o.get("alpha"),
        target_modules=tuple(o.get("target_modules") or LORA_MODULES),
        layers=tuple(o["layers"]) if o.get("layers") else None,
        positions=o.get("positions", "prefill"),
    )
    return TrainConfig(
        data=data,
        model=Path(spec.model),
        out=out,
        adapter=adapter,
        validation=validation,
        epochs=o["epochs"],
        max_steps=o.get("steps"),
        batch_size=o["batch_size"],
        learning_rate=o["learning_rate"],
        warmup_steps=o.get("warmup_steps"),
        seed=o["seed"],
        max_seq_len=o["max_seq_len"],
        device=o.get("device", "auto"),
        progress=True,
    )
