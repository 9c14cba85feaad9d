"""Property-based fuzzing of the registry's HTTP API from its own OpenAPI document.

schemathesis generates valid and invalid requests for every operation the registry
documents (its phases: schema examples, coverage of boundaries and of each constraint
broken in turn, then random generation), sent over real HTTP to the registry app under
uvicorn, on the session's real Redis server and a local-directory object store (the S3
backend is covered by tests/registry; listing moto's bucket twice per case cost 3/4 of
the run). Two tenants (``acme``,
``globex``) each have adapters, a spare key and bound users; admin routes get the admin
token, tenant routes one of the two tenants' keys. About half of the path parameters and
body names are steered to names that exist (so 2xx and 409 paths are reached, not only
404), and about half of the upload cases carry a real adapter's two files.

Every case: no 5xx; status, content type, headers and body as documented (schemathesis's
checks, plus every error in the one envelope); a 4xx leaves this registry's Redis keys
(byte for byte) and its object store exactly as they were. After a case that changed anything
the seed state is put back, so each case runs on the same state and reproduces alone.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi.checks import positive_data_acceptance

from preft_serve.common.objectstore import ObjectStoreSettings
from preft_serve.registry.app import create_app
from preft_serve.registry.settings import RegistrySettings
from tests.fuzz.support import (
    TALLY,
    TENANTS,
    RedisState,
    base_model,
    case_hash,
    diff,
    fuzz_settings,
    lora_files,
    steer,
    swap_in_key,
    upload_parts,
)
from tests.support.inprocess import serving

ADMIN_TOKEN = "fuzz-admin-0123456789abcdef"
UPLOADS = ("/v1/adapters", "/v1/adapters/{name}")
KEY_CREATE = ("/v1/keys", "/v1/tenants/{tenant}/keys")
POLICY = "/v1/adapters/{name}/policy"
PROMOTE = "/v1/adapters/{name}/versions/{version}/promote"
# Names that exist (or near misses), to steer generated ones to. Key ids are random: the
# fixture adds them.
KNOWN: dict[str, list[str]] = {
    "tenant": ["acme", "globex", "initech"],
    "key_id": ["0123456789ab"],
    "name": ["support-bot", "bot2", "nobody"],
    "user_id": ["alice", "bob", "carol", "dave"],
}


@dataclass
class Registry:
    url: str
    keys: dict[str, str]  # tenant -> API key
    adapters: dict[str, tuple[bytes, bytes]]  # label -> (config, weights)
    redis: RedisState
    objects: Path
    seed: dict[bytes, bytes] = field(default_factory=dict)
    seed_objects: dict[str, Any] = field(default_factory=dict)

    def restore_objects(self) -> None:
        """Put the seed's object store back (DELETE /v1/tenants deletes unshared blobs)."""
        shutil.rmtree(self.objects)
        shutil.copytree(self.objects.with_name("objects-seed"), self.objects)

    def snapshot(self) -> dict[str, Any]:
        files = {
            str(p.relative_to(self.objects)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in self.objects.rglob("*")
        }
        return {"redis": self.redis.snapshot(), "objects": files}


def _openapi() -> dict[str, Any]:
    """The registry's OpenAPI document, built without starting it (the fixture checks that
    the running registry serves the same one)."""
    return create_app(
        RegistrySettings.model_construct(admin_token=ADMIN_TOKEN, base_model=Path("."))
    ).openapi()


schema = schemathesis.openapi.from_dict(_openapi())


@schema.hook
def map_case(context: Any, case: Any) -> Any:
    """Steer names in the parts of the case that were generated valid (an invalid part must
    stay invalid: it is there to check that it is refused)."""
    if case.path_parameters and not case.meta.is_negative_at(ParameterLocation.PATH):
        for name, value in case.path_parameters.items():
            if name in KNOWN and (choice := steer(value, KNOWN[name])) is not None:
                case.path_parameters[name] = choice
    if isinstance(case.body, dict) and not case.meta.is_negative_at(ParameterLocation.BODY):
        known = (
            {"name": ["acme", "initech", "globex"]}
            if case.operation.path == "/v1/tenants"
            else {"adapter": KNOWN["name"], "name": KNOWN["name"]}
        )
        for name, choices in known.items():
            if isinstance(case.body.get(name), str) and (choice := steer(case.body[name], choices)):
                case.body[name] = choice
    return case


@schema.auth(refresh_interval=None, retry_on=[])
class Credentials:
    """The admin token on admin routes; one of the two tenants' keys (by the case's content)
    on tenant routes. Cases generated without credentials, or with broken ones, to check
    that they are refused, are not touched (schemathesis skips those)."""

    def get(self, case: Any, ctx: Any) -> str | None:
        security = ctx.operation.definition.raw.get("security") or []
        if any("AdminToken" in s for s in security):
            return ADMIN_TOKEN
        if any("TenantApiKey" in s for s in security):
            return f"@{TENANTS[case_hash(case) % 2]}"
        return None

    def set(self, case: Any, data: str | None, ctx: Any) -> None:
        if data is not None:
            case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@pytest.fixture(scope="module")
def registry(redis_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    root = tmp_path_factory.mktemp("fuzz-registry")
    adapters = {f"lora{seed}": lora_files(seed) for seed in (1, 2, 3)}
    namespace, objects = f"fz{uuid.uuid4().hex[:10]}", root / "objects"
    settings = RegistrySettings(
        admin_token=ADMIN_TOKEN,
        redis_url=redis_server,
        namespace=namespace,
        base_model=base_model(root / "model"),
        staging_dir=root,
        max_lora_rank=16,
        max_weights_bytes=4 << 20,
        max_upload_bytes=8 << 20,
        object_store=ObjectStoreSettings(url=str(objects)),
    )
    with serving(create_app(settings)) as url, httpx.Client(base_url=url, timeout=60) as http:
        assert http.get("/openapi.json").json() == _openapi()
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        keys = {}
        for tenant in TENANTS:
            made = http.post("/v1/tenants", json={"name": tenant}, headers=admin)
            spare = http.post(f"/v1/tenants/{tenant}/keys", headers=admin)
            assert made.status_code == spare.status_code == 201, (made.text, spare.text)
            keys[tenant] = made.json()["api_key"]
            KNOWN["key_id"] += [made.json()["key_id"], spare.json()["key_id"]]
        for tenant, method, path, data, label in [
            ("acme", "POST", "/v1/adapters", {"name": "support-bot", "mode": "prefill"}, "lora1"),
            ("acme", "PUT", "/v1/adapters/support-bot", {}, "lora2"),
            ("acme", "POST", "/v1/adapters", {"name": "bot2", "mode": "all"}, "lora3"),
            ("globex", "POST", "/v1/adapters", {"name": "support-bot", "mode": "prefill"}, "lora2"),
        ]:
            resp = http.request(
                method,
                path,
                data=data,
                files=upload_parts(*adapters[label]),
                headers={"Authorization": f"Bearer {keys[tenant]}"},
            )
            assert resp.status_code == 201, resp.text
        for tenant, user, adapter in (
            ("acme", "alice", "support-bot"),
            ("acme", "carol", "bot2"),
            ("globex", "bob", "support-bot"),
        ):
            resp = http.put(
                f"/v1/users/{user}",
                json={"adapter": adapter},
                headers={"Authorization": f"Bearer {keys[tenant]}"},
            )
            assert resp.status_code == 200, resp.text
        resp = http.put(
            "/v1/tenants/acme/limits", json={"tenant_rps": 5, "user_tpm": 1000}, headers=admin
        )
        assert resp.status_code == 200, resp.text
        reg = Registry(url, keys, adapters, RedisState(redis_server, namespace), objects)
        reg.seed = reg.redis.snapshot()
        shutil.copytree(objects, objects.with_name("objects-seed"))  # copy2 keeps mtimes
        reg.seed_objects = reg.snapshot()["objects"]
        yield reg
        reg.redis.restore({})


def _send_real_adapter(case: Any, registry: Registry, label: str) -> httpx.Response:
    """The case's own form fields with a real adapter's two files: reaches 201/200/409."""
    fields = {k: v for k, v in case.body.items() if k != "files" and isinstance(v, str)}
    with httpx.Client(timeout=30) as http:
        request = http.build_request(
            case.method,
            registry.url + case.formatted_path,
            data=fields,
            files=upload_parts(*registry.adapters[label]),
            headers=case.headers,
        )
        request.read()  # schemathesis's checks read the request body back
        return http.send(request)


@schema.parametrize()
@fuzz_settings()
def test_registry_api(case: Any, registry: Registry) -> None:
    swap_in_key(case, registry.keys)
    before = registry.snapshot()
    upload = case.operation.path in UPLOADS and case.method in ("POST", "PUT")
    # Whether uploaded bytes form a valid adapter is beyond any schema (safetensors headers,
    # shapes against the base model): a schema-valid upload may well be a 400/422.
    # Nor can a schema say that /v1/usage's start must be a real date, not after end and at
    # most 92 days before it (a 400 then).
    # Nor whether a fine-tuning file's lines are valid conversations (/v1/files: a 400),
    # nor that /v1/audit's since is a real time not after until (a 400), nor that a new
    # key's expires_at lies in the future and within bounds (the two key routes: a 400),
    # nor that a serving policy's canary differs from its version and its weight has at
    # most 4 decimals (a float's multipleOf is not exact: a 400/422), nor which ETag an
    # If-Match must name for a policy change to go through (any other: a 412).
    excluded = (
        [positive_data_acceptance]
        if case.operation.path
        in (*UPLOADS, "/v1/usage", "/v1/files", "/v1/audit", *KEY_CREATE, POLICY, PROMOTE)
        else []
    )
    label = [None, "lora1", "lora2", "lora3"][(case_hash(case) >> 1) % 4]
    if (
        upload
        and label
        and isinstance(case.body, dict)
        and not case.meta.is_negative_at(ParameterLocation.BODY)
    ):
        response = _send_real_adapter(case, registry, label)
        case.validate_response(response, excluded_checks=excluded)
    else:
        response = case.call_and_validate(
            base_url=registry.url, timeout=30, excluded_checks=excluded
        )
    TALLY[("registry", f"{case.method} {case.operation.path}", response.status_code)] += 1
    after = registry.snapshot()
    if 400 <= response.status_code < 500:
        assert after["redis"] == before["redis"], diff(before["redis"], after["redis"])
        assert after["objects"] == before["objects"], diff(before["objects"], after["objects"])
    if after["redis"] != registry.seed:
        registry.redis.restore(registry.seed)
    if after["objects"] != registry.seed_objects:
        registry.restore_objects()
