"""One vLLM engine per model per test session (real vLLM, PreFT plugin on), plus adapters.

The engines run in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``uni`` executor) so a
session starts each in ~2 s; the budget of 64 batched tokens makes any prompt over 64
tokens a chunked prefill, and ``max_loras=2`` makes most tests oversubscribe adapter slots.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from preft_serve.toymodels import make_model
from tests.support.engine import ARCHS, BATCH_TOKENS, KV_BLOCK, MAX_LORAS, Engine, make_adapters
from tests.support.tiers import tier


@pytest.fixture(scope="session")
@tier("engine")
def engines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Engine]:
    from vllm import LLM

    from preft_serve.worker.engine_config import preft_engine_kwargs

    root = tmp_path_factory.mktemp("engine-models")
    built: dict[str, Engine] = {}
    for arch in ARCHS:
        model_dir = make_model(arch, root / arch)
        llm = LLM(
            model=str(model_dir),
            dtype="float32",
            enforce_eager=True,
            max_loras=MAX_LORAS,
            max_cpu_loras=4,
            max_lora_rank=8,
            kv_cache_memory_bytes=64 << 20,
            distributed_executor_backend="uni",
            max_model_len=512,
            max_num_seqs=8,
            max_num_batched_tokens=BATCH_TOKENS,
            enable_prefix_caching=True,
            block_size=KV_BLOCK,
            seed=0,
            disable_log_stats=False,
            **preft_engine_kwargs(),
        )
        built[arch] = Engine(llm, model_dir, make_adapters(model_dir, root / f"{arch}-adapters"))
    return built


@pytest.fixture(params=ARCHS)
def engine(request: pytest.FixtureRequest, engines: dict[str, Engine]) -> Engine:
    return engines[request.param]
