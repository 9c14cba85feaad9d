"""Killing the registry between blob and metadata leaves no metadata pointing at nothing,
and the next upload of the same content completes normally."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from preft_serve.adapters.format import CONFIG_FILE, WEIGHTS_FILE
from tests.support.registry_api import upload

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("point", ["after_weights", "after_blob"])
def test_kill_between_blob_and_metadata(
    point, client, acme, settings, lora_dir, s3, bucket, state_snapshot, tmp_path
):
    before = state_snapshot()
    settings_json = settings.model_dump_json()
    # SecretStr fields dump masked; pass the real values for the subprocess.
    data = json.loads(settings_json)
    data["admin_token"] = settings.admin_token.get_secret_value()
    data["object_store"]["s3_secret_access_key"] = "testing"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.registry.crash_upload",
            json.dumps(data),
            str(lora_dir),
            "acme",
            point,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    after = state_snapshot()
    assert after["redis"] == before["redis"]  # no metadata, no event
    written = [key for key, _ in after["bucket"]]
    assert all(k.endswith((WEIGHTS_FILE, CONFIG_FILE)) for k in written)
    assert len(written) == (1 if point == "after_weights" else 2)

    # Nothing references the orphan; the retry completes the blob and commits version 1.
    assert client.get("/v1/adapters/bot", headers=acme).status_code == 404
    resp = upload(client, acme, "bot", lora_dir)
    assert resp.status_code == 201 and resp.json()["version"] == 1
    digest = resp.json()["sha256"]
    assert all(digest in key for key in written)
    settings.object_store.create().fetch_adapter(digest, tmp_path / "fetched")
