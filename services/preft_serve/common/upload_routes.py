"""Which calls are uploads (a fine-tuning file, an adapter, or an adapter's next version):
their multipart bodies are streamed and bounded by the upload limit, every other body is a
small JSON document. One rule for the registry (which caps every other body as JSON) and
the gateway (which streams these through to it)."""

from __future__ import annotations


def is_upload_route(method: str, path: str) -> bool:
    """``POST /v1/files``, ``POST /v1/adapters`` or ``PUT /v1/adapters/{name}``."""
    if method == "POST":
        return path in ("/v1/files", "/v1/adapters")
    if method == "PUT" and path.startswith("/v1/adapters/"):
        return "/" not in path[len("/v1/adapters/") :].rstrip("/")
    return False
