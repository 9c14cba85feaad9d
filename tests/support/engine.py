"""The engine tests' vLLM engine handle, its adapters and the prompts they use.

``tests/engine/conftest.py`` starts one :class:`Engine` per architecture per session; the
tests use the sizes below to build batches that oversubscribe slots and chunk prompts.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from preft_serve.adapters.format import AdapterMode, AdapterType
from preft_serve.toymodels import LoraSpec, ReftSpec, make_lora_adapter, make_reft_adapter

ARCHS = ("tiny-llama", "tiny-qwen2")
MAX_LORAS = 2
BATCH_TOKENS = 64
KV_BLOCK = 32  # CPU attention wants multiples of 32; the CPU default is 128
ADAPTER_SEEDS = (1, 2, 3, 4)
REFT_SPECS = {
    "direft-f3l3": ReftSpec(AdapterType.DIREFT, rank=4, layers=(0, 1), positions="f3+l3"),
    "loreft-f2l2-shared": ReftSpec(
        AdapterType.LOREFT, rank=8, layers=(1,), positions="f2+l2", share_weights=True
    ),
    "direft-prefill": ReftSpec(AdapterType.DIREFT, rank=2, layers=(0,), positions="prefill"),
    "loreft-l4": ReftSpec(AdapterType.LOREFT, rank=4, layers=(0, 1), positions="l4"),
}


@dataclasses.dataclass
class Engine:
    """A live vLLM engine with the PreFT plugin and the adapters generated for its model."""

    llm: Any
    model_dir: Path
    adapters: dict[str, Path]  # "prefill-1", "all-1", ... -> adapter dir
    _ids: Iterator[int] = dataclasses.field(default_factory=lambda: itertools.count(1))
    _requests: dict[tuple[str, str], Any] = dataclasses.field(default_factory=dict)

    def lora(self, name: str | None, path: Path | None = None) -> Any:
        """A LoRARequest for adapter ``name`` (stable id per name and path)."""
        from vllm.lora.request import LoRARequest

        if name is None:
            return None
        path = path or self.adapters[name]
        key = (name, str(path))
        if key not in self._requests:
            self._requests[key] = LoRARequest(name, next(self._ids), str(path))
        return self._requests[key]

    def fresh_lora(self, name: str, path: Path) -> Any:
        """A new registration (new int id) of ``name`` at ``path``, as a reload would do."""
        from vllm.lora.request import LoRARequest

        request = LoRARequest(name, next(self._ids), str(path))
        self._requests[(name, str(path))] = request
        return request

    def settle(self, names: list[str | None]) -> None:
        """Serve each adapter of ``names`` once, so that a batch of them starts whole. The
        worker parses an adapter it does not hold in host memory in the background and the
        scheduler holds its requests until then: on a slow machine a batch's first
        requests could finish before its held ones start. (Eight-token prompts fill no KV
        block, so the prefix cache keeps nothing of these.)"""
        adapters = sorted({n for n in names if n is not None})
        warm_up = [prompt(900 + i, 8) for i in range(len(adapters))]
        self.tokens(warm_up, [self.lora(n) for n in adapters], 1)

    def generate(
        self,
        prompts: list[list[int]],
        loras: list[Any],
        max_tokens: int = 16,
        extra_args: list[dict[str, Any] | None] | None = None,
    ) -> list[Any]:
        """Greedy answers of ``max_tokens`` each; ``extra_args``: per request, what a
        request's ``vllm_xargs`` would carry."""
        from vllm import SamplingParams

        params: Any = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        if extra_args is not None:
            params = [
                SamplingParams(
                    temperature=0.0, max_tokens=max_tokens, ignore_eos=True, extra_args=args
                )
                for args in extra_args
            ]
        return self.llm.generate(
            [{"prompt_token_ids": p} for p in prompts],
            params,
            lora_request=loras,
            use_tqdm=False,
        )

    def tokens(
        self, prompts: list[list[int]], loras: list[Any], max_tokens: int = 16
    ) -> list[list[int]]:
        return [list(o.outputs[0].token_ids) for o in self.generate(prompts, loras, max_tokens)]


def scheduler_of(llm: Any) -> Any:
    """The scheduler of an in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``; vLLM
    0.32's LLMEngine -> InprocClient -> EngineCore), for tests that watch its decisions."""
    return llm.llm_engine.engine_core.engine_core.scheduler


def make_adapters(model_dir: Path, root: Path) -> dict[str, Path]:
    """Prefill and all versions of the same LoRA weights for each seed, and ReFT adapters."""
    adapters = {}
    for seed, (name, spec) in enumerate(REFT_SPECS.items(), start=100):
        adapters[name] = make_reft_adapter(model_dir, root / name, seed=seed, spec=spec)
    for seed in ADAPTER_SEEDS:
        for mode in AdapterMode:
            name = f"{mode.value}-{seed}"
            adapters[name] = make_lora_adapter(
                model_dir, root / name, seed=seed, spec=LoraSpec(rank=8, mode=mode)
            )
    return adapters


MAX_TOKENS = 16


def prompt(seed: int, length: int) -> list[int]:
    """``length`` random byte tokens, the same for the same seed."""
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(length)]
