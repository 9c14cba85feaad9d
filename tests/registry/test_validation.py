"""Every bad upload is refused with a status, a message that says what to fix, and no trace
in Redis or the bucket."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from preft_serve.adapters.format import CONFIG_FILE, WEIGHTS_FILE
from preft_serve.registry.settings import RegistrySettings
from preft_serve.worker import serve
from tests.registry import factories
from tests.support.registry_api import create_tenant, error_message, upload

A0 = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
B0 = "base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight"


def _scale_first(tensors: dict[str, np.ndarray], value: float) -> dict[str, np.ndarray]:
    arr = tensors[A0].copy()
    arr[0, 0] = value
    return {**tensors, A0: arr}


def _scale_all(tensors: dict[str, np.ndarray], factor: float) -> dict[str, np.ndarray]:
    return {k: v * np.float32(factor) for k, v in tensors.items()}


def _raw_config(**raw: str) -> Callable[[Path], None]:
    """Set config keys to raw JSON text (numbers json.dumps cannot write, deep nesting)."""

    def edit(d: Path) -> None:
        config = json.loads((d / CONFIG_FILE).read_text())
        config.update({k: f"@@{k}@@" for k in raw})
        text = json.dumps(config)
        for key, value in raw.items():
            text = text.replace(f'"@@{key}@@"', value)
        (d / CONFIG_FILE).write_text(text)

    return edit


def _bad(mutate: Callable[[Path], Any]) -> Callable[[Path, Path], Path]:
    def build(src: Path, work: Path) -> Path:
        out = factories.copy_adapter(src, work / "bad")
        mutate(out)
        return out

    return build


def _safetensors_header(header: dict[str, Any]) -> bytes:
    """A safetensors file of just this header (no tensor data)."""
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw


def _write(name: str, data: bytes) -> Callable[[Path], None]:
    return lambda d: (d / name).write_bytes(data)


CASES: dict[str, tuple[Callable[[Path, Path], Path], int, str]] = {
    "config not json": (
        _bad(_write(CONFIG_FILE, b"{not json")),
        422,
        "adapter_config.json is not valid JSON",
    ),
    "config with NaN": (
        _bad(_write(CONFIG_FILE, b'{"peft_type": "LORA", "r": NaN}')),
        422,
        "adapter_config.json is not valid JSON: NaN is not allowed in JSON",
    ),
    "config not object": (
        _bad(_write(CONFIG_FILE, b"[1, 2]")),
        422,
        "adapter_config.json must hold a JSON object",
    ),
    "unknown peft_type": (
        _bad(lambda d: factories.edit_config(d, peft_type="IA3")),
        422,
        "peft_type must be 'LORA' or 'REFT'",
    ),
    "rank over max": (
        _bad(lambda d: factories.edit_config(d, r=32)),
        422,
        (
            "LoRA rank r=32 exceeds the largest rank this deployment's workers serve "
            "(16); retrain with r <= 16"
        ),
    ),
    "rank not int": (
        _bad(lambda d: factories.edit_config(d, r="8")),
        422,
        "LoRA config 'r' must be a positive integer",
    ),
    "unsupported module": (
        _bad(lambda d: factories.edit_config(d, target_modules=["q_proj", "embed_tokens"])),
        422,
        (
            "target_modules ['q_proj', 'embed_tokens'] matches model.embed_tokens, which is "
            "the input embedding (LoRA on embeddings is not served)"
        ),
    ),
    "target matches nothing": (
        _bad(lambda d: factories.edit_config(d, target_modules=["foo"])),
        422,
        (
            "target_modules ['foo'] matches no module of the base model (LlamaForCausalLM, e.g. "
            "model.layers.0.self_attn.q_proj); use names like q_proj, self_attn.q_proj, a regex, "
            "or 'all-linear'"
        ),
    ),
    "packed qkv_proj": (
        _bad(lambda d: factories.edit_config(d, target_modules=["qkv_proj", "o_proj"])),
        422,
        (
            "target_modules entry 'qkv_proj' is vLLM's fused name for q_proj, k_proj, v_proj; "
            "LlamaForCausalLM has separate modules, and PEFT adapters for it name them: list "
            "q_proj, k_proj, v_proj instead"
        ),
    ),
    "target is a norm layer": (
        _bad(lambda d: factories.edit_config(d, target_modules=r".*layernorm")),
        422,
        "matches model.layers.0.input_layernorm (and 3 more), which is a norm layer",
    ),
    "regex too long": (
        _bad(lambda d: factories.edit_config(d, target_modules="(q|k)_proj" + "?" * 300)),
        422,
        "target_modules regex is 310 characters; the limit is 256 - list module names instead",
    ),
    "regex invalid": (
        _bad(lambda d: factories.edit_config(d, target_modules=".*(q_proj")),
        422,
        "target_modules '.*(q_proj' is not a valid regular expression",
    ),
    "target_modules a number": (
        _bad(lambda d: factories.edit_config(d, target_modules=7)),
        422,
        (
            "LoRA config 'target_modules' must be a list of at most 16384 module names or one "
            "string (a regex, or 'all-linear'); got 7"
        ),
    ),
    "layers_pattern of another model": (
        _bad(lambda d: factories.edit_config(d, layers_to_transform=[0], layers_pattern="h")),
        422,
        "layers_pattern 'h' does not name this base model's layer list; use 'layers'",
    ),
    "dora": (
        _bad(lambda d: factories.edit_config(d, use_dora=True)),
        422,
        "DoRA adapters (use_dora=true) are not supported",
    ),
    "lora_bias": (
        _bad(lambda d: factories.edit_config(d, lora_bias=True)),
        422,
        (
            "adapter_config.json sets lora_bias=true: lora_bias=true (a trained bias on "
            "lora_B) is not supported; train with lora_bias=false"
        ),
    ),
    "pissa init": (
        _bad(lambda d: factories.edit_config(d, init_lora_weights="pissa_niter_4")),
        422,
        (
            "init_lora_weights='pissa_niter_4' changes the base model's weights "
            "when PEFT loads the adapter"
        ),
    ),
    "trainable tokens": (
        _bad(lambda d: factories.edit_config(d, trainable_token_indices=[1, 2])),
        422,
        (
            "adapter_config.json sets trainable_token_indices=[1, 2]: trainable_token_indices "
            "(trained embedding rows) is not supported"
        ),
    ),
    "layer out of range": (
        _bad(lambda d: factories.edit_config(d, layers_to_transform=[0, 5])),
        422,
        "layers_to_transform must list layer indices in 0..1",
    ),
    "rank mismatch with tensors": (
        _bad(lambda d: factories.edit_config(d, r=4)),
        422,
        "has shape [8, 64]; base model tiny-llama",
    ),
    "missing tensor": (
        _bad(
            lambda d: factories.edit_tensors(d, lambda t: {k: v for k, v in t.items() if k != B0})
        ),
        422,
        f"missing tensor {B0} (shape [32, 8])",
    ),
    "unexpected tensor": (
        _bad(
            lambda d: factories.edit_tensors(
                d,
                lambda t: {
                    **t,
                    "base_model.model.lm_head.lora_A.weight": np.zeros((8, 64), np.float32),
                },
            )
        ),
        422,
        "unexpected tensor base_model.model.lm_head.lora_A.weight",
    ),
    "wrong shape": (
        _bad(
            lambda d: factories.edit_tensors(d, lambda t: {**t, B0: np.zeros((64, 8), np.float32)})
        ),
        422,
        (
            f"tensor {B0} has shape [64, 8]; base model tiny-llama (layers=2, "
            "hidden_size=64, heads=4, kv_heads=2"
        ),
    ),
    "dtype f64": (
        _bad(lambda d: factories.edit_tensors(d, lambda t: {**t, A0: t[A0].astype(np.float64)})),
        422,
        f"tensor {A0} has dtype F64; use one of F32, F16, BF16",
    ),
    "dtype int": (
        _bad(lambda d: factories.edit_tensors(d, lambda t: {**t, A0: t[A0].astype(np.int32)})),
        422,
        f"tensor {A0} has dtype I32",
    ),
    "nan": (
        _bad(lambda d: factories.edit_tensors(d, lambda t: _scale_first(t, np.nan))),
        422,
        f"tensor {A0} contains NaN or Inf values",
    ),
    "inf": (
        _bad(lambda d: factories.edit_tensors(d, lambda t: _scale_first(t, np.inf))),
        422,
        f"tensor {A0} contains NaN or Inf values",
    ),
    "config number overflows to inf": (
        _bad(_raw_config(lora_alpha="1e309")),
        422,
        (
            "adapter_config.json has the number 1e309, which is not finite as a 64-bit float; "
            "every number must be finite"
        ),
    ),
    "config number deep inside overflows": (
        _bad(_raw_config(extra='[1, {"x": -2.5e400}]')),
        422,
        "adapter_config.json has the number -2.5e400, which is not finite",
    ),
    "config nested too deeply": (
        _bad(_raw_config(extra="[" * 100_000 + "]" * 100_000)),
        422,
        "adapter_config.json nests arrays/objects 100001 levels deep; the limit is 32",
    ),
    "config nesting bomb, not even closed": (
        _bad(_write(CONFIG_FILE, b"[" * 100_000)),
        422,
        "adapter_config.json nests arrays/objects 100000 levels deep; the limit is 32",
    ),
    "lora_alpha absurd": (
        _bad(lambda d: factories.edit_config(d, lora_alpha=1e30)),
        422,
        (
            "LoRA scale lora_alpha / r = 1.25e+29 (lora_alpha=1e+30, r=8) is over the limit of "
            "256; use lora_alpha <= 2048"
        ),
    ),
    "rslora alpha absurd": (
        _bad(lambda d: factories.edit_config(d, lora_alpha=2048, use_rslora=True)),
        422,
        (
            "LoRA scale lora_alpha / sqrt(r) = 724 (lora_alpha=2048, r=8) is over the limit of "
            "256; use lora_alpha <= 724"
        ),
    ),
    "weight absurd": (
        _bad(lambda d: factories.edit_tensors(d, lambda t: _scale_first(t, 3e38))),
        422,
        f"tensor {A0} has values up to 3e+38 in magnitude; the limit is 1e+04 - ",
    ),
    "lora update absurd": (
        _bad(lambda d: factories.edit_tensors(d, lambda t: _scale_all(t, 100))),
        422,
        (
            "LoRA base_model.model.model.layers.0.self_attn.k_proj can change a base weight by "
            "up to "
        ),
    ),
    "truncated safetensors": (
        _bad(lambda d: (d / WEIGHTS_FILE).write_bytes((d / WEIGHTS_FILE).read_bytes()[:-100])),
        422,
        "adapter_model.safetensors is not a valid safetensors file",
    ),
    # The library quotes an unknown dtype in full: the message is clipped (it echoed a
    # 5,000-character dtype back).
    "unknown dtype, echoed clipped": (
        _bad(
            _write(
                WEIGHTS_FILE,
                _safetensors_header(
                    {"t": {"dtype": "X" * 5000, "shape": [0], "data_offsets": [0, 0]}}
                ),
            )
        ),
        422,
        "adapter_model.safetensors is not a valid safetensors file: ",
    ),
    # Refused from its 8-byte length, before the library or json.loads reads the header.
    "header over the cap": (
        _bad(_write(WEIGHTS_FILE, (5 << 20).to_bytes(8, "little") + b"{" + b" " * 64)),
        422,
        (
            "adapter_model.safetensors has a 5242880-byte header; the limit is 4194304 (an "
            "adapter's tensor table is a few hundred KB at most)"
        ),
    ),
    "not safetensors": (
        _bad(_write(WEIGHTS_FILE, b"hello world, not tensors")),
        422,
        "adapter_model.safetensors is not a safetensors file",
    ),
    "pickle named safetensors": (
        _bad(_write(WEIGHTS_FILE, pickle.dumps({"a": [1.0]}, protocol=4))),
        422,
        (
            "adapter_model.safetensors holds a pickled PyTorch checkpoint, which the registry "
            "never loads; convert it to safetensors"
        ),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_adapter_rejected_and_nothing_stored(
    case, client, acme, lora_dir, tmp_path, state_snapshot
):
    build, status, message = CASES[case]
    bad_dir = build(lora_dir, tmp_path)
    before = state_snapshot()
    resp = upload(client, acme, "bot", bad_dir)
    assert resp.status_code == status, resp.text
    assert message in error_message(resp)
    assert len(error_message(resp)) < 1000  # tenant input is never echoed unbounded
    assert state_snapshot() == before


@pytest.mark.parametrize("rank", [8, 16, 32, 64])
@pytest.mark.parametrize("alpha_per_rank", [1, 2])
def test_random_toymodel_loras_pass_magnitude_bounds(
    rank, alpha_per_rank, make_client, base_model_dir, tmp_path
):
    """The generator the engine tests use (std 0.3, A and B random) stays well inside."""
    from preft_serve.toymodels import LoraSpec, make_lora_adapter

    client = make_client(max_lora_rank=64)
    headers = create_tenant(client, "acme")
    adapter = make_lora_adapter(
        base_model_dir, tmp_path / "lora", rank, LoraSpec(rank=rank, alpha=alpha_per_rank * rank)
    )
    resp = upload(client, headers, "bot", adapter)
    assert resp.status_code == 201, resp.text


def test_lora_rank_the_workers_cannot_serve_is_refused(
    make_client, base_model_dir, tmp_path, state_snapshot
):
    """A registry accepting r <= 64 beside workers started with --max-lora-rank 16 would
    answer such an upload 201 and then 400 on every request. With both defaults as shipped,
    a well-formed adapter above the workers' rank is refused."""
    served = serve.parser().parse_args(["--model", "m"]).max_lora_rank
    client = make_client(max_lora_rank=RegistrySettings.model_fields["max_lora_rank"].default)
    headers = create_tenant(client, "acme")
    too_big = factories.lora(base_model_dir, tmp_path / "big", seed=3, rank=2 * served)
    before = state_snapshot()
    resp = upload(client, headers, "bot", too_big)
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"]["code"] == "invalid_adapter"
    assert error_message(resp) == (
        f"LoRA rank r={2 * served} exceeds the largest rank this deployment's workers serve "
        f"({served}); retrain with r <= {served}, or have the operator raise MAX_LORA_RANK on "
        "workers and registry together (Helm: worker.maxLoraRank)"
    )
    assert state_snapshot() == before
    at_limit = factories.lora(base_model_dir, tmp_path / "ok", seed=3, rank=served)
    assert upload(client, headers, "bot", at_limit).status_code == 201


def test_all_problems_listed_in_details(client, acme, lora_dir, tmp_path, state_snapshot):
    bad = factories.copy_adapter(lora_dir, tmp_path / "bad")
    factories.edit_tensors(bad, lambda t: {k: v.astype(np.float64) for k, v in t.items()})
    before = state_snapshot()
    resp = upload(client, acme, "bot", bad)
    assert resp.status_code == 422
    body = resp.json()["error"]
    assert body["code"] == "invalid_adapter"
    # 2 layers x 4 modules x (A, B): every tensor is reported, the first in the message.
    assert "(and 15 more; see details)" in body["message"]
    assert len(body["details"]) == 16
    assert all("has dtype F64" in d["message"] for d in body["details"])
    assert state_snapshot() == before


def _files(*parts: tuple[str, bytes]) -> list[tuple[str, tuple[str, bytes, str]]]:
    return [("files", (name, data, "application/octet-stream")) for name, data in parts]


def _post(client, headers, files, name="bot", mode="prefill"):
    data = {k: v for k, v in (("name", name), ("mode", mode)) if v is not None}
    return client.post("/v1/adapters", data=data, files=files, headers=headers)


def test_pickle_bin_rejected_with_conversion_hint(client, acme, lora_dir, state_snapshot):
    before = state_snapshot()
    config = (lora_dir / CONFIG_FILE).read_bytes()
    resp = _post(
        client, acme, _files((CONFIG_FILE, config), ("adapter_model.bin", pickle.dumps({"w": 1})))
    )
    assert resp.status_code == 415
    message = error_message(resp)
    assert (
        "adapter_model.bin is a pickle-based PyTorch file, which the registry never loads"
        in message
    )
    assert "safe_serialization=True" in message
    assert "preft adapter convert" in message
    assert state_snapshot() == before


@pytest.mark.parametrize("filename", ["adapter_model.pt", "model.pth", "weights.ckpt"])
def test_other_pickle_suffixes_rejected(filename, client, acme, lora_dir, state_snapshot):
    before = state_snapshot()
    resp = _post(
        client,
        acme,
        _files((CONFIG_FILE, (lora_dir / CONFIG_FILE).read_bytes()), (filename, b"\x80\x04junk")),
    )
    assert resp.status_code == 415
    assert f"{filename} is a pickle-based PyTorch file" in error_message(resp)
    assert state_snapshot() == before


def test_missing_weights_file(client, acme, lora_dir, state_snapshot):
    before = state_snapshot()
    resp = _post(client, acme, _files((CONFIG_FILE, (lora_dir / CONFIG_FILE).read_bytes())))
    assert resp.status_code == 400
    assert "the upload lacks adapter_model.safetensors" in error_message(resp)
    assert state_snapshot() == before


def test_unexpected_extra_file(client, acme, lora_dir, state_snapshot):
    before = state_snapshot()
    parts = [(p.name, p.read_bytes()) for p in sorted(lora_dir.iterdir())]
    resp = _post(client, acme, _files(*parts, ("notes.txt", b"hi")))
    assert resp.status_code == 400
    assert "unexpected file 'notes.txt'" in error_message(resp)
    assert state_snapshot() == before


def test_duplicate_file(client, acme, lora_dir, state_snapshot):
    before = state_snapshot()
    config = (lora_dir / CONFIG_FILE).read_bytes()
    resp = _post(client, acme, _files((CONFIG_FILE, config), (CONFIG_FILE, config)))
    assert resp.status_code == 400
    assert "adapter_config.json was sent more than once" in error_message(resp)
    assert state_snapshot() == before


@pytest.mark.parametrize("name", ["", "-lead", "has space", "a" * 65, "x/y", "a..b", "näme"])
def test_bad_adapter_name(name, client, acme, lora_dir, state_snapshot):
    before = state_snapshot()
    resp = upload(client, acme, name, lora_dir)
    if name == "":
        assert resp.status_code == 422  # the form field itself is missing
        assert "name: field required" in error_message(resp)
    else:
        assert resp.status_code == 400, resp.text
        assert f"adapter name {name!r} is invalid: use 1-64 letters" in error_message(resp)
    assert state_snapshot() == before


def test_bad_mode(client, acme, lora_dir, state_snapshot):
    before = state_snapshot()
    resp = upload(client, acme, "bot", lora_dir, mode="decode")
    assert resp.status_code == 422
    assert "mode: Input should be 'prefill' or 'all'" in error_message(resp)
    assert state_snapshot() == before


def test_missing_files_field(client, acme, state_snapshot):
    before = state_snapshot()
    resp = client.post("/v1/adapters", data={"name": "bot", "mode": "prefill"}, headers=acme)
    assert resp.status_code == 422
    assert "files: field required" in error_message(resp)
    assert state_snapshot() == before


def test_weights_over_size_limit(make_client, lora_dir, state_snapshot):
    client = make_client(max_weights_bytes=10_000)
    headers = create_tenant(client, "acme")
    before = state_snapshot()
    resp = upload(client, headers, "bot", lora_dir)
    assert resp.status_code == 413
    assert "adapter_model.safetensors is larger than the 10000-byte limit" in error_message(resp)
    assert state_snapshot() == before


def test_request_body_over_limit_by_content_length(make_client, lora_dir, state_snapshot):
    client = make_client(max_upload_bytes=20_000)
    headers = create_tenant(client, "acme")
    before = state_snapshot()
    resp = upload(client, headers, "bot", lora_dir)
    assert resp.status_code == 413
    assert "request body exceeds this registry's 20000-byte limit" in error_message(resp)
    assert state_snapshot() == before


def test_unauthenticated_upload(client, lora_dir, state_snapshot):
    before = state_snapshot()
    resp = upload(client, {}, "bot", lora_dir)
    assert resp.status_code == 401
    assert "missing credentials: send 'Authorization: Bearer <API key>'" in error_message(resp)
    assert resp.headers["www-authenticate"] == "Bearer"
    resp = upload(client, {"Authorization": "Bearer pft_nope.nope"}, "bot", lora_dir)
    assert resp.status_code == 401
    assert "invalid or revoked API key" in error_message(resp)
    assert state_snapshot() == before


def test_config_json_size_limit(make_client, lora_dir, tmp_path, state_snapshot):
    client = make_client(max_config_bytes=2048)
    headers = create_tenant(client, "acme")
    bad = factories.copy_adapter(lora_dir, tmp_path / "big")
    factories.edit_config(bad, padding="x" * 5000)
    before = state_snapshot()
    resp = upload(client, headers, "bot", bad)
    assert resp.status_code == 413
    assert "adapter_config.json is larger than the 2048-byte limit" in error_message(resp)
    assert state_snapshot() == before


def _reft_bad(mutate: Callable[[Path], Any], **kwargs: Any) -> Callable[[Path, Path], Path]:
    def build(base_model_dir: Path, work: Path) -> Path:
        out = factories.reft(base_model_dir, work / "reft", **kwargs)
        mutate(out)
        return out

    return build


def _skew_r(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    r = tensors["layers.0.shared.r"].copy()
    r[0] *= 2.0
    return {**tensors, "layers.0.shared.r": r}


REFT_CASES: dict[str, tuple[Callable[[Path, Path], Path], str]] = {
    "unknown reft_type": (
        _reft_bad(lambda d: factories.edit_config(d, reft_type="noreft")),
        "reft_type must be 'direft' or 'loreft' (got 'noreft')",
    ),
    "rank over max": (
        _reft_bad(lambda d: factories.edit_config(d, rank=17)),
        "ReFT rank 17 exceeds this registry's maximum of 16",
    ),
    "layer out of range": (
        _reft_bad(lambda d: factories.edit_config(d, layers=[0, 2])),
        (
            "ReFT config 'layers' must be a non-empty list of distinct layer "
            "indices in 0..1 (the base model has 2 layers; got [0, 2])"
        ),
    ),
    "duplicate layers": (
        _reft_bad(lambda d: factories.edit_config(d, layers=[1, 1])),
        "must be a non-empty list of distinct layer indices",
    ),
    "bad positions": (
        _reft_bad(lambda d: factories.edit_config(d, positions="middle")),
        (
            "ReFT config 'positions' must be 'f{n}+l{n}', 'f{n}', 'l{n}' or "
            "'prefill' with n of at most 6 digits (got 'middle')"
        ),
    ),
    "positions with 5,000 digits": (
        _reft_bad(lambda d: factories.edit_config(d, positions="f" + "1" * 5000)),
        "with n of at most 6 digits (got 'f11111111111",
    ),
    "zero positions": (
        _reft_bad(lambda d: factories.edit_config(d, positions="f0+l1")),
        "ReFT position counts must be between 1 and 1024",
    ),
    "parts disagree with share_weights": (
        _reft_bad(lambda d: factories.edit_config(d, share_weights=False)),
        "unexpected tensor layers.0.shared.b",
    ),
    "non-orthonormal loreft r": (
        _reft_bad(lambda d: factories.edit_tensors(d, _skew_r), reft_type="loreft"),
        "LoReFT tensor layers.0.shared.r must have orthonormal rows",
    ),
    "direft weight absurd": (
        _reft_bad(
            lambda d: factories.edit_tensors(
                d, lambda t: {**t, "layers.1.shared.w1": t["layers.1.shared.w1"] * 1e30}
            ),
            reft_type="direft",
        ),
        "tensor layers.1.shared.w1 has values up to ",
    ),
    "direft wrong hidden size": (
        _reft_bad(
            lambda d: factories.edit_tensors(
                d, lambda t: {**t, "layers.1.shared.w2": np.zeros((4, 32), np.float32)}
            ),
            reft_type="direft",
        ),
        (
            "tensor layers.1.shared.w2 has shape [4, 32]; base model tiny-llama (layers=2, "
            "hidden_size=64"
        ),
    ),
}


@pytest.mark.parametrize("case", list(REFT_CASES))
def test_bad_reft_rejected_and_nothing_stored(
    case, client, acme, base_model_dir, tmp_path, state_snapshot
):
    build, message = REFT_CASES[case]
    bad_dir = build(base_model_dir, tmp_path)
    before = state_snapshot()
    resp = upload(client, acme, "reft", bad_dir)
    assert resp.status_code == 422, resp.text
    assert message in error_message(resp)
    assert state_snapshot() == before
