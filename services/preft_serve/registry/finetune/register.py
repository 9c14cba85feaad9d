"""A finished trainer's output becomes a registered adapter, exactly like an upload.

The adapter files are fetched from ``finetune/<job id>/`` in the object store and handed
to the registry's own upload path (``AdapterService.upload``: staging, validation against
the base model, content-addressed blob, one Redis transaction, the ``adapter.updated``
event), as a new version of the job's adapter name (a later job with the same suffix is
the next version, staged unless the job asked to promote it). The
trainer's metrics become the result file, OpenAI's per-step CSV (``results.py``).
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from preft_serve.adapters.format import AdapterMode
from preft_serve.common.finetune_wire import Checkpoint
from preft_serve.registry.adapters import AdapterService
from preft_serve.registry.finetune.files import FileService
from preft_serve.registry.finetune.jobs import JobRecord
from preft_serve.registry.finetune.results import step_metrics_csv
from preft_serve.registry.finetune.spec import OUTPUT_FILES, output_prefix
from preft_serve.registry.ingest import UploadedFile
from preft_serve.registry.policy_schemas import VersionState


@dataclasses.dataclass(frozen=True)
class Registered:
    name: str
    version: int
    sha256: str
    trained_tokens: int
    result_file: str | None  # None: the tenant had no room for it
    checkpoint: Checkpoint
    warnings: tuple[str, ...]
    state: VersionState = VersionState.SERVING  # STAGED: stored, the name serves another
    # (before, after) for the audit log (``UploadResult.audit_change``); None: nothing new
    audit_change: tuple[str | None, str] | None = None


def register_output(
    record: JobRecord, adapters: AdapterService, files: FileService, *, promote: bool = True
) -> Registered:
    """Register a finished job's adapter as the next version of its name: served at once
    (``promote``) or staged for a serving policy to promote (the job's
    ``method.preft.promote``, false by default; a name's first version serves either way)."""
    store = adapters.store
    prefix = output_prefix(record.id)
    with tempfile.TemporaryDirectory(dir=adapters.staging_dir, prefix="preft-ft-") as tmp:
        root = Path(tmp)
        for name in OUTPUT_FILES:
            store.download_file(prefix + name, root / name)
        metrics: dict[str, Any] = json.loads((root / OUTPUT_FILES[2]).read_text())
        mode = (
            AdapterMode(record.train_args.get("mode", "prefill"))
            if record.train_args.get("adapter") == "lora"
            else AdapterMode.PREFILL
        )
        with (
            open(root / OUTPUT_FILES[0], "rb") as config,
            open(root / OUTPUT_FILES[1], "rb") as weights,
        ):
            result = adapters.upload(
                record.tenant,
                record.adapter_name,
                mode,
                [UploadedFile(OUTPUT_FILES[0], config), UploadedFile(OUTPUT_FILES[1], weights)],
                create=False,
                promote=promote,
            )
        result_file = files.put_result(
            record.tenant, f"{record.id}-step_metrics.csv", step_metrics_csv(metrics)
        )
    for name in OUTPUT_FILES:
        store.delete(prefix + name)
    train = metrics.get("train_loss") or [{}]
    last = train[-1]
    values = {
        "train_loss": float(metrics.get("final_train_loss") or 0.0),
        "step": float(last.get("step", metrics.get("steps", 0))),
    }
    if metrics.get("final_eval_loss") is not None:
        values["valid_loss"] = float(metrics["final_eval_loss"])
    checkpoint = Checkpoint(
        id=f"ftckpt-{record.id[6:]}",
        created_at=int(time.time()),
        fine_tuned_model_checkpoint=f"{record.adapter_name}@{result.version.version}",
        fine_tuning_job_id=record.id,
        metrics=values,
        step_number=int(metrics.get("steps", 0)),
    )
    return Registered(
        record.adapter_name,
        result.version.version,
        result.version.sha256,
        int(metrics.get("tokens_seen", 0)),
        result_file.id if result_file is not None else None,
        checkpoint,
        result.warnings,
        result.state,
        result.audit_change(),
    )
