"""The trainer process: fetch the job's files, run ``preft train``'s trainer, store the
adapter, and report progress as JSON lines on stdout (one object per line with a
``preft_event`` key) that the runner turns into the job's events.

Run by the local runner as a subprocess and by the Kubernetes backend as the Job's
container (``docker/trainer.Dockerfile``): ``python -m preft_serve.registry.finetune.entry``.
Exit status 0 means the outputs are in the object store under ``finetune/<job id>/``.
"""

from __future__ import annotations

import errno
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from preft_serve.common.finetune_wire import MAX_SEQ_LEN
from preft_serve.common.objectstore import ObjectStoreSettings, StoreFull
from preft_serve.registry.finetune.budget import nothing_fits
from preft_serve.registry.finetune.spec import OUTPUT_FILES, TrainerSpec, train_config
from preft_serve.training.data import DataError, NothingFits

_PATHS = re.compile(r"(?<=loading )\S+ |(?<=saved )\S+ ")
_STEP = re.compile(r"^step (\d+)/(\d+)\s+loss (\S+)\s+lr (\S+)\s+(\d+) tok/s$")


class JobDataError(Exception):
    """The job's data cannot train; the message is already in the tenant's terms."""


def data_message(exc: DataError, names: dict[Path, str]) -> str:
    """A data error of ``preft train`` in the API's terms: the job's files by role instead
    of the trainer's scratch paths, ``method.preft.max_seq_len`` instead of its flag."""
    if isinstance(exc, NothingFits):
        return nothing_fits(
            names.get(exc.path, "a file of the job"), exc.max_seq_len, exc.needed, MAX_SEQ_LEN
        )
    text = str(exc)
    for path, name in names.items():
        text = text.replace(str(path), name)
    return text.replace("--max-seq-len", "method.preft.max_seq_len")


class TrainerSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="PREFT_TRAINER_", env_nested_delimiter="__", extra="ignore"
    )

    spec: str = Field(description="The TrainerSpec as JSON")
    object_store: ObjectStoreSettings = ObjectStoreSettings(local_create_root=False)


def emit(kind: str, message: str, data: dict[str, Any] | None = None, level: str = "info") -> None:
    line: dict[str, Any] = {"preft_event": kind, "message": message, "level": level}
    if data is not None:
        line["data"] = data
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def say(line: str) -> None:
    """The trainer's progress lines: ``step N/T loss .. lr .. tok/s`` become metrics."""
    match = _STEP.match(line.strip())
    if match is None:
        # The trainer names its scratch paths; a tenant sees what happened, not where.
        emit("message", _PATHS.sub("", line).strip())
        return
    step, total, loss, lr, tok_s = match.groups()
    emit(
        "metrics",
        f"Step {step}/{total}: training loss={float(loss):.4f}",
        {
            "step": int(step),
            "total_steps": int(total),
            "train_loss": float(loss),
            "learning_rate": float(lr),
            "tokens_per_second": int(tok_s),
        },
    )


def run(settings: TrainerSettings) -> int:
    spec = TrainerSpec.model_validate_json(settings.spec)
    store = settings.object_store.create()
    with tempfile.TemporaryDirectory(prefix="preft-trainer-") as tmp:
        root = Path(tmp)
        data = root / "train.jsonl"
        store.download_file(spec.training_key, data)
        validation = None
        if spec.validation_key:
            validation = root / "validation.jsonl"
            store.download_file(spec.validation_key, validation)
        out = root / "adapter"
        config = train_config(spec, data, validation, out)
        from preft_serve.training.trainer import train  # torch + transformers

        try:
            result = train(config, say)
        except DataError as exc:
            names = {data: "the training file", validation: "the validation file"}
            raise JobDataError(
                data_message(exc, {k: v for k, v in names.items() if k is not None})
            ) from None
        for name in OUTPUT_FILES:
            store.put_file(spec.output_prefix + name, out / name)
        emit(
            "result",
            "Training finished",
            {
                "steps": result.steps,
                "train_loss": result.train_loss,
                "eval_loss": result.eval_loss,
                "trained_tokens": int(result.metrics.get("tokens_seen", 0)),
            },
        )
    return 0


def main() -> int:
    try:
        return run(TrainerSettings())
    except Exception as exc:  # noqa: BLE001  (reported as the job's error, then exit 1)
        emit("error", tenant_message(exc)[:2000], level="error")
        return 1


def tenant_message(exc: Exception) -> str:
    """The job's error as its tenant reads it: what happened, without paths or errno
    text from this machine."""
    if isinstance(exc, StoreFull) or (
        isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
    ):
        return "the trainer ran out of disk space (its scratch disk or the object store)"
    if isinstance(exc, OSError):
        return f"the trainer could not read or write its files ({type(exc).__name__})"
    if isinstance(exc, JobDataError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


if __name__ == "__main__":
    sys.exit(main())
