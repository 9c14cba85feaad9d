"""The reference oracle: Hugging Face transformers + peft, independent of vLLM.

* base:    the plain model, greedy.
* all:     the PeftModel with the adapter on every token (greedy, as ``generate``).
* prefill: the prompt runs through the PeftModel with the adapter enabled and
  ``use_cache=True``; then decoding continues greedily under ``disable_adapter()`` on that
  same cache, so every generated token after the first comes from the base model.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch


@functools.lru_cache(maxsize=4)
def _base_model(model_dir: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model.eval()


def _peft_model(model_dir: str, adapter_dir: str):
    from peft import PeftModel

    # A fresh base each time: PeftModel injects layers into the module it wraps.
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return PeftModel.from_pretrained(base, adapter_dir).eval()


@torch.no_grad()
def _greedy(model, prompt: list[int], max_tokens: int) -> list[int]:
    """Greedy decoding with the KV cache that never stops at EOS (vLLM's ``ignore_eos``).

    Equivalent to ``generate(do_sample=False)`` but without its EOS handling: HF stops at
    EOS, and ``min_new_tokens`` would mask the EOS logit, while ``ignore_eos`` keeps it.
    """
    out = model(input_ids=torch.tensor([prompt]), use_cache=True)
    token = int(out.logits[0, -1].argmax())
    generated, cache = [token], out.past_key_values
    for _ in range(max_tokens - 1):
        out = model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True)
        cache, token = out.past_key_values, int(out.logits[0, -1].argmax())
        generated.append(token)
    return generated


@torch.no_grad()
def generate_base(model_dir: str | Path, prompt: list[int], max_tokens: int) -> list[int]:
    return _greedy(_base_model(str(model_dir)), prompt, max_tokens)


@torch.no_grad()
def generate_all(
    model_dir: str | Path, adapter_dir: str | Path, prompt: list[int], max_tokens: int
) -> list[int]:
    return _greedy(_peft_model(str(model_dir), str(adapter_dir)), prompt, max_tokens)


@torch.no_grad()
def generate_prefill(
    model_dir: str | Path, adapter_dir: str | Path, prompt: list[int], max_tokens: int
) -> list[int]:
    model = _peft_model(str(model_dir), str(adapter_dir))
    ids = torch.tensor([prompt])
    out = model(input_ids=ids, use_cache=True)
    cache = out.past_key_values
    token = int(out.logits[0, -1].argmax())
    generated = [token]
    with model.disable_adapter():
        for _ in range(max_tokens - 1):
            step = model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True)
            cache = step.past_key_values
            token = int(step.logits[0, -1].argmax())
            generated.append(token)
    return generated


@torch.no_grad()
def peft_generate(
    model_dir: str | Path, adapter_dir: str | Path, prompt: list[int], max_tokens: int
) -> list[int]:
    """Plain ``PeftModel.generate`` (greedy); it stops early at EOS, unlike the loops above."""
    model = _peft_model(str(model_dir), str(adapter_dir))
    ids = torch.tensor([prompt])
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_tokens,
        do_sample=False,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


@torch.no_grad()
def answer_logprobs(
    model_dir: str | Path, adapter_dir: str | Path, prompt: list[int], answer: list[int], mode: str
) -> list[float]:
    """Log-probability of each ``answer`` token after ``prompt``, teacher-forced.

    mode ``prefill``: the prompt through the adapted model with ``use_cache=True``, the answer
    through the base model on that cache (the first answer token scored from the last prompt
    position's logits). mode ``all``: prompt and answer through the adapted model."""
    model = _peft_model(str(model_dir), str(adapter_dir))
    out = model(input_ids=torch.tensor([prompt]), use_cache=True)
    rest = torch.tensor([answer])
    if mode == "prefill":
        with model.disable_adapter():
            tail = model(input_ids=rest, past_key_values=out.past_key_values, use_cache=True)
    else:
        tail = model(input_ids=rest, past_key_values=out.past_key_values, use_cache=True)
    logits = torch.cat([out.logits[0, -1:], tail.logits[0, :-1]]).double()
    picked = logits.log_softmax(-1).gather(1, rest.T)
    return [float(x) for x in picked[:, 0]]
