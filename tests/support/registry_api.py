"""The registry's REST API as the registry tests call it: admin and tenant headers, uploads,
the error envelope."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

ADMIN_TOKEN = "test-admin-0123456789abcdef"


def admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def create_tenant(client: TestClient, name: str) -> dict[str, str]:
    """Create a tenant through the admin API; returns its auth headers."""
    resp = client.post("/v1/tenants", json={"name": name}, headers=admin())
    assert resp.status_code == 201, resp.text
    return bearer(resp.json()["api_key"])


def upload(
    client: TestClient,
    headers: dict[str, str],
    name: str,
    adapter_dir: Path,
    mode: str = "prefill",
    method: str = "POST",
) -> Any:
    """Multipart upload of an adapter directory's two files; a PUT (next version) is the
    hot swap (``?promote=true``: served at once)."""
    files = [
        ("files", (p.name, p.read_bytes(), "application/octet-stream"))
        for p in sorted(adapter_dir.iterdir())
        if p.is_file()
    ]
    data = {"mode": mode}
    if method == "POST":
        data["name"] = name
        return client.post("/v1/adapters", data=data, files=files, headers=headers)
    return client.put(
        f"/v1/adapters/{name}",
        params={"promote": "true"},
        data=data,
        files=files,
        headers=headers,
    )


def error_message(resp: Any) -> str:
    body = resp.json()
    assert set(body) == {"error"}, body
    return str(body["error"]["message"])
