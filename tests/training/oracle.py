"""Independent teacher-forced losses with the serving semantics (no trainer code).

The oracle of ../shared/ARCHITECTURE.md run teacher-forced: the prompt goes through the
adapted model with ``use_cache=True``; the response tokens go through the *base* model on
that cache (mode ``prefill``, ReFT), or through the adapted model (mode ``all``). The loss
is the summed next-token NLL of the response tokens, the first one scored from the last
prompt position's logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch.nn import functional as F

from tests.engine.reft_oracle import _intervene, _positions


def _nll(first_logits: torch.Tensor, rest_logits: torch.Tensor, response: list[int]) -> float:
    logits = (
        torch.cat([first_logits[None], rest_logits[:-1]])
        if len(response) > 1
        else first_logits[None]
    )
    return float(F.cross_entropy(logits.double(), torch.tensor(response), reduction="sum"))


@torch.no_grad()
def lora_nll(
    model_dir: Path, adapter_dir: Path, prompt: list[int], response: list[int], mode: str
) -> float:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    model = PeftModel.from_pretrained(base, str(adapter_dir)).eval()
    out = model(input_ids=torch.tensor([prompt]), use_cache=True)
    rest = torch.tensor([response])
    if mode == "prefill":
        with model.disable_adapter():
            tail = model(input_ids=rest, past_key_values=out.past_key_values, use_cache=True)
    else:
        tail = model(input_ids=rest, past_key_values=out.past_key_values, use_cache=True)
    return _nll(out.logits[0, -1], tail.logits[0], response)


@torch.no_grad()
def reft_nll(model_dir: Path, adapter_dir: Path, prompt: list[int], response: list[int]) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    weights = load_file(str(adapter_dir / "adapter_model.safetensors"))
    where = _positions(len(prompt), config["positions"])

    def make_hook(layer: int):
        def hook(module, args, output):
            hidden = output[0] if isinstance(output, tuple) else output
            hidden = hidden.clone()
            for pos, part in where.items():
                hidden[0, pos] = _intervene(config, weights, layer, part, hidden[0, pos])
            return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

        return hook

    handles = [
        model.model.layers[layer].register_forward_hook(make_hook(layer))
        for layer in config["layers"]
    ]
    try:
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
    finally:
        for handle in handles:
            handle.remove()
    tail = model(
        input_ids=torch.tensor([response]), past_key_values=out.past_key_values, use_cache=True
    )
    return _nll(out.logits[0, -1], tail.logits[0], response)
