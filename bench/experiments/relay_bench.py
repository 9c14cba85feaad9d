"""Gateway SSE relay, per event: the byte-level rewrite against a parse and re-dump of every
event, on chunks shaped like vLLM 0.32's, in one process.

    python -m bench.experiments.relay_bench [--streams 2000] [--tokens 32] [--reps 7]

Each rep relays ``--streams`` streams of ``--tokens`` text chunks through a fresh
:class:`~preft_serve.gateway.proxy.EventRewriter`, once per way, in alternating order; the
table shows the median over reps and writes ``var/results/relay_bench.json`` (``--result-dir``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from bench.results import add_result_dir, result_path
from preft_serve.gateway.proxy import EventRewriter

WORKER_MODEL = "sha256:" + "ab" * 32


def vllm_chunk(i: int) -> bytes:
    chunk = {
        "id": "chatcmpl-8a1f9c2e4b7d4e0f9a1b2c3d4e5f6a7b",
        "object": "chat.completion.chunk",
        "created": 1764620000,
        "model": WORKER_MODEL,
        "choices": [
            {"index": 0, "delta": {"content": f" tok{i}"}, "logprobs": None, "finish_reason": None}
        ],
    }
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode()


def relay_us_per_event(events: list[bytes], streams: int, parse_every_event: bool) -> float:
    start = time.perf_counter()
    for _ in range(streams):
        rewriter = EventRewriter(WORKER_MODEL, "my-bot", True, lambda usage: None)
        for event in events:
            if parse_every_event:
                rewriter._parsed(event)  # json.loads + json.dumps per event
            else:
                rewriter.rewrite(event)
    return (time.perf_counter() - start) / (streams * len(events)) * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=2000)
    p.add_argument("--tokens", type=int, default=32, help="text chunks per stream")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--out", type=Path, help="results JSON (default RESULT_DIR/relay_bench.json)")
    add_result_dir(p)
    args = p.parse_args(argv)
    args.out = args.out or result_path(args.result_dir, "relay_bench.json")
    events = [vllm_chunk(i) for i in range(args.tokens)]
    runs: dict[str, list[float]] = {"parse": [], "bytes": []}
    for rep in range(args.reps):
        order = ("parse", "bytes") if rep % 2 == 0 else ("bytes", "parse")
        for way in order:
            runs[way].append(relay_us_per_event(events, args.streams, way == "parse"))
    parse, fast = statistics.median(runs["parse"]), statistics.median(runs["bytes"])
    print("| relay | us per event | us per stream | x |\n|---|---:|---:|---:|")
    print(f"| parse + dump every event | {parse:.2f} | {parse * args.tokens:.0f} | 1.0 |")
    print(f"| bytes (EventRewriter) | {fast:.2f} | {fast * args.tokens:.0f} | {parse / fast:.1f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "streams": args.streams,
                "tokens": args.tokens,
                "reps": args.reps,
                "us_per_event": {"parse": parse, "bytes": fast},
                "speedup": parse / fast,
                "runs": runs,
                "date": time.strftime("%Y-%m-%d %H:%M"),
            },
            indent=1,
        )
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
