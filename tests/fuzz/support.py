"""Shared pieces of the API fuzz tests: budget, adapters, state
snapshots, the error-envelope check and the tally of cases sent.

The budget is ``PREFT_FUZZ_EXAMPLES``: random cases per API operation (hypothesis's
``max_examples``), on top of schemathesis's fixed cases (schema examples, boundaries, each
constraint broken in turn). Default 25, the suite's bounded run; ``make fuzz`` raises it.
Generation is derandomized, so the same budget and code send the same requests.
"""

from __future__ import annotations

import json
import os
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import redis
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from safetensors.numpy import save as save_safetensors

EXAMPLES = int(os.environ.get("PREFT_FUZZ_EXAMPLES", "25"))
TENANTS = ("acme", "globex")

# (api, "METHOD /path", status) -> cases; printed in the terminal summary (conftest).
TALLY: Counter[tuple[str, str, int]] = Counter()

# A tiny Llama's config.json: all the registry reads of its base model (shapes).
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
}
ATTENTION = {"q_proj": (64, 64), "k_proj": (64, 32), "v_proj": (64, 32), "o_proj": (64, 64)}


def fuzz_settings() -> settings:
    """Hypothesis settings of every fuzz test: fixed budget, reproducible, no deadline."""
    return settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
    )


def base_model(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(MODEL_CONFIG))
    return directory


def lora_files(seed: int, rank: int = 8) -> tuple[bytes, bytes]:
    """(adapter_config.json, adapter_model.safetensors) of a valid LoRA for MODEL_CONFIG."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(MODEL_CONFIG["num_hidden_layers"]):
        for module, (fan_in, fan_out) in ATTENTION.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = rng.normal(0, 0.3, (rank, fan_in)).astype(
                np.float32
            )
            tensors[f"{prefix}.lora_B.weight"] = rng.normal(0, 0.3, (fan_out, rank)).astype(
                np.float32
            )
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(ATTENTION),
        "preft_mode": "prefill",
    }
    return json.dumps(config).encode(), save_safetensors(tensors)


def upload_parts(config: bytes, weights: bytes) -> list[tuple[str, tuple[str, bytes, str]]]:
    return [
        ("files", ("adapter_config.json", config, "application/json")),
        ("files", ("adapter_model.safetensors", weights, "application/octet-stream")),
    ]


def case_hash(case: Any) -> int:
    """A stable number from a case's content, for choices that must follow the case (which
    tenant calls, which known name a parameter is steered to)."""
    return zlib.crc32(repr((case.path_parameters, case.query, case.body)).encode())


def steer(value: Any, choices: list[str]) -> str | None:
    """Replace about half of the generated values with a known one (deterministically)."""
    h = zlib.crc32(repr(value).encode())
    return choices[(h >> 1) % len(choices)] if h % 2 == 0 else None


def swap_in_key(case: Any, keys: dict[str, str]) -> None:
    """Credentials are placeholders (``Bearer @acme``) when cases are generated, since
    explicit examples are built at collection, before the tenants exist."""
    auth = (case.headers or {}).get("Authorization", "")
    if auth.startswith("Bearer @"):
        case.headers["Authorization"] = f"Bearer {keys[auth[len('Bearer @') :]]}"


# OpenAI's error types by status, written out here rather than imported from the code
# under test.
OPENAI_ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}


@schemathesis.check
def error_envelope(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every error is OpenAI's ``{"error": {"message", "type", "param", "code"}}`` (plus
    ``details`` on validation errors; docs/gateway.md, preft_serve.common.errors), whatever
    the OpenAPI document says about it, with the ``type`` OpenAI gives the status."""
    status = response.status_code
    if status < 400:
        return None
    body = json.loads(response.content)
    assert isinstance(body, dict) and set(body) == {"error"}, f"not the error envelope: {body}"
    error = body["error"]
    assert set(error) - {"details"} == {"message", "type", "param", "code"}, (
        f"not the error envelope: {body}"
    )
    assert isinstance(error["code"], str) and isinstance(error["message"], str), body
    assert error["param"] is None or isinstance(error["param"], str), body
    assert isinstance(error.get("details", []), list), body
    expected = OPENAI_ERROR_TYPES.get(
        status, "server_error" if status >= 500 else "invalid_request_error"
    )
    assert error["type"] == expected, f"HTTP {status} with type {error['type']!r}: {body}"
    return True


class RedisState:
    """Byte-exact snapshots of one namespace's keys (DUMP), and restoring one."""

    def __init__(self, url: str, namespace: str) -> None:
        self.client = redis.Redis.from_url(url)  # bytes in, bytes out
        self.pattern = f"{namespace}:*"

    def snapshot(self) -> dict[bytes, bytes]:
        keys = sorted(self.client.scan_iter(self.pattern, count=1000))
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.dump(key)
        return {k: v for k, v in zip(keys, pipe.execute(), strict=True) if v is not None}

    def restore(self, snap: dict[bytes, bytes]) -> None:
        pipe = self.client.pipeline(transaction=True)
        for key in self.client.scan_iter(self.pattern, count=1000):
            pipe.delete(key)
        for key, value in snap.items():
            pipe.restore(key, 0, value, replace=True)
        pipe.execute()


def diff(before: dict[Any, Any], after: dict[Any, Any]) -> list[str]:
    """Readable list of keys added, removed or changed between two snapshots."""
    out = [f"added {k!r}" for k in after.keys() - before.keys()]
    out += [f"removed {k!r}" for k in before.keys() - after.keys()]
    out += [f"changed {k!r}" for k in before.keys() & after.keys() if before[k] != after[k]]
    return sorted(out)
