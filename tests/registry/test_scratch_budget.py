"""Scratch disk held by uploads and downloads, counted as it is written.

A slot count does not bound the registry's disk: a small archive may unpack to the
weights limit, and a download stages twice an adapter's size. Each transfer counts the
bytes it spools and stages before writing them; a tenant's transfers hold at most its
share (429 ``too_many_transfers``), the replica's at most ``SCRATCH_BYTES`` (503
``registry_busy``), both with ``Retry-After`` and nothing stored. Everything is given back
when the transfer ends."""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from preft_serve.common.domain_errors import RateLimited, Unavailable
from preft_serve.registry.transfers import EXPORT_SLACK_BYTES, TransferSlots, hold_scratch
from tests.registry.test_transfer_gate import _Held
from tests.support.asgi import answer_of, multipart_scope
from tests.support.registry_api import create_tenant, upload


def _gauge(client: Any) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("preft_registry_scratch_bytes_held "):
            return float(line.split()[1])
    raise AssertionError("preft_registry_scratch_bytes_held is not exported")


def _adapter_bytes(adapter_dir: Path) -> int:
    return sum(p.stat().st_size for p in adapter_dir.iterdir() if p.is_file())


def _archive(adapter_dir: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in sorted(adapter_dir.iterdir()):
            tar.add(path, arcname=path.name)
    return buffer.getvalue()


def test_slots_count_bytes_per_tenant_and_in_all() -> None:
    slots = TransferSlots(8, 2, scratch_bytes=100, tenant_scratch_bytes=60)
    a1, a2, b = slots.take("a"), slots.take("a"), slots.take("b")
    a1.hold(40)
    with pytest.raises(RateLimited, match=r"would hold 70 bytes .* past its 60-byte share") as err:
        a2.hold(30)
    assert (err.value.code, err.value.retry_after_s) == ("too_many_transfers", 1)
    a2.hold(20)  # up to the share exactly
    with pytest.raises(Unavailable, match="hold 60 bytes of scratch disk; 41 more") as busy:
        b.hold(41)
    assert (busy.value.code, busy.value.retry_after_s) == ("registry_busy", 1)
    assert (slots.scratch_held, b.held_bytes) == (60, 0)  # a refusal holds nothing
    b.hold(40)
    a1.end()
    a1.end()  # twice gives back once
    assert (slots.scratch_held, slots.in_progress) == (60, 2)
    a2.hold(40)  # the tenant's share is free again
    for transfer in (a2, b):
        transfer.end()
    assert (slots.scratch_held, slots.in_progress) == (0, 0)


def test_hold_scratch_counts_against_the_transfer_of_its_context_only() -> None:
    slots = TransferSlots(8, 2, scratch_bytes=100)
    hold_scratch(1000)  # no transfer: a background job's writes are not counted
    with slots.take("a") as transfer:
        hold_scratch(30)

        async def in_a_thread() -> None:  # as a sync route runs: in the threadpool
            import anyio

            await anyio.to_thread.run_sync(hold_scratch, 20)

        asyncio.run(in_a_thread())
        assert transfer.held_bytes == 50
        with pytest.raises(RateLimited):  # the tenant's share is the whole limit here
            hold_scratch(51)
    assert (slots.scratch_held, slots.in_progress) == (0, 0)
    hold_scratch(1000)


def test_scratch_settings_read_kubernetes_sizes_and_refuse_a_share_too_small(settings) -> None:
    from pydantic import ValidationError

    raw = settings.model_dump()
    parsed = settings.model_validate({**raw, "scratch_bytes": "6Gi"})
    assert (parsed.scratch_bytes, parsed.tenant_scratch_share) == (6 << 30, 3 << 30)
    assert settings.model_validate({**raw, "scratch_bytes": "1.5GiB"}).scratch_bytes == 3 << 29
    with pytest.raises(ValidationError, match="one tenant could hold all the scratch disk"):
        settings.model_validate({**raw, "scratch_bytes": 1 << 30, "tenant_scratch_bytes": 2 << 30})
    # the fixture's limits: an 8 MiB body spooled, then staged again as a training file
    # (more than the 4 MiB + 1 MiB of an adapter's files, or a download's two copies)
    assert settings.largest_transfer_bytes == 16 << 20
    with pytest.raises(ValidationError, match=r"half of scratch_bytes\) is less than one full"):
        settings.model_validate({**raw, "scratch_bytes": 24 << 20})
    assert settings.model_validate({**raw, "scratch_bytes": 32 << 20}).tenant_scratch_share == (
        16 << 20
    )


@pytest.mark.parametrize("where", ["body", "staging", "archive"])
def test_an_upload_past_the_tenants_share_is_429_and_stores_nothing(
    make_client, state_snapshot, lora_dir, settings, where
) -> None:
    """Refused while its body arrives (the spool), or while its files are staged, plain or
    unpacked from an archive: the count covers every copy an upload writes."""
    size = _adapter_bytes(lora_dir)
    archive = _archive(lora_dir)
    sent = len(archive) if where == "archive" else size
    # "body": less than the body; else the body fits and its staged copy does not
    share = sent // 2 if where == "body" else sent + sent // 2
    client = make_client(scratch_bytes=10 * size, tenant_scratch_bytes=share)
    acme = create_tenant(client, "acme")
    before = state_snapshot()
    if where == "archive":
        files = [("files", ("bot.tar.gz", archive, "application/gzip"))]
        resp = client.post(
            "/v1/adapters", data={"name": "bot", "mode": "prefill"}, files=files, headers=acme
        )
    else:
        resp = upload(client, acme, "bot", lora_dir)
    assert resp.status_code == 429, resp.text
    error = resp.json()["error"]
    assert error["code"] == "too_many_transfers"
    assert f"past its {share}-byte share (PREFT_REGISTRY_TENANT_SCRATCH_BYTES)" in error["message"]
    assert resp.headers["retry-after"] == "1"
    # refused while the body arrives, its connection is closed (the rest is not read)
    assert (resp.headers.get("connection") == "close") == (where == "body")
    assert state_snapshot() == before
    assert _gauge(client) == 0.0
    assert list(settings.staging_dir.glob("preft-upload-*")) == []
    # the same upload within a share that fits it both ways is stored
    roomy = make_client(scratch_bytes=10 * size, tenant_scratch_bytes=5 * size)
    assert upload(roomy, create_tenant(roomy, "beta"), "bot", lora_dir).status_code == 201


async def _post(app: Any, headers: dict[str, str], body: bytes) -> tuple[int, Any, Any]:
    """An upload whose body arrives in one chunk: (status, headers, JSON body)."""
    chunks = [body, b"--b--\r\n"]

    async def receive() -> dict[str, Any]:
        chunk = chunks.pop(0) if chunks else b""
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    scope = multipart_scope("POST", "/v1/adapters", headers)
    status, out_headers, answer = await answer_of(app, scope, receive)
    return status, out_headers, json.loads(answer)


def test_a_download_counts_its_files_and_archive_before_staging_them(
    make_client, state_snapshot, lora_dir, settings
) -> None:
    size = _adapter_bytes(lora_dir)
    client = make_client(scratch_bytes=10 * size, tenant_scratch_bytes=10 * size)
    acme, beta = create_tenant(client, "acme"), create_tenant(client, "beta")
    stored = upload(client, acme, "bot", lora_dir)
    assert stored.status_code == 201
    needs = 2 * (stored.json()["size_bytes"] + EXPORT_SLACK_BYTES)  # files, then archive
    client = make_client(scratch_bytes=needs + size, tenant_scratch_bytes=needs + size)

    async def run() -> None:
        held = _Held(client.app)
        held.start("GET", "/v1/adapters/bot/download", acme)
        await held.all_inside(1)  # staged and answering, its client not reading yet
        assert client.app.state.transfers.scratch_held == needs
        assert _gauge(client) == float(needs)
        before = state_snapshot()
        # beta's upload would pass the replica's limit: 503 while its body arrives
        status, headers, body = await _post(client.app, beta, b"x" * (size + 1))
        assert (status, body["error"]["code"]) == (503, "registry_busy"), body
        assert "(PREFT_REGISTRY_SCRATCH_BYTES)" in body["error"]["message"]
        assert (headers["retry-after"], headers["connection"]) == ("1", "close")
        assert state_snapshot() == before
        ((status, _, _),) = await held.release()
        assert status == 200

    asyncio.run(run())
    assert (client.app.state.transfers.scratch_held, _gauge(client)) == (0, 0.0)
    assert list(settings.staging_dir.glob("preft-download-*")) == []

    # a share too small for the files and their archive: refused before anything is staged
    small = make_client(scratch_bytes=needs, tenant_scratch_bytes=needs - 1)
    resp = small.get("/v1/adapters/bot/download", headers=acme)
    assert (resp.status_code, resp.json()["error"]["code"]) == (429, "too_many_transfers")
    assert list(settings.staging_dir.glob("preft-download-*")) == []
