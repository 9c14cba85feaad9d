"""The gate in front of uploads and downloads.

An upload without a valid tenant key is refused before any of its body is read: FastAPI
reads (and spools to disk) a whole multipart form before the route's authentication runs,
so anyone could send ``PREFT_REGISTRY_MAX_UPLOAD_BYTES`` per request to the registry's
temporary disk and only then get the 401. Every upload and download holds a transfer slot
while it runs and moves: a tenant at its share is refused with 429, the replica at its cap
with 503 (nothing stored; a large refused body is not read), other tenants keep theirs, a
stalled upload or unread download loses its slot, and an upload's form is held to a few
parts (each small part is kept in memory)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.support.asgi import answer_of, multipart_scope, stalls_after


def _call(app: Any, headers: dict[str, str]) -> tuple[int, dict[str, Any], int]:
    """POST a (never-ending) multipart body to /v1/adapters straight through the ASGI app:
    (status, JSON body, how many times the app asked for body bytes)."""
    asked = 0

    async def receive() -> dict[str, Any]:
        nonlocal asked
        asked += 1
        if asked > 4:  # enough to see that it reads: end the body
            return {"type": "http.request", "body": b"--b--\r\n", "more_body": False}
        return {"type": "http.request", "body": b"x" * 65536, "more_body": True}

    scope = multipart_scope("POST", "/v1/adapters", headers)
    status, _, body = asyncio.run(answer_of(app, scope, receive))
    return status, json.loads(body), asked


@pytest.mark.parametrize(
    ("headers", "needle"),
    [
        ({}, "missing credentials: send 'Authorization: Bearer <API key>'"),
        ({"Authorization": "Basic dXNlcjpwdw=="}, "missing credentials"),
        ({"Authorization": "Bearer pft_0000.not-a-key"}, "invalid or revoked API key"),
        ({"Authorization": "Bearer sk-openai"}, "not a preft API key"),
    ],
)
def test_upload_without_a_valid_key_is_refused_unread(
    client, state_snapshot, headers, needle
) -> None:
    before = state_snapshot()
    status, body, asked = _call(client.app, headers)
    assert status == 401
    assert needle in body["error"]["message"]
    assert asked == 0
    assert state_snapshot() == before


def test_upload_with_a_valid_key_is_read(client, acme) -> None:
    status, body, asked = _call(client.app, acme)
    assert asked > 0  # the form is parsed (and found malformed): auth let it through
    assert status in (400, 422), body


def test_upload_while_redis_is_down_is_503_unread(client, acme, monkeypatch) -> None:
    import redis

    def down(_key: str) -> None:
        raise redis.ConnectionError("Connection refused")

    monkeypatch.setattr(client.app.state.registry.tenants, "authenticate", down)
    status, body, asked = _call(client.app, acme)
    assert (status, asked) == (503, 0)
    assert body["error"]["message"] == "Redis is unavailable; retry shortly"


class _Held:
    """Calls into the ASGI app that stay in progress until :meth:`release`: an upload whose
    body has not arrived yet, or a download whose client has not read its answer."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.go = asyncio.Event()
        self.inside = 0  # calls now waiting inside the app
        self.tasks: list[asyncio.Task[tuple[int, dict[str, str], bytes]]] = []

    def start(self, method: str, path: str, headers: dict[str, str]) -> None:
        self.tasks.append(asyncio.create_task(self._call(method, path, headers)))

    async def _call(
        self, method: str, path: str, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        received = 0
        started = False

        async def receive() -> dict[str, Any]:
            nonlocal received
            received += 1
            if method == "POST":
                self.inside += 1
                await self.go.wait()
                return {"type": "http.request", "body": b"--b--\r\n", "more_body": False}
            if received == 1:  # the empty body of a GET
                return {"type": "http.request", "body": b"", "more_body": False}
            await self.go.wait()  # then nothing until the client goes
            return {"type": "http.disconnect"}

        async def before_send(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.body" and not started:
                started = True
                self.inside += 1  # the download's first bytes: now its client waits
                await self.go.wait()

        scope = multipart_scope(method, path, headers)
        return await answer_of(self.app, scope, receive, before_send)

    async def all_inside(self, count: int) -> None:
        for _ in range(2000):
            if self.inside >= count:
                return
            await asyncio.sleep(0.005)
        raise AssertionError(f"{self.inside} of {count} calls got inside the app")

    async def release(self) -> list[tuple[int, dict[str, str], bytes]]:
        self.go.set()
        return list(await asyncio.gather(*self.tasks))


async def _one(app: Any, method: str, path: str, headers: dict[str, str]) -> tuple[int, Any, Any]:
    """A call that finishes at once: (status, headers, JSON body)."""
    held = _Held(app)
    held.go.set()
    held.start(method, path, headers)
    ((status, out_headers, body),) = await held.release()
    return status, out_headers, json.loads(body) if body else None


def test_a_tenant_at_its_share_is_refused_429_and_others_are_served(
    client, new_tenant, state_snapshot, lora_dir
) -> None:
    from tests.support.registry_api import upload

    acme, beta = new_tenant("acme"), new_tenant("beta")
    app = client.app
    assert app.state.registry.settings.tenant_max_transfers == 2  # the default share

    async def run() -> None:
        held = _Held(app)
        for _ in range(2):
            held.start("POST", "/v1/adapters", acme)
        await held.all_inside(2)
        assert app.state.transfers.in_progress == 2
        metrics = client.get("/metrics").text
        assert "preft_registry_transfers_in_progress 2.0" in metrics

        before = state_snapshot()
        status, headers, body = await _one(app, "POST", "/v1/adapters", acme)
        assert status == 429
        assert body["error"]["code"] == "too_many_transfers"
        assert "already has 2 uploads or downloads in progress" in body["error"]["message"]
        assert "PREFT_REGISTRY_TENANT_MAX_TRANSFERS" in body["error"]["message"]
        assert headers["retry-after"] == "1"
        assert state_snapshot() == before
        # the same tenant's download is a transfer too
        status, _, body = await _one(app, "GET", "/v1/adapters/bot/download", acme)
        assert (status, body["error"]["code"]) == (429, "too_many_transfers")

        # another tenant is not held back by acme's share: its (empty) form is parsed
        status, _, body = await _one(app, "POST", "/v1/adapters", beta)
        assert status in (400, 422), body

        answers = await held.release()
        assert [a[0] for a in answers] and all(a[0] in (400, 422) for a in answers)

    asyncio.run(run())
    assert app.state.transfers.in_progress == 0
    assert "preft_registry_transfers_in_progress 0.0" in client.get("/metrics").text
    assert upload(client, acme, "bot", lora_dir).status_code == 201  # slots given back


def test_the_replica_at_its_cap_is_503_for_every_tenant(make_client, state_snapshot) -> None:
    from tests.support.registry_api import create_tenant

    client = make_client(max_transfers=2, tenant_max_transfers=1)
    tenants = [create_tenant(client, name) for name in ("acme", "beta", "gamma")]

    async def run() -> None:
        held = _Held(client.app)
        held.start("POST", "/v1/adapters", tenants[0])
        held.start("POST", "/v1/files", tenants[1])
        await held.all_inside(2)
        before = state_snapshot()
        status, headers, body = await _one(client.app, "POST", "/v1/adapters", tenants[2])
        assert (status, body["error"]["code"]) == (503, "registry_busy")
        assert "PREFT_REGISTRY_MAX_TRANSFERS" in body["error"]["message"]
        assert headers["retry-after"] == "1"
        assert state_snapshot() == before
        await held.release()

    asyncio.run(run())
    assert client.app.state.transfers.in_progress == 0


def test_a_download_holds_its_slot_until_its_client_has_read_it(
    client, acme, lora_dir, settings
) -> None:
    from tests.support.registry_api import upload

    assert upload(client, acme, "bot", lora_dir).status_code == 201
    staging = settings.staging_dir

    async def run() -> None:
        held = _Held(client.app)
        for _ in range(2):
            held.start("GET", "/v1/adapters/bot/download", acme)
        await held.all_inside(2)  # both answers started, neither read
        assert len(list(staging.glob("preft-download-*"))) == 2
        status, _, body = await _one(client.app, "POST", "/v1/adapters", acme)
        assert (status, body["error"]["code"]) == (429, "too_many_transfers")
        answers = await held.release()
        assert [a[0] for a in answers] == [200, 200]
        assert all(a[1]["x-preft-version"] == "1" for a in answers)

    asyncio.run(run())
    assert client.app.state.transfers.in_progress == 0
    assert list(staging.glob("preft-download-*")) == []


def test_an_upload_of_too_many_form_parts_is_400_and_stores_nothing(
    client, acme, state_snapshot, lora_dir
) -> None:
    from preft_serve.registry.transfer_gate import MAX_UPLOAD_PARTS

    parts = [("files", (f"f{i}.json", b"{}", "application/json")) for i in range(MAX_UPLOAD_PARTS)]
    before = state_snapshot()
    resp = client.post(
        "/v1/adapters", data={"name": "bot", "mode": "prefill"}, files=parts, headers=acme
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "too_many_parts"
    assert f"at most {MAX_UPLOAD_PARTS} parts" in resp.json()["error"]["message"]
    assert state_snapshot() == before
    assert client.app.state.transfers.in_progress == 0


def test_a_share_larger_than_the_replica_cap_is_refused_at_start(settings) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="one tenant could hold every transfer slot"):
        settings.model_validate({**settings.model_dump(), "tenant_max_transfers": 9})


def _form(boundary: bytes, parts: int, size: int = 1) -> bytes:
    """A multipart body of ``parts`` file parts of ``size`` bytes each."""
    body = b"".join(
        b"--" + boundary + b'\r\nContent-Disposition: form-data; name="files"; '
        b'filename="f%d.bin"\r\n\r\n' % i + b"x" * size + b"\r\n"
        for i in range(parts)
    )
    return body + b"--" + boundary + b"--\r\n"


def _chunked(body: bytes, size: int) -> Any:
    """A ``receive`` that hands ``body`` over in ``size``-byte chunks, and how many bytes
    it has handed over."""
    state = {"sent": 0}

    async def receive() -> dict[str, Any]:
        start = state["sent"]
        state["sent"] = min(start + size, len(body))
        more = state["sent"] < len(body)
        return {"type": "http.request", "body": body[start : state["sent"]], "more_body": more}

    return receive, state


@pytest.mark.parametrize(
    ("content_type", "boundary"),
    [
        (b'multipart/form-data; boundary="q-b"', b"q-b"),
        (b"multipart/form-data; boundary = sp", b"sp"),
        (b"multipart/form-data; boundary=first; boundary=last", b"last"),
        (b'multipart/form-data; x="y;boundary=decoy"; boundary=real', b"real"),
        (b"Multipart/Form-Data; BOUNDARY=caps", b"caps"),
    ],
)
def test_parts_are_counted_by_the_boundary_the_form_parser_reads(
    client, acme, state_snapshot, content_type, boundary
) -> None:
    """Every spelling of the boundary that Starlette's parser accepts is the one counted,
    across chunk edges (7-byte chunks split every delimiter)."""
    before = state_snapshot()
    receive, _ = _chunked(_form(boundary, 20), 7)
    scope = multipart_scope("POST", "/v1/adapters", acme, content_type)
    status, _, body = asyncio.run(answer_of(client.app, scope, receive))
    assert (status, json.loads(body)["error"]["code"]) == (400, "too_many_parts")
    assert state_snapshot() == before
    # 16 parts pass the count (and are refused by the route: they are no adapter)
    receive, _ = _chunked(_form(boundary, 16), 7)
    status, _, body = asyncio.run(answer_of(client.app, scope, receive))
    assert status in (400, 422) and json.loads(body)["error"]["code"] != "too_many_parts"


def test_a_form_of_many_small_parts_is_cut_off_in_bounded_memory(client, acme) -> None:
    """Starlette keeps each part under 1 MiB in memory: 64 parts of 256 KiB (16 MiB) were
    all held; the count stops the form after 16 of them (at most 4 MiB)."""
    import tracemalloc

    body = _form(b"b", 64, 256 << 10)
    receive, state = _chunked(body, 64 << 10)
    scope = multipart_scope("POST", "/v1/adapters", acme)
    tracemalloc.start()
    try:
        status, _, answer = asyncio.run(answer_of(client.app, scope, receive))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (status, json.loads(answer)["error"]["code"]) == (400, "too_many_parts")
    assert peak < 8 << 20, f"{peak / 2**20:.1f} MiB held"
    assert state["sent"] == len(body)  # the rest was read and dropped (16 MiB at most)


def test_an_upload_that_stops_arriving_loses_its_slot_with_408(make_client, state_snapshot) -> None:
    from tests.support.registry_api import create_tenant

    client = make_client(transfer_idle_timeout_s=0.3, transfer_min_bytes_per_s=0)
    acme = create_tenant(client, "acme")
    stalls = stalls_after(b"--b\r\n")
    before = state_snapshot()
    scope = multipart_scope("POST", "/v1/adapters", acme)
    status, _, body = asyncio.run(asyncio.wait_for(answer_of(client.app, scope, stalls), 10))
    error = json.loads(body)["error"]
    assert (status, error["code"]) == (408, "request_timeout")
    assert "the request body stopped arriving: nothing for 0.3 s" in error["message"]
    assert client.app.state.transfers.in_progress == 0
    assert state_snapshot() == before


def test_a_download_nobody_reads_is_cut_off_and_frees_its_slot(
    make_client, lora_dir, settings, caplog
) -> None:
    from tests.support.registry_api import create_tenant, upload

    client = make_client(transfer_idle_timeout_s=0.3)
    acme = create_tenant(client, "acme")
    assert upload(client, acme, "bot", lora_dir).status_code == 201

    async def run() -> tuple[int, dict[str, str], bytes]:
        held = _Held(client.app)  # never released: its client never reads
        return await held._call("GET", "/v1/adapters/bot/download", acme)

    status, _, body = asyncio.run(asyncio.wait_for(run(), 10))
    assert (status, body) == (200, b"")  # the answer started; none of it was read
    assert client.app.state.transfers.in_progress == 0
    assert list(settings.staging_dir.glob("preft-download-*")) == []
    assert "download /v1/adapters/bot/download cut off: the client read nothing for 0.3 s" in (
        caplog.text
    )


def test_a_refused_large_upload_is_answered_without_reading_it(make_client) -> None:
    """Past its share, an upload that declares more than 16 MiB is answered at once and
    its connection closed; a small one is read (and dropped) so its client sees the 429."""
    from tests.support.registry_api import create_tenant

    client = make_client(max_upload_bytes=64 << 20)
    acme = create_tenant(client, "acme")
    declared = {**acme, "Content-Length": str(32 << 20)}

    async def run() -> None:
        held = _Held(client.app)
        for _ in range(2):
            held.start("POST", "/v1/adapters", acme)
        await held.all_inside(2)
        receive, state = _chunked(b"x" * (32 << 20), 1 << 20)
        scope = multipart_scope("POST", "/v1/adapters", declared)
        status, headers, _ = await answer_of(client.app, scope, receive)
        assert (status, headers["connection"], state["sent"]) == (429, "close", 0)
        receive, state = _chunked(_form(b"b", 2), 1024)
        status, _, _ = await answer_of(
            client.app, multipart_scope("POST", "/v1/adapters", acme), receive
        )
        assert status == 429 and state["sent"] == len(_form(b"b", 2))
        await held.release()

    asyncio.run(run())
