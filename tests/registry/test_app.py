"""Service plumbing: OpenAPI docs, health, metrics, error envelope, settings, entry point,
and the streaming body limit over real HTTP."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from pydantic import ValidationError

from preft_serve.common.objectstore import ObjectStoreSettings
from preft_serve.registry.settings import RegistrySettings
from tests.support.registry_api import create_tenant, error_message, upload


def test_openapi_published(client):
    assert client.get("/docs").status_code == 200
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    assert {"/v1/tenants", "/v1/adapters", "/v1/adapters/{name}", "/v1/users/{user_id}"} <= set(
        paths
    )
    upload = paths["/v1/adapters"]["post"]
    assert "multipart/form-data" in upload["requestBody"]["content"]
    assert {"200", "201", "409", "413", "415", "422"} <= set(upload["responses"])
    assert {"AdminToken", "TenantApiKey"} <= set(spec["components"]["securitySchemes"])


def test_health_ready_metrics(client, acme):
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready"}
    client.get("/v1/adapters/x", headers=acme)
    text = client.get("/metrics").text
    assert (
        'preft_registry_requests_total{method="GET",route="/v1/adapters/{name}",status="404"} 1.0'
    ) in text


def test_unknown_route_and_method_use_envelope(client):
    resp = client.get("/v2/nothing")
    assert resp.status_code == 404
    assert resp.json() == {
        "error": {
            "message": "no such endpoint: GET /v2/nothing; see /docs for the API",
            "type": "invalid_request_error",
            "param": None,
            "code": "unknown_url",
        }
    }
    resp = client.patch("/v1/adapters")
    assert resp.status_code == 405
    assert error_message(resp) == "method not allowed on this endpoint; see /docs for the API"


def test_redis_down_is_503(make_client, base_model_dir):
    from tests.support.ports import free_port

    client = make_client(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    resp = client.get("/v1/adapters", headers={"Authorization": "Bearer pft_a.b"})
    assert resp.status_code == 503
    assert error_message(resp) == "Redis is unavailable; retry shortly"
    assert client.get("/readyz").status_code == 503


@pytest.mark.parametrize("how", ["moved", "replaced by a file"])
def test_object_store_outage_is_503_and_nothing_changes(
    make_client, tmp_path, lora_dir, lora_dir2, state_snapshot, how
):
    """The local store's directory is moved (or a file takes its place) after start-up:
    uploads are 503 with nothing stored and the directory is not recreated, /readyz says
    why, and no answer shows the path or errno text."""
    objects = tmp_path / "objects"
    client = make_client(object_store=ObjectStoreSettings(url=str(objects)))
    assert objects.is_dir()  # created once, at start-up
    acme = create_tenant(client, "acme")
    assert upload(client, acme, "first", lora_dir).status_code == 201
    before, stored = state_snapshot(), sorted(objects.rglob("*"))
    objects.rename(tmp_path / "moved")
    if how == "replaced by a file":
        objects.write_bytes(b"")

    responses = [
        upload(client, acme, "second", lora_dir2),
        upload(client, acme, "first", lora_dir2, method="PUT"),
    ]
    ready = client.get("/readyz")

    for resp in responses:
        assert resp.status_code == 503, resp.text
        assert resp.json()["error"]["code"] == "service_unavailable"
        assert error_message(resp) == "the object store is unavailable; retry shortly"
    reason = "directory is missing" if how == "moved" else "path is not a directory"
    assert ready.status_code == 503
    assert error_message(ready) == f"the object store is unavailable: the object store {reason}"
    for resp in (*responses, ready):
        assert str(tmp_path) not in resp.text and "Errno" not in resp.text
    assert state_snapshot() == before
    assert objects.is_file() if how == "replaced by a file" else not objects.exists()
    objects.unlink(missing_ok=True)
    (tmp_path / "moved").rename(objects)
    assert sorted(objects.rglob("*")) == stored  # nothing half-stored
    assert client.get("/readyz").status_code == 200
    assert upload(client, acme, "second", lora_dir2).status_code == 201


def test_streaming_body_limit_over_http(make_client, settings, lora_dir):
    """A chunked body (no Content-Length) is cut off once it passes the limit."""
    import threading

    import uvicorn

    from preft_serve.registry.app import create_app
    from tests.support.ports import free_port

    port = free_port()
    app = create_app(settings.model_copy(update={"max_upload_bytes": 64 * 1024}))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            thread.join(0.02)
        url = f"http://127.0.0.1:{port}"
        headers = create_tenant(httpx.Client(base_url=url), "acme")
        boundary = "b0undary"

        def body():
            yield (
                f'--{boundary}\r\nContent-Disposition: form-data; name="files"; '
                f'filename="adapter_model.safetensors"\r\n\r\n'
            ).encode()
            for _ in range(12):  # 96 KiB in 8 KiB chunks, no declared length
                yield b"\0" * 8192
            yield f"\r\n--{boundary}--\r\n".encode()

        resp = httpx.post(
            f"{url}/v1/adapters",
            content=body(),
            headers={**headers, "Content-Type": f"multipart/form-data; boundary={boundary}"},
        )
        assert "content-length" not in resp.request.headers
        assert resp.status_code == 413
        assert error_message(resp).startswith(
            "request body exceeds this registry's 65536-byte limit"
        )
    finally:
        server.should_exit = True
        thread.join(10)


def test_settings_reject_placeholders_and_missing_model(base_model_dir, tmp_path):
    with pytest.raises(ValidationError, match="at least 16 characters"):
        RegistrySettings(admin_token="short", base_model=base_model_dir)
    with pytest.raises(ValidationError, match="looks like a placeholder"):
        RegistrySettings(admin_token="changeme-changeme", base_model=base_model_dir)
    with pytest.raises(ValidationError, match="point base_model at a HF model directory"):
        RegistrySettings(admin_token="a-real-random-secret-9f8e7d", base_model=tmp_path)
    with pytest.raises(ValidationError, match="admin_token"):
        RegistrySettings(base_model=base_model_dir)  # required, no default


def test_settings_from_env(monkeypatch, base_model_dir):
    monkeypatch.setenv("PREFT_REGISTRY_ADMIN_TOKEN", "a-real-random-secret-9f8e7d")
    monkeypatch.setenv("PREFT_REGISTRY_BASE_MODEL", str(base_model_dir))
    monkeypatch.setenv("PREFT_REGISTRY_OBJECT_STORE__URL", "s3://bucket/prefix")
    monkeypatch.setenv("PREFT_REGISTRY_OBJECT_STORE__S3_ENDPOINT_URL", "http://minio:9000")
    monkeypatch.setenv("PREFT_REGISTRY_MAX_REFT_RANK", "8")
    monkeypatch.setenv("PREFT_REGISTRY_MAX_RANK", "32")  # the old name of MAX_LORA_RANK
    s = RegistrySettings()
    assert s.object_store.url == "s3://bucket/prefix"
    assert s.object_store.s3_endpoint_url == "http://minio:9000"
    assert s.max_lora_rank == 32 and s.max_reft_rank == 8
    assert s.base_model_label == "tiny-llama"
    monkeypatch.setenv("PREFT_REGISTRY_MAX_LORA_RANK", "64")  # the new name wins
    assert RegistrySettings().max_lora_rank == 64


def test_module_entry_point_help():
    proc = subprocess.run(
        [sys.executable, "-m", "preft_serve.registry", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0
    assert "--host" in proc.stdout and "--port" in proc.stdout
    assert "PREFT_REGISTRY_ADMIN_TOKEN" in proc.stdout
