"""The CLI waits out a registry that has no transfer slot free for it (429
``too_many_transfers`` / 503 ``registry_busy``, nothing done) and sends the same upload
again, saying so on stderr; past its patience it reports the refusal."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.cli import run_cli
from tests.support.registry_api import admin, bearer


@pytest.fixture
def settings(settings):
    """The registry tests' settings, with a share of one transfer per tenant."""
    return settings.model_copy(update={"tenant_max_transfers": 1, "max_transfers": 2})


def _in_progress(url: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("preft_registry_transfers_in_progress "):
            return float(line.split()[1])
    raise AssertionError("no transfers gauge")


@pytest.fixture
def tenant_key(live_server: str) -> str:
    resp = httpx.post(f"{live_server}/v1/tenants", json={"name": "acme"}, headers=admin())
    return str(resp.json()["api_key"])


@pytest.fixture
def stalled_upload(live_server: str, tenant_key: str) -> Iterator[socket.socket]:
    """An upload of the tenant's whose body stops after its first part: it holds the
    tenant's one transfer slot until the socket closes."""
    url = urlsplit(live_server)
    sock = socket.create_connection((url.hostname, url.port))
    sock.sendall(
        b"POST /v1/adapters HTTP/1.1\r\nHost: registry\r\n"
        + f"Authorization: Bearer {tenant_key}\r\n".encode()
        + b"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 100000\r\n\r\n"
        + b'--b\r\nContent-Disposition: form-data; name="name"\r\n\r\nstalled\r\n'
    )
    deadline = time.monotonic() + 10
    while _in_progress(live_server) < 1:
        assert time.monotonic() < deadline, "the stalled upload never took its slot"
        time.sleep(0.05)
    try:
        yield sock
    finally:
        sock.close()


def test_an_upload_refused_for_a_busy_share_is_sent_again_once_a_slot_frees(
    live_server, tenant_key, stalled_upload, lora_dir, capsys
) -> None:
    threading.Timer(1.5, stalled_upload.close).start()  # the stalled client goes away
    code, out, err = run_cli(
        capsys,
        "adapter", "upload", str(lora_dir), "--name", "bot", "--mode", "prefill",
        "--url", live_server, "--api-key", tenant_key, "--json",
    )  # fmt: skip
    assert code == 0, (out, err)
    assert json.loads(out)["version"] == 1
    assert "registry busy: this tenant already has 1 uploads or downloads in progress" in err
    assert "(retrying in 1 s)" in err
    assert _in_progress(live_server) == 0


def test_past_its_patience_the_cli_reports_the_refusal_and_nothing_is_stored(
    live_server, tenant_key, stalled_upload, lora_dir, capsys, monkeypatch
) -> None:
    monkeypatch.setattr("preft_serve.cli.client.BUSY_WAIT_S", 0.5)  # less than one wait
    code, out, err = run_cli(
        capsys,
        "adapter", "upload", str(lora_dir), "--name", "bot", "--mode", "prefill",
        "--url", live_server, "--api-key", tenant_key, "--json",
    )  # fmt: skip
    assert code == 1
    error = json.loads(out)["error"]
    assert error["code"] == "too_many_transfers"
    assert "wait for one to finish, then retry" in error["message"]
    assert "registry busy" not in err
    adapters = httpx.get(f"{live_server}/v1/adapters", headers=bearer(tenant_key)).json()
    assert adapters["items"] == []
