"""Deterministic random-init Llama / Qwen2 checkpoints for tests, demo and benchmarks.

``initializer_range`` ~0.15 makes a random model's greedy output depend strongly on small
weight changes, so base, all-token and prefill-only adapters give visibly different text.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from preft_serve.toymodels.tokenizer import save_byte_tokenizer

_MARKER = "preft_toymodel.json"


@dataclasses.dataclass(frozen=True)
class ModelPreset:
    """Architecture and sizes of one generated model."""

    name: str
    architecture: str  # "llama" | "qwen2"
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int = 320
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    initializer_range: float = 0.15

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def hf_config(self) -> Any:
        from transformers import LlamaConfig, Qwen2Config

        common: dict[str, Any] = {
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "initializer_range": self.initializer_range,
            "bos_token_id": 256,
            "eos_token_id": 257,
            "pad_token_id": 258,
            "torch_dtype": "float32",
        }
        if self.architecture == "llama":
            return LlamaConfig(**common, head_dim=self.head_dim)
        if self.architecture == "qwen2":
            return Qwen2Config(**common)
        raise ValueError(f"unknown architecture {self.architecture!r}: use llama or qwen2")


PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        # Test models: tiny, fast to start, outputs sensitive to adapters.
        ModelPreset("tiny-llama", "llama", 128, 256, 2, 4, 2),
        ModelPreset("tiny-qwen2", "qwen2", 128, 256, 2, 4, 2),
        # Benchmark model for CPU runs: big enough that matmuls, not Python, dominate.
        ModelPreset("bench-llama", "llama", 512, 1408, 4, 8, 4, initializer_range=0.02),
        # Qwen2.5-0.5B's real shapes (GPU-sized benchmarks; ~2 GB in float32).
        ModelPreset(
            "qwen2.5-0.5b-shapes",
            "qwen2",
            896,
            4864,
            24,
            14,
            2,
            vocab_size=151936,
            max_position_embeddings=32768,
            tie_word_embeddings=True,
            initializer_range=0.02,
        ),
    )
}


def make_model(preset: str | ModelPreset, directory: str | Path, seed: int = 0) -> Path:
    """Write a Hugging Face model directory for ``preset``; reuse it if already there.

    Generation is deterministic in (preset, seed), so tests on different machines see
    identical weights.
    """
    import torch
    from transformers import AutoModelForCausalLM

    spec = PRESETS[preset] if isinstance(preset, str) else preset
    directory = Path(directory)
    marker = {"preset": dataclasses.asdict(spec), "seed": seed, "format": 1}
    marker_path = directory / _MARKER
    if marker_path.exists() and json.loads(marker_path.read_text()) == marker:
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(spec.hf_config(), dtype=torch.float32)
    model.generation_config.do_sample = False
    model.save_pretrained(directory, safe_serialization=True)
    save_byte_tokenizer(directory, spec.vocab_size)
    marker_path.write_text(json.dumps(marker, indent=1))
    return directory
