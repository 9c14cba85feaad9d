"""``make worker``: generate a demo model and adapters, then serve them (Ctrl-C stops).

The demo model is a deterministic random-init Llama (no model hub needed), so its text is
gibberish; what the demo shows is that each adapter, and each mode, changes the output.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from preft_serve.adapters.format import AdapterMode, AdapterType
from preft_serve.toymodels import (
    LoraSpec,
    ReftSpec,
    make_lora_adapter,
    make_model,
    make_reft_adapter,
)
from preft_serve.worker import serve

DEMO_ADAPTERS = {
    "alice-prefill": (1, AdapterMode.PREFILL),
    "bob-prefill": (2, AdapterMode.PREFILL),
    "carol-all": (3, AdapterMode.ALL),
}
DEMO_REFT_ADAPTERS = {
    "dave-direft": (4, ReftSpec(AdapterType.DIREFT, rank=4, positions="f3+l3")),
    "erin-loreft": (5, ReftSpec(AdapterType.LOREFT, rank=4, positions="prefill")),
}


def prepare(root: Path, preset: str = "tiny-llama") -> tuple[Path, Path]:
    """Create (or reuse) the demo model and adapters under ``root``."""
    model = make_model(preset, root / "model")
    adapters = root / "adapters"
    for name, (seed, mode) in DEMO_ADAPTERS.items():
        make_lora_adapter(model, adapters / name, seed=seed, spec=LoraSpec(rank=8, mode=mode))
    for name, (seed, spec) in DEMO_REFT_ADAPTERS.items():
        make_reft_adapter(model, adapters / name, seed=seed, spec=spec)
    return model, adapters


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dir", type=Path, default=Path("var/demo"), help="where to generate")
    p.add_argument("--port", type=int, default=8001)
    args, passthrough = p.parse_known_args()
    model, adapters = prepare(args.dir)
    base = f"http://127.0.0.1:{args.port}"
    print(
        f"""
preft-serve demo worker on {base} (model {model}, adapters in {adapters}).
Once it logs "Application startup complete", try in another shell:

  curl -s {base}/v1/models | python3 -m json.tool
  curl -s {base}/v1/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "alice-prefill", "prompt": "Hello", "max_tokens": 16, "temperature": 0}}'
  curl -s {base}/v1/chat/completions -H 'Content-Type: application/json' -d \\
    '{{"model": "carol-all", "messages": [{{"role": "user", "content": "Hi"}}], "max_tokens": 16}}'
""",
        flush=True,
    )
    serve.main(
        [
            "--model",
            str(model),
            "--adapter-dir",
            str(adapters),
            "--port",
            str(args.port),
            *passthrough,
        ]
    )


if __name__ == "__main__":
    main()
