"""Subprocess for the crash-safety test: an upload that SIGKILLs itself mid-way.

``python -m tests.registry.crash_upload SETTINGS_JSON ADAPTER_DIR TENANT POINT`` where
POINT is ``after_weights`` (weights object written, config not) or ``after_blob`` (both
objects written, metadata not).
"""

from __future__ import annotations

import io
import os
import signal
import sys
from pathlib import Path

from preft_serve.adapters.format import AdapterMode
from preft_serve.registry.ingest import UploadedFile
from preft_serve.registry.metrics import RegistryMetrics
from preft_serve.registry.settings import RegistrySettings
from preft_serve.registry.state import RegistryState


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(settings_json: str, adapter_dir: str, tenant: str, point: str) -> None:
    state = RegistryState.build(
        RegistrySettings.model_validate_json(settings_json), RegistryMetrics()
    )
    store = state.store
    if point == "after_weights":
        # put_adapter writes the weights with put_file, then the config with put_bytes.
        store.put_bytes = lambda key, data: _die()  # type: ignore[method-assign]
    else:
        real_put_adapter = store.put_adapter

        def put_then_die(*args: object, **kwargs: object) -> bool:
            real_put_adapter(*args, **kwargs)  # type: ignore[arg-type]
            _die()
            return True

        store.put_adapter = put_then_die  # type: ignore[method-assign]
    files = [
        UploadedFile(p.name, io.BytesIO(p.read_bytes()))
        for p in sorted(Path(adapter_dir).iterdir())
    ]
    state.adapters.upload(tenant, "bot", AdapterMode.PREFILL, files, create=True)
    sys.exit("unreachable: the upload should have been killed")


if __name__ == "__main__":
    main(*sys.argv[1:5])
