"""A tenant manages adapters, user bindings, usage and API keys through the gateway, the one
base URL: against a real registry (in-process over loopback HTTP, on the suite's Redis) every
answer through the gateway is the registry's own for the same key and call (status, body,
the headers a client needs), another tenant's objects are 404 through the gateway too, an
oversize upload is refused before the registry sees it, and without a registry (none
configured, or down) the client is told so. (Files, fine-tuning and the audit log:
test_registry_forwarding.py and test_audit_forwarding.py.)"""

from __future__ import annotations

import io
import socket
import tarfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi.testclient import TestClient

from preft_serve.gateway.app import create_app as gateway_app
from preft_serve.gateway.settings import GatewaySettings
from preft_serve.registry.app import create_app as registry_app
from tests.finetune.conftest import ADMIN_TOKEN, Api, registry_settings
from tests.fuzz.support import base_model, lora_files, upload_parts
from tests.gateway import test_registry_forwarding as files_forwarding
from tests.support.gateway import AUTH, Workers
from tests.support.inprocess import serving

BASE = "tiny-llama"
# Every family's calls, documented or not (the catch-all forwards the rest of a prefix).
CALLS = [
    ("POST", "/v1/adapters"),
    ("GET", "/v1/adapters?limit=2"),
    ("GET", "/v1/adapters/bot"),
    ("PUT", "/v1/adapters/bot"),
    ("DELETE", "/v1/adapters/bot?force=true"),
    ("POST", "/v1/adapters/bot/rollback"),
    ("GET", "/v1/adapters/bot/download"),
    ("GET", "/v1/adapters/bot/policy"),
    ("PATCH", "/v1/adapters/bot"),
    ("GET", "/v1/users"),
    ("PUT", "/v1/users/alice"),
    ("GET", "/v1/users/alice"),
    ("DELETE", "/v1/users/alice"),
    ("GET", "/v1/usage?by=user"),
    ("GET", "/v1/keys"),
    ("POST", "/v1/keys"),
    ("GET", "/v1/keys/0123456789ab"),
    ("DELETE", "/v1/keys/0123456789ab"),
]
DOCUMENTED = {
    ("POST", "/v1/adapters"),
    ("GET", "/v1/adapters"),
    ("GET", "/v1/adapters/{name}"),
    ("PUT", "/v1/adapters/{name}"),
    ("DELETE", "/v1/adapters/{name}"),
    ("POST", "/v1/adapters/{name}/rollback"),
    ("GET", "/v1/adapters/{name}/download"),
    ("GET", "/v1/adapters/{name}/evaluation"),
    ("PUT", "/v1/adapters/{name}/evaluation"),
    ("DELETE", "/v1/adapters/{name}/evaluation"),
    ("POST", "/v1/adapters/{name}/evaluations"),  # the gateway's own: it runs the examples
    ("GET", "/v1/users"),
    ("PUT", "/v1/users/{user_id}"),
    ("GET", "/v1/users/{user_id}"),
    ("DELETE", "/v1/users/{user_id}"),
    ("GET", "/v1/usage"),
    ("GET", "/v1/keys"),
    ("POST", "/v1/keys"),
    ("GET", "/v1/keys/{key_id}"),
    ("DELETE", "/v1/keys/{key_id}"),
}


# The gateway with no registry configured and with one that is down (fixtures, by name).
unconfigured, registry_down = files_forwarding.unconfigured, files_forwarding.registry_down


def _send(client: TestClient, method: str, path: str, **kwargs: Any) -> httpx.Response:
    return client.request(method, path, headers={**AUTH, "X-Request-Id": "trace-9"}, **kwargs)


@pytest.mark.parametrize(("method", "path"), CALLS)
def test_without_a_registry_every_family_says_it_is_not_enabled(
    unconfigured: TestClient, method: str, path: str
) -> None:
    resp = _send(unconfigured, method, path)
    assert resp.status_code == 501, resp.text
    error = resp.json()["error"]
    assert error["code"] == "registry_not_configured" and error["type"] == "server_error"
    assert "not enabled on this deployment" in error["message"]
    assert resp.headers["x-request-id"] == "trace-9"


@pytest.mark.parametrize(("method", "path"), CALLS)
def test_a_registry_that_does_not_answer_is_a_503_naming_the_family(
    registry_down: TestClient, method: str, path: str
) -> None:
    resp = _send(registry_down, method, path)
    assert resp.status_code == 503, resp.text
    error = resp.json()["error"]
    assert error["code"] == "registry_unavailable"
    family = "/" + "/".join(path.split("?")[0].split("/")[1:3])
    assert error["message"] == (
        f"the adapter registry, which serves {family}, is unreachable; try again later"
    )
    assert resp.headers["x-request-id"] == "trace-9"


@pytest.mark.parametrize(("method", "path"), CALLS)
def test_the_key_is_checked_at_the_gateway_first(
    registry_down: TestClient, method: str, path: str
) -> None:
    keyless = registry_down.request(method, path)
    assert keyless.status_code == 401, keyless.text
    assert keyless.json()["error"]["code"] == "missing_api_key"
    wrong = registry_down.request(method, path, headers={"Authorization": "Bearer pft_no.pe"})
    assert wrong.status_code == 401, wrong.text
    assert wrong.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize(
    "path",
    [
        "/v1/adapters/%2e%2e/tenants",
        "/v1/adapters/bot/%2E%2E/%2E%2E/tenants",
        "/v1/users/..%2Ftenants",
        "/v1/keys//x",
    ],
)
def test_a_path_that_could_leave_its_prefix_is_not_forwarded(
    registry_down: TestClient, path: str
) -> None:
    """Refused by the gateway (404), not sent on: the registry being down shows it."""
    resp = _send(registry_down, "GET", path)
    assert resp.status_code == 404, resp.text
    assert "no such route under" in resp.json()["error"]["message"]


def test_the_families_are_in_the_gateways_document(unconfigured: TestClient) -> None:
    spec = unconfigured.get("/openapi.json").json()
    found = {
        (method.upper(), path)
        for path, operations in spec["paths"].items()
        if path.startswith(("/v1/adapters", "/v1/users", "/v1/usage", "/v1/keys"))
        for method in operations
    }
    assert found == DOCUMENTED  # the catch-alls are left out
    for method, path in DOCUMENTED:
        operation = spec["paths"][path][method.lower()]
        assert operation["security"] == [{"TenantApiKey": []}], path
        assert {"401", "501", "503"} <= set(operation["responses"]), path
    upload = spec["paths"]["/v1/adapters"]["post"]["requestBody"]["content"]
    assert upload["multipart/form-data"]["schema"]["required"] == ["name", "mode", "files"]
    version = spec["paths"]["/v1/adapters/{name}"]["put"]["requestBody"]["content"]
    assert version["multipart/form-data"]["schema"]["required"] == ["files"]
    usage = spec["paths"]["/v1/usage"]["get"]
    assert {p["name"] for p in usage["parameters"]} >= {"group_by", "by", "since", "until"}


# --- against a real registry ---


class Stack:
    def __init__(self, registry: str, gateway: str, namespace: str) -> None:
        self.registry, self.gateway, self.namespace = Api(registry), gateway, namespace

    def call(self, key: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}", **kwargs.pop("headers", {})}
        return httpx.request(method, f"{self.gateway}{path}", timeout=30, headers=headers, **kwargs)

    def both(self, key: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The call through the gateway, after checking that it answers as the registry
        does for a read (a write is made once, through the gateway)."""
        through = self.call(key, method, path, **kwargs)
        direct = self.registry.call(key, method, path, **kwargs)
        assert through.status_code == direct.status_code, (through.text, direct.text)
        assert through.content == direct.content
        return through

    def open_uploads(self) -> float:
        for line in httpx.get(f"{self.gateway}/metrics").text.splitlines():
            if line.startswith('preft_gateway_registry_calls{kind="upload"}'):
                return float(line.split()[-1])
        raise AssertionError("no preft_gateway_registry_calls gauge")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return base_model(tmp_path_factory.mktemp("forward-model") / BASE)


@pytest.fixture
def stack(redis_server: str, model_dir: Path, tmp_path: Path) -> Iterator[Callable[..., Stack]]:
    """A registry and a gateway in front of it (keyword arguments: the gateway's settings;
    ``workers``: the mock workers' answers, else :class:`Workers`)."""
    with ExitStack() as stop:

        def start(workers: Workers | None = None, **gateway: Any) -> Stack:
            namespace = f"fwd{time.monotonic_ns() % 10**9}"
            settings = registry_settings(redis_server, namespace, model_dir, tmp_path, poll_s=60)
            registry_url = stop.enter_context(serving(registry_app(settings)))
            app = gateway_app(
                GatewaySettings(
                    worker_urls=["http://w1:8000"],
                    redis_url=redis_server,
                    namespace=namespace,
                    base_model_name=BASE,
                    registry_url=registry_url,
                    limits_cache_s=0,
                    **gateway,
                ),
                transport=httpx.MockTransport(workers or Workers()),
            )
            return Stack(registry_url, stop.enter_context(serving(app)), namespace)

        yield start


def _unused(listing: Any) -> Any:
    """A key listing without when each key was last used (this very call uses one)."""
    if isinstance(listing, list):
        return [{k: v for k, v in key.items() if k != "last_used_at"} for key in listing]
    return listing


def _members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {
            m.name.removeprefix("./"): tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


def _adapter(seed: int) -> list[tuple[str, tuple[str, bytes, str]]]:
    return upload_parts(*lora_files(seed))


def test_adapters_through_the_gateway_are_the_registrys(stack: Callable[..., Stack]) -> None:
    s = stack()
    acme, globex = s.registry.tenant("acme"), s.registry.tenant("globex")
    made = s.call(
        acme,
        "POST",
        "/v1/adapters",
        data={"name": "bot", "mode": "prefill"},
        files=_adapter(1),
        headers={"X-Request-Id": "trace-up"},
    )
    assert made.status_code == 201, made.text
    assert made.headers["x-request-id"] == "trace-up"
    first = made.json()
    assert (first["name"], first["version"]) == ("bot", 1)
    again = s.call(
        acme, "POST", "/v1/adapters", data={"name": "bot", "mode": "prefill"}, files=_adapter(1)
    )
    assert again.status_code == 200 and again.json()["sha256"] == first["sha256"]

    bumped = s.call(acme, "PUT", "/v1/adapters/bot", params={"promote": "true"}, files=_adapter(2))
    assert bumped.status_code == 201, bumped.text
    assert bumped.json()["version"] == 2

    listed = s.both(acme, "GET", "/v1/adapters", params={"limit": 10}).json()
    assert [a["name"] for a in listed["items"]] == ["bot"]
    detail = s.both(acme, "GET", "/v1/adapters/bot").json()
    assert [v["sha256"] for v in detail["versions"]][:2] == [
        first["sha256"],
        bumped.json()["sha256"],
    ]

    # The export: the registry's bytes and the headers that name the version.
    through = s.call(acme, "GET", "/v1/adapters/bot/download", params={"version": 1})
    direct = s.registry.call(acme, "GET", "/v1/adapters/bot/download", params={"version": 1})
    assert through.status_code == direct.status_code == 200, through.text
    # (Each export is archived afresh, so the archives' timestamps differ; the files not.)
    assert _members(through.content) == _members(direct.content)
    assert set(_members(through.content)) == {"adapter_config.json", "adapter_model.safetensors"}
    for header in ("content-type", "content-disposition", "x-preft-version", "x-preft-sha256"):
        assert through.headers[header] == direct.headers[header], header
    assert through.headers["x-preft-sha256"] == first["sha256"]

    # A conditional policy change: the ETag comes back and If-Match reaches the registry.
    read = s.call(acme, "GET", "/v1/adapters/bot/policy")
    tag = read.headers["etag"]
    assert tag == s.registry.call(acme, "GET", "/v1/adapters/bot/policy").headers["etag"]
    # The tag covers the policy, not the version list beside it: no cache may keep it.
    assert read.headers["cache-control"] == "no-store"
    moved = s.call(acme, "POST", "/v1/adapters/bot/versions/1/promote", headers={"If-Match": tag})
    assert moved.status_code == 200 and moved.headers["etag"] != tag, moved.text
    stale = s.call(acme, "POST", "/v1/adapters/bot/versions/2/promote", headers={"If-Match": tag})
    assert stale.status_code == 412 and "changed since it was read" in stale.text
    # A value outside ASCII (latin-1 on the wire) reaches the registry as it came.
    odd = s.call(
        acme, "POST", "/v1/adapters/bot/versions/2/promote", headers={"If-Match": b'"\xe9"'}
    )
    assert odd.status_code == 412, odd.text
    assert s.call(acme, "POST", "/v1/adapters/bot/versions/2/promote").status_code == 200

    rolled = s.call(acme, "POST", "/v1/adapters/bot/rollback", json={"version": 1})
    assert rolled.status_code == 201, rolled.text
    assert (rolled.json()["version"], rolled.json()["sha256"]) == (3, first["sha256"])

    # The registry's refusals reach the client as they are.
    bad = s.both(acme, "POST", "/v1/adapters/bot/rollback", json={"version": "one"})
    assert bad.status_code == 422
    missing = s.both(acme, "GET", "/v1/adapters/nope")
    assert missing.status_code == 404 and missing.json()["error"]["message"]
    # A method the registry does not serve on a path: its 405 and Allow, relayed.
    patch = s.call(acme, "PATCH", "/v1/adapters/bot")
    direct_patch = s.registry.call(acme, "PATCH", "/v1/adapters/bot")
    assert patch.status_code == direct_patch.status_code == 405
    assert patch.headers.get("allow") == direct_patch.headers.get("allow")

    # Another tenant's adapter does not exist for globex, through the gateway too.
    for method, path in (
        ("GET", "/v1/adapters/bot"),
        ("GET", "/v1/adapters/bot/download"),
        ("DELETE", "/v1/adapters/bot"),
        ("POST", "/v1/adapters/bot/rollback"),
    ):
        kwargs: dict[str, Any] = {"json": {"version": 1}} if method == "POST" else {}
        other = s.both(globex, method, path, **kwargs)  # refused: nothing changes
        assert other.status_code == 404, (method, path, other.text)
        assert "bot" in other.json()["error"]["message"]
    assert s.both(globex, "GET", "/v1/adapters").json()["items"] == []
    assert s.both(acme, "GET", "/v1/adapters/bot").json()["version"] == 3  # untouched

    gone = s.call(acme, "DELETE", "/v1/adapters/bot")
    assert gone.status_code == 204, gone.text
    assert s.both(acme, "GET", "/v1/adapters").json()["items"] == []


def test_an_oversize_adapter_upload_is_refused_before_the_registry_sees_it(
    stack: Callable[..., Stack],
) -> None:
    s = stack(max_upload_bytes=4096)
    acme = s.registry.tenant("acme")
    assert sum(len(part[1][1]) for part in _adapter(1)) > 4096  # the registry would take it
    for method, path, data in (
        ("POST", "/v1/adapters", {"name": "bot", "mode": "prefill"}),
        ("PUT", "/v1/adapters/bot", {}),
    ):
        refused = s.call(acme, method, path, data=data, files=_adapter(1))
        assert refused.status_code == 413, refused.text
        message = refused.json()["error"]["message"]
        assert "4096-byte limit" in message and "smaller adapter" in message
        assert "PREFT_" not in message
    assert s.registry.call(acme, "GET", "/v1/adapters").json()["items"] == []
    audit = s.registry.call(acme, "GET", "/v1/audit").json()["data"]
    assert [e for e in audit if e["action"].startswith("adapter.")] == []
    # Under the limit, the same upload goes through (the limit, not the route, refused it).
    small = stack(max_upload_bytes=1 << 20)
    key = small.registry.tenant("acme")
    ok = small.call(
        key, "POST", "/v1/adapters", data={"name": "bot", "mode": "prefill"}, files=_adapter(1)
    )
    assert ok.status_code == 201, ok.text


def test_adapter_uploads_take_the_tenants_upload_slots(stack: Callable[..., Stack]) -> None:
    """A stalled adapter version holds one of its tenant's upload slots (as a stalled file
    upload does); over the share is a 429, other tenants' uploads go on."""
    s = stack(registry_tenant_uploads=1, upload_idle_timeout_s=20)
    acme, globex = s.registry.tenant("acme"), s.registry.tenant("globex")
    url = urlsplit(s.gateway)
    with socket.create_connection((url.hostname, url.port)) as stalled:
        stalled.sendall(
            (
                "PUT /v1/adapters/bot HTTP/1.1\r\nHost: gateway\r\n"
                f"Authorization: Bearer {acme}\r\n"
                "Content-Type: multipart/form-data; boundary=b0\r\n"
                "Content-Length: 100000\r\n\r\n--b0\r\n"
            ).encode()
        )
        deadline = time.monotonic() + 10
        while s.open_uploads() != 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        over = s.call(
            acme, "POST", "/v1/adapters", data={"name": "bot", "mode": "prefill"}, files=_adapter(1)
        )
        assert over.status_code == 429, over.text
        assert "at most 1 at once" in over.json()["error"]["message"]
        other = s.call(
            globex,
            "POST",
            "/v1/adapters",
            data={"name": "bot", "mode": "prefill"},
            files=_adapter(1),
        )
        assert other.status_code == 201, other.text
    assert s.registry.call(acme, "GET", "/v1/adapters").json()["items"] == []


def test_user_bindings_through_the_gateway_are_the_registrys(stack: Callable[..., Stack]) -> None:
    s = stack()
    acme, globex = s.registry.tenant("acme"), s.registry.tenant("globex")
    up = s.call(
        acme, "POST", "/v1/adapters", data={"name": "bot", "mode": "prefill"}, files=_adapter(1)
    )
    assert up.status_code == 201, up.text
    bound = s.call(acme, "PUT", "/v1/users/alice", json={"adapter": "bot"})
    assert bound.status_code == 200, bound.text
    assert bound.json() == s.registry.call(acme, "GET", "/v1/users/alice").json()
    assert s.both(acme, "GET", "/v1/users/alice").json()["adapter"] == "bot"
    assert [u["user"] for u in s.both(acme, "GET", "/v1/users").json()["items"]] == ["alice"]
    assert s.both(acme, "GET", "/v1/users", params={"adapter": "bot"}).status_code == 200

    # globex can neither see nor bind to acme's user or adapter.
    assert s.call(globex, "GET", "/v1/users/alice").status_code == 404
    assert s.call(globex, "DELETE", "/v1/users/alice").status_code == 404
    foreign = s.call(globex, "PUT", "/v1/users/alice", json={"adapter": "bot"})
    assert foreign.status_code == 404, foreign.text
    assert s.both(globex, "GET", "/v1/users").json()["items"] == []
    bad = s.both(acme, "PUT", "/v1/users/alice", json={"adapter": "no such/name"})
    assert bad.status_code in (400, 404, 422) and bad.json()["error"]["message"]

    assert s.call(acme, "DELETE", "/v1/users/alice").status_code == 204
    assert s.both(acme, "GET", "/v1/users/alice").status_code == 404


def test_keys_and_usage_through_the_gateway_are_the_registrys(
    stack: Callable[..., Stack],
) -> None:
    s = stack()
    acme, globex = s.registry.tenant("acme"), s.registry.tenant("globex")
    for key in (acme, globex):
        through, direct = (call(key, "GET", "/v1/keys") for call in (s.call, s.registry.call))
        assert through.status_code == direct.status_code, through.text
        assert _unused(through.json()) == _unused(direct.json())
        for params in ({}, {"by": "user"}, {"group_by": "hour", "by": "key"}, {"by": "week"}):
            s.both(key, "GET", "/v1/usage", params=params)
    mine = s.call(acme, "GET", "/v1/keys")
    if mine.status_code == 200:  # the registry serves a tenant's own keys
        ids = [k["key_id"] for k in mine.json()]
        assert ids == [acme.removeprefix("pft_").split(".")[0]]
        theirs = globex.removeprefix("pft_").split(".")[0]
        assert s.call(acme, "GET", f"/v1/keys/{theirs}").status_code == 404
        assert s.call(acme, "DELETE", f"/v1/keys/{theirs}").status_code == 404
        assert s.call(globex, "GET", f"/v1/keys/{theirs}").json()["key_id"] == theirs
    over = s.both(acme, "GET", "/v1/usage", params={"start": "2026-01-01", "by": "user"})
    assert over.status_code == 400 and "since/until" in over.json()["error"]["message"]
    # A gateway given no admin token serves none of the operator's routes.
    tenants = s.call(ADMIN_TOKEN, "GET", "/v1/tenants")
    assert (
        tenants.status_code == 501 and tenants.json()["error"]["code"] == "operator_not_configured"
    )
