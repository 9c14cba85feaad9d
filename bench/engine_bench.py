"""Engine throughput: base vs stock vLLM multi-LoRA vs our all-token LoRA vs PreFT.

Offline workload, identical for every mode: ``--requests`` requests of ``--prompt-len``
random tokens, ``--output-len`` generated tokens each (``ignore_eos``), rank-16 LoRA on
q,k,v,o (or rank-8 DiReFT / LoReFT at positions f7+l7 of every layer), request ``i``
using adapter ``i % adapters``, on any Hugging Face model directory (``--model DIR``) or a
generated preset (``--model bench-llama``, the default).

How it measures, so that ratios mean something on a small, shared machine:
- runs are planned in *groups* (every mode at one adapter count and one ``max_loras``);
  each group gets its own base-model engine, and all its engines stay alive side by side
  in two processes: plain vLLM for "stock-lora" (``VLLM_PLUGINS=""``), the preft plugin
  for the others and the base model (without LoRA the plugin changes nothing for it);
- each engine is warmed up, untimed, before the first round: one short request per
  adapter (every adapter in host memory, every slot used), then a batch of full-length
  requests;
- then the engines take turns: a round runs the same workload once on each, in alternating
  order (A B C, C B A, ...), with fresh random prompts per round (no prefix-cache hits);
- every engine computes on one thread (``--threads``) and a round is timed in the process's
  CPU time as well as wall time: a ratio is a round's throughput over the base engine's in
  the same round, a row reports the median over rounds and their range. CPU time is the
  default basis: a neighbour that takes the core for a while then does not count.

    python -m bench.engine_bench                  # full matrix, bench-llama
    python -m bench.engine_bench --model var/models/smollm2-135m-instruct
    python -m bench.engine_bench --quick          # < 5 minutes, checks its own sanity
    python -m bench.engine_bench --check FILE     # sanity of a recorded quick run
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from bench import engine_report
from bench.engine_report import ADAPTER_MODES
from bench.results import add_result_dir, result_path

VAR = Path("var/bench")
ADAPTER_PREFIX = {
    "stock-lora": "all",
    "all-lora": "all",
    "preft-lora": "prefill",
    "preft-direft": "direft",
    "preft-loreft": "loreft",
}
LORA_MODES = ("stock-lora", "all-lora", "preft-lora")
REFT_RANK, REFT_POSITIONS = 8, "f7+l7"  # ReFT rank by default (--reft-rank)
BLOCK = 32


@dataclasses.dataclass(frozen=True)
class Run:
    mode: str
    adapters: int
    max_loras: int

    @property
    def label(self) -> str:
        return f"{self.mode}@{self.adapters}a/max_loras={self.max_loras}"


@dataclasses.dataclass(frozen=True)
class Shape:
    """What the memory estimates need from a model's config.json."""

    layers: int
    hidden: int
    q: int  # heads * head_dim
    kv: int  # kv heads * head_dim
    intermediate: int
    vocab: int
    params_bytes: int

    @classmethod
    def of(cls, model: Path) -> Shape:
        c = json.loads((model / "config.json").read_text())
        head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        weights = sum(p.stat().st_size for p in model.glob("*.safetensors"))
        return cls(
            c["num_hidden_layers"],
            c["hidden_size"],
            c["num_attention_heads"] * head_dim,
            c.get("num_key_value_heads", c["num_attention_heads"]) * head_dim,
            c["intermediate_size"],
            c["vocab_size"],
            weights,
        )

    def kv_bytes(self, tokens: int) -> int:
        return tokens * self.layers * 2 * self.kv * 4

    def slot_bytes(self, rank: int) -> int:
        """vLLM's stacked LoRA buffers per slot (float32): it wraps every linear layer
        (qkv, o, gate_up, down) and the embedding, whatever the adapters target."""
        h, i = self.hidden, self.intermediate
        per_layer = (3 * h + self.q + 2 * self.kv) + (self.q + h) + (2 * h + 2 * i) + (i + h)
        return 4 * rank * (self.layers * per_layer + self.vocab + h)


def plan(
    adapter_counts: list[int],
    max_loras: int,
    sweep: list[int],
    modes: tuple[str, ...] = ADAPTER_MODES,
) -> list[list[Run]]:
    """Groups of runs that are measured side by side (each with the base engine): every
    mode at every adapter count at ``max_loras``, then every mode at the top count at each
    other ``max_loras`` of ``sweep`` (the slot counts a mode may need to do its best)."""
    modes = tuple(m for m in ADAPTER_MODES if m in modes)
    groups = [[Run(m, count, max_loras) for m in modes] for count in adapter_counts]
    top = max(adapter_counts)
    groups += [[Run(m, top, s) for m in modes] for s in sweep if s != max_loras and s <= top]
    return [g for g in groups if g]


def engine_memory(run: Run, shape: Shape, common: dict) -> int:
    """Rough resident bytes of one engine process, for packing groups into memory."""
    mem = 1_400 << 20  # python, torch, vLLM
    mem += shape.params_bytes + common["kv_bytes"]
    if run.mode in LORA_MODES:
        mem += run.adapters * common["adapter_bytes"] + run.max_loras * shape.slot_bytes(
            common["rank"]
        )
    return mem


def pack(group: list[Run], shape: Shape, common: dict, budget: int) -> list[list[Run]]:
    """Split a group so that the engines alive at once (plus the base engine) fit."""
    free = budget - engine_memory(Run("base", 0, 0), shape, common)
    out: list[list[Run]] = [[]]
    used = 0
    for run in group:
        need = engine_memory(run, shape, common)
        if out[-1] and used + need > free:
            out.append([])
            used = 0
        out[-1].append(run)
        used += need
    return out


# -- adapters ---------------------------------------------------------------------------


def prepare_adapters(
    model: Path,
    root: Path,
    count: int,
    rank: int,
    reft_rank: int = REFT_RANK,
    reft_positions: str = REFT_POSITIONS,
) -> None:
    """LoRA (prefill and all-token versions of the same weights, one file hard-linked) and
    ReFT adapters on every layer (cached across runs)."""
    from preft_serve.adapters.format import (
        CONFIG_FILE,
        MODE_KEY,
        WEIGHTS_FILE,
        AdapterMode,
        AdapterType,
    )
    from preft_serve.toymodels import LoraSpec, ReftSpec, make_lora_adapter, make_reft_adapter

    layers = tuple(range(json.loads((model / "config.json").read_text())["num_hidden_layers"]))
    for i in range(count):
        src = root / f"{AdapterMode.ALL.value}-{i}"
        if not (src / WEIGHTS_FILE).exists():
            make_lora_adapter(
                model,
                src,
                seed=10_000 + i,
                spec=LoraSpec(rank=rank, mode=AdapterMode.ALL, std=0.02),
            )
        dst = root / f"{AdapterMode.PREFILL.value}-{i}"
        if not (dst / WEIGHTS_FILE).exists():
            dst.mkdir(parents=True, exist_ok=True)
            config = json.loads((src / CONFIG_FILE).read_text())
            config[MODE_KEY] = AdapterMode.PREFILL.value
            (dst / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True))
            os.link(src / WEIGHTS_FILE, dst / WEIGHTS_FILE)
        for kind in (AdapterType.DIREFT, AdapterType.LOREFT):
            out = root / f"{kind.value}-{i}"
            if not (out / WEIGHTS_FILE).exists():
                make_reft_adapter(
                    model,
                    out,
                    seed=20_000 + i,
                    spec=ReftSpec(
                        kind, rank=reft_rank, layers=layers, positions=reft_positions, std=0.02
                    ),
                )
        if (i + 1) % 64 == 0:
            print(f"  adapters ready: {i + 1}/{count}", flush=True)


# -- child process: engines that time a round on request --------------------------------


def _slot_bytes(worker: Any) -> int:
    """Bytes of vLLM's stacked LoRA buffers (all slots) in the worker's model."""
    seen, total = set(), 0
    for module in worker.model_runner.get_model().modules():
        for name in ("lora_a_stacked", "lora_b_stacked"):
            value = getattr(module, name, None)
            for t in value if isinstance(value, (tuple, list)) else (value,):
                if hasattr(t, "data_ptr") and t.data_ptr() not in seen:
                    seen.add(t.data_ptr())
                    total += t.numel() * t.element_size()
    return total


class BenchEngine:
    """One ``vllm.LLM`` for one run, its adapters and its workload."""

    def __init__(self, cfg: dict) -> None:
        from vllm import LLM, SamplingParams
        from vllm.lora.request import LoRARequest

        from preft_serve.worker.engine_config import preft_engine_kwargs

        self.cfg = cfg
        mode, adapters = cfg["mode"], cfg["adapters"]
        kwargs: dict = {
            "model": cfg["model"],
            "dtype": "float32",
            "enforce_eager": True,
            "seed": 0,
            "kv_cache_memory_bytes": cfg["kv_bytes"],
            "block_size": BLOCK,
            "max_num_seqs": cfg["max_num_seqs"],
            "max_num_batched_tokens": cfg["batch_tokens"],
            "max_model_len": cfg["prompt_len"] + cfg["output_len"] + 16,
        }
        if mode != "base":
            from preft_serve.worker.vllm_compat.engine_args import engine_max_lora_rank

            kwargs.update(
                enable_lora=True,
                max_loras=cfg["max_loras"],
                max_lora_rank=engine_max_lora_rank(cfg["rank"]),
                max_cpu_loras=max(adapters, cfg["max_loras"]),
            )
        if mode not in ("base", "stock-lora"):
            kwargs.update(preft_engine_kwargs())
        t0 = time.perf_counter()
        self.llm = LLM(**kwargs)
        self.start_s = time.perf_counter() - t0
        prefix = ADAPTER_PREFIX.get(mode, "all")
        root = Path(cfg["adapter_root"])
        self.loras = [
            LoRARequest(f"{prefix}-{i}", i + 1, str(root / f"{prefix}-{i}"))
            for i in range(adapters)
        ]
        n = cfg["requests"]
        self.assignment = [self.loras[i % adapters] for i in range(n)] if self.loras else None
        self.params = SamplingParams(temperature=0.0, max_tokens=cfg["output_len"], ignore_eos=True)
        self.short = SamplingParams(max_tokens=2)

    def prompts(self, seed: int, count: int, length: int) -> list[dict]:
        """Random prompts, the same for every engine given the same seed."""
        import random

        rng = random.Random(seed)
        vocab = self.cfg["vocab"]
        low = 256 if vocab > 1024 else 0  # clear of special tokens in real vocabularies
        return [
            {"prompt_token_ids": [rng.randrange(low, vocab) for _ in range(length)]}
            for _ in range(count)
        ]

    def warm_up(self) -> dict:
        """Untimed: every adapter once into host memory and through a slot, then one batch
        of full-length requests (allocator, KV blocks, every kernel at full size)."""
        cfg = self.cfg
        t0 = time.perf_counter()
        if self.loras:
            self.llm.generate(
                self.prompts(-1, len(self.loras), 8),
                self.short,
                lora_request=self.loras,
                use_tqdm=False,
            )
        warm = min(cfg["requests"], cfg["warmup_requests"])
        self.llm.generate(
            self.prompts(-2, warm, cfg["prompt_len"]),
            self.params,
            lora_request=self.assignment[:warm] if self.assignment else None,
            use_tqdm=False,
        )
        slot = 0
        if cfg["mode"] != "base":
            slot = self.llm.collective_rpc(_slot_bytes)[0] // cfg["max_loras"]
        return {
            "mode": cfg["mode"],
            "adapters": cfg["adapters"],
            "max_loras": cfg["max_loras"],
            "engine_start_s": round(self.start_s, 2),
            "warmup_s": round(time.perf_counter() - t0, 2),
            "slot_bytes": slot,
            "adapter_host_bytes": sum(
                (Path(r.lora_path) / "adapter_model.safetensors").stat().st_size for r in self.loras
            ),
        }

    def round(self, seed: int) -> dict:
        import resource

        batch = self.prompts(seed, self.cfg["requests"], self.cfg["prompt_len"])
        cpu0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        outs = self.llm.generate(batch, self.params, lora_request=self.assignment, use_tqdm=False)
        elapsed = time.perf_counter() - t0
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        in_tokens = sum(len(o.prompt_token_ids) for o in outs)
        return {
            "mode": self.cfg["mode"],
            "adapters": self.cfg["adapters"],
            "max_loras": self.cfg["max_loras"],
            "elapsed_s": round(elapsed, 3),
            "cpu_s": round(cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 3),
            "output_tokens": out_tokens,
            "input_tokens": in_tokens,
            "output_tokens_per_s": round(out_tokens / elapsed, 2),
            "total_tokens_per_s": round((out_tokens + in_tokens) / elapsed, 2),
        }


def host(cfgs: list[dict], proto: IO[str]) -> None:
    """Build and warm up the engines one after the other, report ``READY``, then time a
    round of engine ``i`` per ``{"engine": i, "seed": n}`` line on stdin."""
    engines = []
    for cfg in cfgs:
        engine = BenchEngine(cfg)
        info = engine.warm_up()
        engines.append(engine)
        proto.write("READY " + json.dumps(info) + "\n")
        proto.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        proto.write("RESULT " + json.dumps(engines[cmd["engine"]].round(cmd["seed"])) + "\n")
        proto.flush()


def host_main(cfg_json: str) -> None:
    # The protocol gets the real stdout; everything libraries print goes to stderr.
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    host(json.loads(cfg_json), proto)


# -- parent: plan, start engines, run rounds, report -------------------------------------


class Host:
    """A child process hosting engines that share one setting of the preft plugin: plain
    vLLM ("stock-lora"; ``VLLM_PLUGINS=""``) or plugin loaded (every other mode; the base
    model runs there too: without LoRA the plugin changes nothing for it)."""

    def __init__(
        self,
        runs: list[Run],
        common: dict,
        log_file: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.runs = runs
        cfgs = [
            {**common, "mode": r.mode, "adapters": r.adapters, "max_loras": r.max_loras}
            for r in runs
        ]
        env = {
            **os.environ,
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "TQDM_DISABLE": "1",
            "OMP_NUM_THREADS": str(common["threads"]),
            "VLLM_USE_V2_MODEL_RUNNER": "0",
            # One adapter family per run: a slot kept for prefill-only adapters would only
            # cap the classic ones (preft_serve.worker.decode_slots).
            "PREFT_WORKER_PREFILL_RESERVED_SLOTS": "0",
            **(env or {}),
        }
        if any(r.mode == "stock-lora" for r in runs):
            assert all(r.mode == "stock-lora" for r in runs)
            env["VLLM_PLUGINS"] = ""  # plain vLLM: the preft plugin does not load
        log_file.parent.mkdir(parents=True, exist_ok=True)
        self.log = log_file
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.engine_bench", "--host", json.dumps(cfgs)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log_file.open("w"),
            text=True,
            cwd=cwd,
        )

    def _read(self, tag: str) -> dict:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(tag + " "):
                return json.loads(line[len(tag) + 1 :])
        tail = self.log.read_text()[-4000:]
        raise RuntimeError(f"engine host exited ({self.proc.wait()}); log tail:\n{tail}")

    def ready(self) -> list[dict]:
        return [self._read("READY") for _ in self.runs]

    def round(self, engine: int, seed: int) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"engine": engine, "seed": seed}) + "\n")
        self.proc.stdin.flush()
        return self._read("RESULT")

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def interleaved_rounds(members: list[tuple[Host, int, str, dict]], rounds: int) -> list[dict]:
    """``rounds`` rounds in which every member ``(host, engine index, label, extra fields)``
    runs the workload once, in alternating order (A B C, C B A, ...); one record per run,
    with the extra fields and the round number, and a progress line per round."""
    records: list[dict] = []
    for i in range(rounds):
        order = members if i % 2 == 0 else members[::-1]
        line = []
        for host, index, label, extra in order:
            r = host.round(index, seed=i)
            records.append({**r, **extra, "round": i})
            line.append(f"{label} {r['output_tokens'] / r['cpu_s']:.0f}")
        print(f"  round {i + 1}/{rounds}: " + ", ".join(line) + " out tok/CPU-s", flush=True)
    return records


def measure(
    groups: list[list[Run]], common: dict, rounds: int, log_dir: Path
) -> tuple[list[dict], list[dict]]:
    """Run every group side by side with its own base engine; returns (rounds, engines).

    A group's two hosts (stock; plugin with base) start in parallel, each building and
    warming up its engines one by one (nothing is timed meanwhile); then the engines take
    turns, one round each, in alternating order."""
    results: list[dict] = []
    engines_info: list[dict] = []
    for g, group in enumerate(groups):
        print(f"group {g + 1}/{len(groups)}: " + ", ".join(r.label for r in group), flush=True)
        ours = [Run("base", 0, common["max_loras"])] + [r for r in group if r.mode != "stock-lora"]
        stock = [r for r in group if r.mode == "stock-lora"]
        hosts = [Host(ours, common, log_dir / f"group{g}-preft.log")]
        if stock:
            hosts.append(Host(stock, common, log_dir / f"group{g}-stock.log"))
        try:
            members = []
            for h in hosts:
                for i, info in enumerate(h.ready()):
                    engines_info.append(info)
                    members.append((h, i, h.runs[i]))
                    print(
                        f"  ready {h.runs[i].label}: start {info['engine_start_s']} s, "
                        f"warm-up {info['warmup_s']} s",
                        flush=True,
                    )
            results += interleaved_rounds(
                [(h, index, run.mode, {"group": g}) for h, index, run in members], rounds
            )
        finally:
            for h in hosts:
                h.close()
    return results, engines_info


def resolve_model(spec: str, var: Path = VAR) -> tuple[Path, str]:
    """A model directory, or a toy preset generated under ``var``."""
    path = Path(spec)
    if (path / "config.json").exists():
        return path, path.name
    from preft_serve.toymodels import PRESETS, make_model

    if spec not in PRESETS:
        raise SystemExit(
            f"--model {spec}: neither a model directory nor a preset ({', '.join(PRESETS)})"
        )
    return make_model(spec, var / spec), spec


def batch_tokens(args: argparse.Namespace, w: dict) -> int:
    """Every engine's token budget per step: by default ``max_loras x prompt_len``, the
    prefill an adapter mode can schedule in one step when every request has its own
    adapter. The base model gets the same budget because it is its better one here: on
    bench-llama, 2 cores, base ran ~10% fewer output tokens per CPU-second at 2048 tokens
    (16 prompts a step) than at 1024, and with 2048 the PreFT modes (8 prompts a step)
    came out 1.03-1.09x "base" in quick runs, i.e. the reference was not the upper bound."""
    return args.batch_tokens or args.max_loras * w["prompt_len"]


def setup(args: argparse.Namespace, w: dict, model: Path, name: str, shape: Shape) -> dict:
    """Adapters on disk; the settings every engine of the run shares."""
    reft = "" if args.reft_rank == REFT_RANK else f"-reft{args.reft_rank}"
    if args.reft_positions != REFT_POSITIONS:
        reft += f"-{args.reft_positions.replace('+', '')}"
    adapter_root = args.var / f"{name}-r{args.rank}{reft}-adapters"
    print(
        f"model {model}; preparing {max(w['counts'])} adapters under {adapter_root} ...", flush=True
    )
    prepare_adapters(
        model, adapter_root, max(w["counts"]), args.rank, args.reft_rank, args.reft_positions
    )
    seq_tokens = math.ceil((w["prompt_len"] + w["output_len"] + 16) / BLOCK) * BLOCK
    return {
        "model": str(model),
        "adapter_root": str(adapter_root),
        "rank": args.rank,
        "reft_rank": args.reft_rank,
        "reft_positions": args.reft_positions,
        "vocab": shape.vocab,
        "requests": w["requests"],
        "prompt_len": w["prompt_len"],
        "output_len": w["output_len"],
        "max_num_seqs": args.max_num_seqs,
        "batch_tokens": batch_tokens(args, w),
        "max_loras": args.max_loras,
        "threads": args.threads,
        "warmup_requests": w["warmup_requests"],
        "kv_bytes": max(256 << 20, int(shape.kv_bytes(args.max_num_seqs * seq_tokens) * 1.1)),
        "adapter_bytes": (adapter_root / "all-0" / "adapter_model.safetensors").stat().st_size,
    }


QUICK = {
    "requests": 64,
    "counts": [64],
    "sweep": [],
    "rounds": 3,
    "prompt_len": 128,
    "output_len": 32,
    "warmup_requests": 16,
}
"""``--quick``: one adapter count (64, 8 slots), every mode, 3 interleaved rounds of
64 x (128 + 32) tokens (~10k tokens a round; a base round takes several CPU-seconds on
bench-llama): under 5 minutes on an idle 2-core machine, every engine start included."""
FULL = {
    "requests": 512,
    "counts": [1, 8, 64, 512],
    "sweep": [32, 128, 512],
    "rounds": 3,
    "prompt_len": 128,
    "output_len": 64,
    "warmup_requests": 32,
}


def workload(args: argparse.Namespace) -> dict:
    """The run's settings: ``--quick`` or full defaults, overridden by explicit options."""
    w = dict(QUICK if args.quick else FULL)
    for key, value in (
        ("requests", args.requests),
        ("counts", args.adapters),
        ("sweep", args.sweep),
        ("rounds", args.rounds),
        ("prompt_len", args.prompt_len),
        ("output_len", args.output_len),
        ("warmup_requests", args.warmup_requests),
    ):
        if value is not None:
            w[key] = value
    return w


def _reft_positions(value: str) -> str:
    from preft_serve.adapters.format import AdapterFormatError
    from preft_serve.adapters.reft_format import parse_positions

    try:
        parse_positions(value)
    except AdapterFormatError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model",
        default="bench-llama",
        help="Hugging Face model directory, or a toy preset (default bench-llama)",
    )
    p.add_argument("--preset", help=argparse.SUPPRESS)  # old spelling of --model PRESET
    p.add_argument(
        "--quick",
        action="store_true",
        help="64 adapters, every mode, 3 rounds: meaningful ratios in < 5 min",
    )
    p.add_argument("--requests", type=int)
    p.add_argument("--prompt-len", type=int)
    p.add_argument("--output-len", type=int)
    p.add_argument("--adapters", type=int, nargs="+", help="distinct adapter counts")
    p.add_argument("--max-loras", type=int, default=8, help="slots for the equal table")
    p.add_argument(
        "--sweep",
        type=int,
        nargs="*",
        help="other max_loras for every mode at the top adapter count",
    )
    p.add_argument("--rank", type=int, default=16, help="LoRA rank (q,k,v,o)")
    p.add_argument(
        "--reft-rank",
        type=int,
        default=REFT_RANK,
        help=f"DiReFT/LoReFT rank (every layer, {REFT_POSITIONS})",
    )
    p.add_argument(
        "--reft-positions",
        default=REFT_POSITIONS,
        type=_reft_positions,
        help="DiReFT/LoReFT prompt positions: f<n>+l<n>, f<n>, l<n> or prefill "
        "(every prompt token, what `preft train` uses by default); default "
        f"{REFT_POSITIONS}",
    )
    p.add_argument(
        "--modes",
        nargs="+",
        choices=ADAPTER_MODES,
        default=list(ADAPTER_MODES),
        help="adapter modes to run (base always runs)",
    )
    p.add_argument("--rounds", type=int, help="interleaved timed rounds per group")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="compute threads per engine (1: a core of its own on a shared box)",
    )
    p.add_argument(
        "--basis",
        choices=("cpu", "wall"),
        default="cpu",
        help="ratios from engine CPU time (default) or elapsed time",
    )
    p.add_argument(
        "--warmup-requests",
        type=int,
        help="full-length requests each engine runs, untimed, before round 1",
    )
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument(
        "--batch-tokens",
        type=int,
        help="max_num_batched_tokens of every engine (default: max_loras x "
        "prompt_len, the prefill the adapter modes can fill in one step)",
    )
    p.add_argument(
        "--mem-gib",
        type=float,
        default=14.0,
        help="memory the engines alive at once may use (groups are split to fit)",
    )
    p.add_argument(
        "--out",
        type=Path,
        help="results JSON (a PNG is written beside it); default "
        "RESULT_DIR/engine_bench[_quick][_MODEL].json",
    )
    p.add_argument(
        "--var",
        type=Path,
        default=VAR,
        help="generated models, adapters and engine logs (default var/bench)",
    )
    add_result_dir(p)
    p.add_argument("--check", type=Path, help="print the sanity check of a results JSON")
    p.add_argument("--host", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.host:
        host_main(args.host)
        return 0
    if args.check:
        problems = engine_report.sanity(json.loads(args.check.read_text()))
        print("\n".join(problems) or "sane")
        return 1 if problems else 0

    quick = args.quick
    w = workload(args)
    counts, sweep, rounds = w["counts"], w["sweep"], w["rounds"]
    model, name = resolve_model(args.preset or args.model, args.var)
    if args.out is None:
        suffix = ("_quick" if quick else "") + ("" if name == "bench-llama" else f"_{name}")
        args.out = result_path(args.result_dir, f"engine_bench{suffix}.json")

    shape = Shape.of(model)
    common = setup(args, w, model, name, shape)
    budget = int(args.mem_gib * (1 << 30))
    groups = [
        sub
        for g in plan(counts, args.max_loras, sweep, tuple(args.modes))
        for sub in pack(g, shape, common, budget)
    ]
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    t0 = time.perf_counter()
    raw, engines = measure(groups, common, rounds, args.var / "logs" / name)
    rows = engine_report.aggregate(raw, engines, args.basis)
    meta = {
        "model": str(model),
        "model_name": name,
        "rank": args.rank,
        "reft_rank": args.reft_rank,
        "reft_positions": args.reft_positions,
        "quick": quick,
        "rounds": rounds,
        "basis": args.basis,
        "max_loras": args.max_loras,
        "sweep": sweep,
        "adapter_counts": counts,
        "groups": [[dataclasses.asdict(r) for r in g] for g in groups],
        "workload": {k: v for k, v in common.items() if k not in ("model", "adapter_root")},
        "warmup_excluded": True,
        "interleaved": True,
        "machine": f"{os.cpu_count()} CPUs",
        "started": started,
        "wall_s": round(time.perf_counter() - t0, 1),
        "load_avg_at_end": os.getloadavg(),
    }
    result = {"meta": meta, "runs": rows, "rounds": raw, "engines": engines}
    print("\n" + engine_report.report(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    engine_report.plot(rows, args.out.with_suffix(".png"), args.max_loras, name)
    print(f"\nwrote {args.out} and {args.out.with_suffix('.png')} ({meta['wall_s']:.0f} s)")
    problems = engine_report.sanity(result)
    print(
        "sanity: "
        + (
            "; ".join(problems)
            if problems
            else f"ok (base is the upper bound within {engine_report.SANITY_MARGIN:.0%})"
        )
    )
    return 1 if (quick and problems) else 0


if __name__ == "__main__":
    sys.exit(main())
