"""Engine-loop time of a cold adapter's ``add_lora``: stock vLLM load vs PreFT's preload.

vLLM's OpenAI server calls ``engine_client.add_lora`` after a resolver finds an adapter;
that call runs between engine steps, so every running request waits for it. One in-process
engine (bench-llama, rank-16 LoRAs on all seven projections); rounds alternate the stock
path (parse the weights inside the call) and the preload path (check the config, parse in
a background thread, the first step copies the parsed weights into a slot). Reported: the
``add_lora`` times (what the engine loop spends) and the first request's time per adapter.

    python -m bench.experiments.cold_load_ab          # ~2 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench.results import add_result_dir, result_path

ALL_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.experiments.cold_load_ab",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--per-round", type=int, default=10, help="cold adapters per round")
    p.add_argument("--rounds", type=int, default=2, help="rounds of each path")
    p.add_argument("--var", type=Path, default=Path("var/bench/cold-ab"))
    p.add_argument("--out", type=Path, help="results JSON (default RESULT_DIR/cold_load_ab.json)")
    add_result_dir(p)
    args = p.parse_args(argv)
    args.out = args.out or result_path(args.result_dir, "cold_load_ab.json")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine loop in this process

    import vllm
    from vllm.lora.request import LoRARequest

    from preft_serve.toymodels import LoraSpec, make_lora_adapter, make_model
    from preft_serve.worker.engine_config import preft_engine_kwargs
    from preft_serve.worker.vllm_compat import model_runner

    model = make_model("bench-llama", args.var / "model")
    spec = LoraSpec(rank=16, std=0.05, target_modules=ALL_PROJECTIONS)
    count = 2 * args.rounds * args.per_round
    dirs = [make_lora_adapter(model, args.var / f"a{i}", seed=i, spec=spec) for i in range(count)]
    llm = vllm.LLM(
        str(model),
        dtype="float32",
        enforce_eager=True,
        max_loras=4,
        max_cpu_loras=8,
        max_lora_rank=16,
        max_model_len=512,
        distributed_executor_backend="uni",
        kv_cache_memory_bytes=1 << 28,
        block_size=32,
        **preft_engine_kwargs("cpu"),
    )
    params = vllm.SamplingParams(max_tokens=2, temperature=0)
    preload = model_runner.start_background_parse
    results: dict[str, dict[str, list[float]]] = {}
    ids = iter(range(1, count + 1))
    for path in ["stock", "preload"] * args.rounds:
        # the stock path: the seam declines, so vLLM's own add_lora parses in the call
        model_runner.start_background_parse = preload if path == "preload" else _decline  # type: ignore[assignment]
        row = results.setdefault(path, {"add_lora_ms": [], "first_request_ms": []})
        for _ in range(args.per_round):
            n = next(ids)
            request = LoRARequest(f"cold-{n}", n, str(dirs[n - 1].resolve()))
            start = time.perf_counter()
            llm.llm_engine.add_lora(request)
            row["add_lora_ms"].append(round(1000 * (time.perf_counter() - start), 2))
            time.sleep(0.05)  # the server routes the request meanwhile
            start = time.perf_counter()
            llm.generate([[1, 2, 3, 4]], params, lora_request=request, use_tqdm=False)
            row["first_request_ms"].append(round(1000 * (time.perf_counter() - start), 2))
    model_runner.start_background_parse = preload
    summary = {
        "adapter_bytes": (dirs[0] / "adapter_model.safetensors").stat().st_size,
        **{
            path: {f"{k}_median": statistics.median(v) for k, v in row.items()}
            | {"add_lora_ms_max": max(row["add_lora_ms"])}
            for path, row in results.items()
        },
        "raw": results,
    }
    for path in ("stock", "preload"):
        print(
            f"{path:>8}: add_lora median {summary[path]['add_lora_ms_median']:.1f} ms "
            f"(max {summary[path]['add_lora_ms_max']:.1f}), first request median "
            f"{summary[path]['first_request_ms_median']:.0f} ms"
        )
    args.out.write_text(json.dumps(summary, indent=1))
    print(f"wrote {args.out}")
    return 0


def _decline(*_: Any) -> bool:
    return False


if __name__ == "__main__":
    raise SystemExit(main())
