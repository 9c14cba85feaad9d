"""Independent ReFT reference: Hugging Face transformers with forward hooks.

Written from the formulas in docs/adapters.md, without any engine code: the prompt pass runs
with hooks that add the intervention at the chosen positions of the chosen layers' outputs;
decoding continues greedily on the cache with the hooks removed. ``all_tokens=True`` keeps
the hooks on while decoding (the first/shared intervention on every new token), the
"classic" ReFT the engine deliberately does not serve.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from tests.engine.oracle import _base_model


def _positions(prompt_len: int, spec: str) -> dict[int, str]:
    """position -> part, per pyreft: first/last n each capped at prompt_len // 2."""
    if spec == "prefill":
        return dict.fromkeys(range(prompt_len), "first")
    first_n = last_n = 0
    for piece in spec.split("+"):
        if piece.startswith("f"):
            first_n = int(piece[1:])
        elif piece.startswith("l"):
            last_n = int(piece[1:])
    first_n, last_n = min(prompt_len // 2, first_n), min(prompt_len // 2, last_n)
    parts = dict.fromkeys(range(prompt_len - last_n, prompt_len), "last")
    parts.update(dict.fromkeys(range(first_n), "first"))
    return parts


def _intervene(config: dict, weights: dict, layer: int, part: str, h: torch.Tensor) -> torch.Tensor:
    if config["share_weights"] or config["positions"] == "prefill":
        part = "shared"
    w = {
        k.rsplit(".", 1)[1]: v.double()
        for k, v in weights.items()
        if k.startswith(f"layers.{layer}.{part}.")
    }
    x = h.double()
    if config["reft_type"] == "direft":
        out = x + (x @ w["w1"].T + w["b"]) @ w["w2"]  # h + W2ᵀ(W1·h + b)
    else:
        out = x + (x @ w["w"].T + w["b"] - x @ w["r"].T) @ w["r"]  # h + Rᵀ(W·h + b − R·h)
    return out.to(h.dtype)


@torch.no_grad()
def generate_reft(
    model_dir: str | Path,
    adapter_dir: str | Path,
    prompt: list[int],
    max_tokens: int,
    all_tokens: bool = False,
) -> list[int]:
    model = _base_model(str(model_dir))
    adapter_dir = Path(adapter_dir)
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    weights = load_file(str(adapter_dir / "adapter_model.safetensors"))
    where = _positions(len(prompt), config["positions"])
    offset = {"pos": 0}

    def make_hook(layer: int):
        def hook(module, args, output):
            hidden = output[0] if isinstance(output, tuple) else output
            hidden = hidden.clone()
            for i in range(hidden.shape[1]):
                pos = offset["pos"] + i
                part = where.get(pos) if pos < len(prompt) else ("first" if all_tokens else None)
                if part is not None:
                    hidden[0, i] = _intervene(config, weights, layer, part, hidden[0, i])
            return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

        return hook

    handles = [
        model.model.layers[layer].register_forward_hook(make_hook(layer))
        for layer in config["layers"]
    ]
    try:
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
        token = int(out.logits[0, -1].argmax())
        generated, cache = [token], out.past_key_values
        if not all_tokens:
            for h in handles:
                h.remove()
            handles = []
        for step in range(max_tokens - 1):
            offset["pos"] = len(prompt) + step
            out = model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True)
            cache, token = out.past_key_values, int(out.logits[0, -1].argmax())
            generated.append(token)
    finally:
        for h in handles:
            h.remove()
    return generated
