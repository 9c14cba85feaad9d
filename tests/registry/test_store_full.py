"""A full object store (a real tmpfs with no space left): uploads are refused with a 507
that says the store is full and that an operator must act (not "retry shortly"), with no
path or errno text; nothing is half-stored, and the operator's counter moves."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from preft_serve.common.objectstore import ObjectStoreSettings, StoreFull
from preft_serve.registry.finetune.entry import tenant_message
from tests.support.registry_api import create_tenant, upload

SIZE = 256 << 10


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs holding one file that leaves it almost no room (needs root)."""
    root = tmp_path / "full"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(root)], check=True)
    try:
        (root / "objects").mkdir()
        with open(root / "filler", "wb") as filler:
            filler.write(b"\0" * (SIZE - 8192))
        yield root / "objects"
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


def metric(client: TestClient, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def test_an_upload_to_a_full_store_is_a_507_and_stores_nothing(
    make_client: Callable[..., TestClient],
    full_disk: Path,
    lora_dir: Path,
    redis_client: object,
    namespace: str,
) -> None:
    client = make_client(object_store=ObjectStoreSettings(url=str(full_disk)))
    acme = create_tenant(client, "acme")
    assert sum(p.stat().st_size for p in lora_dir.iterdir()) > 16384  # cannot fit
    refused = upload(client, acme, "bot", lora_dir)
    assert refused.status_code == 507, refused.text
    error = refused.json()["error"]
    assert error["code"] == "store_full"
    assert "operator must free or add space" in error["message"]
    assert "retry" not in error["message"] and "Errno" not in error["message"]
    assert str(full_disk) not in refused.text
    assert metric(client, "preft_registry_store_full_total") == 1
    assert client.get("/v1/adapters", headers=acme).json()["items"] == []
    assert not [p for p in full_disk.rglob("*") if p.is_file()]  # no half-written blob


@pytest.mark.parametrize(
    "exc",
    [
        OSError(28, "No space left on device", "/var/tmp/preft-trainer-x/adapter"),
        StoreFull("/srv/objects: No space left on device"),
    ],
)
def test_a_trainer_out_of_disk_says_so_without_paths_or_errno(exc: Exception) -> None:
    message = tenant_message(exc)
    assert message == "the trainer ran out of disk space (its scratch disk or the object store)"


def test_other_file_errors_of_a_trainer_keep_paths_out() -> None:
    message = tenant_message(PermissionError(13, "Permission denied", "/srv/objects/files/x"))
    assert message == "the trainer could not read or write its files (PermissionError)"
