"""Version states and the serving policy (GET/PUT /v1/adapters/{name}/policy): staged
uploads, promote, roll back, canary split; checked against what the registry's Redis holds
(what the gateway reads) and the audit log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from preft_serve.common.registry_client import RegistryClient, RegistryKeys
from tests.registry import factories
from tests.support.canary_split import in_canary as _in_canary
from tests.support.registry_api import error_message, upload


@pytest.fixture(scope="module")
def lora_dir3(base_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return factories.lora(base_model_dir, tmp_path_factory.mktemp("lora3"), seed=3)


def _put(
    client: TestClient, headers: dict[str, str], name: str, folder: Path, promote: bool
) -> Any:
    files = [
        ("files", (p.name, p.read_bytes(), "application/octet-stream"))
        for p in sorted(folder.iterdir())
    ]
    return client.put(
        f"/v1/adapters/{name}",
        params={"promote": str(promote).lower()},
        data={"mode": "prefill"},
        files=files,
        headers=headers,
    )


def _served(redis_url: str, namespace: str, name: str) -> Any:
    """What a gateway resolves the adapter to (the real client, no cache)."""
    reader = RegistryClient(redis_url, namespace=namespace, cache=False)
    try:
        return reader.resolve_adapter("acme", name)
    finally:
        reader.close()


def _states(policy: dict[str, Any]) -> dict[int, str]:
    return {v["version"]: v["state"] for v in policy["versions"]}


@pytest.fixture
def three_versions(client, acme, lora_dir, lora_dir2, lora_dir3) -> list[dict[str, Any]]:
    """bot: v1 served, v2 and v3 staged."""
    v1 = upload(client, acme, "bot", lora_dir).json()
    v2 = _put(client, acme, "bot", lora_dir2, promote=False)
    v3 = _put(client, acme, "bot", lora_dir3, promote=False)
    assert v2.status_code == v3.status_code == 201, v2.text
    return [v1, v2.json(), v3.json()]


def test_a_staged_upload_changes_nothing_users_get(
    client, acme, three_versions, redis_server, namespace, redis_client
):
    v1, v2, v3 = three_versions
    assert (v1["state"], v2["state"], v3["state"]) == ("serving", "staged", "staged")
    assert (v2["version"], v3["version"]) == (2, 3)
    ref = _served(redis_server, namespace, "bot")
    assert (ref.version, ref.sha256, ref.canary) == (1, v1["sha256"], None)
    detail = client.get("/v1/adapters/bot", headers=acme).json()
    assert detail["version"] == 1 and [v["version"] for v in detail["versions"]] == [1, 2, 3]
    policy = client.get("/v1/adapters/bot/policy", headers=acme).json()
    assert (policy["version"], policy["canary"]) == (1, None)
    assert _states(policy) == {1: "serving", 2: "staged", 3: "staged"}
    # No event for a staged version: gateways have nothing to drop.
    events = redis_client.xrange(RegistryKeys(namespace).events)
    assert [e[1].get("version") for e in events if e[1]["type"] == "adapter.updated"] == ["1"]


def test_default_upload_after_staged_ones_serves_the_next_number(
    client, acme, lora_dir, lora_dir2, lora_dir3, redis_server, namespace
):
    upload(client, acme, "bot", lora_dir)
    assert _put(client, acme, "bot", lora_dir2, promote=False).status_code == 201
    v3 = upload(client, acme, "bot", lora_dir3, method="PUT").json()
    assert (v3["version"], v3["state"]) == (3, "serving")
    assert _served(redis_server, namespace, "bot").version == 3
    policy = client.get("/v1/adapters/bot/policy", headers=acme).json()
    assert _states(policy) == {1: "retired", 2: "staged", 3: "serving"}
    # A new adapter's first version serves even when asked to stage.
    first = client.post(
        "/v1/adapters",
        params={"promote": "false"},
        data={"name": "solo", "mode": "prefill"},
        files=[
            ("files", (p.name, p.read_bytes(), "application/octet-stream"))
            for p in sorted(lora_dir.iterdir())
        ],
        headers=acme,
    )
    assert first.status_code == 201 and first.json()["state"] == "serving"
    assert _served(redis_server, namespace, "solo").version == 1


def test_promote_canary_and_roll_back_reach_the_reader_with_events(
    client, acme, three_versions, redis_server, namespace, redis_client
):
    v1, v2, v3 = three_versions
    keys = RegistryKeys(namespace)
    body = {"version": 2, "canary": {"version": 3, "weight": 0.25}}
    resp = client.put("/v1/adapters/bot/policy", json=body, headers=acme)
    assert resp.status_code == 200, resp.text
    policy = resp.json()
    assert (policy["version"], policy["sha256"]) == (2, v2["sha256"])
    assert policy["canary"] == {"version": 3, "sha256": v3["sha256"], "weight": 0.25}
    assert _states(policy) == {1: "retired", 2: "serving", 3: "serving"}
    assert client.get("/v1/adapters/bot/policy", headers=acme).json() == policy
    last = redis_client.xrevrange(keys.events, count=1)[0][1]
    assert (last["type"], last["adapter"], last["version"], last["sha256"]) == (
        "adapter.updated",
        "bot",
        "2",
        v2["sha256"],
    )
    ref = _served(redis_server, namespace, "bot")
    assert (ref.version, ref.sha256) == (2, v2["sha256"])
    assert ref.canary is not None and (ref.canary.version, ref.canary.sha256) == (3, v3["sha256"])
    assert ref.canary_weight == 0.25
    # The registry says which version a user gets, as the independent split does.
    for user in ("alice", "bob", "carol", "dave", "erin", "frank"):
        pick = client.get("/v1/adapters/bot/policy", params={"user": user}, headers=acme).json()
        want = 3 if _in_canary("bot", user, 0.25) else 2
        assert pick["user"] == {
            "user": user,
            "version": want,
            "variant": "canary" if want == 3 else "serving",
        }
        # ... and a bound user's binding names the version that user is served.
        bound = client.put(f"/v1/users/{user}", json={"adapter": "bot"}, headers=acme)
        assert bound.status_code == 200, bound.text
        for binding in (bound.json(), client.get(f"/v1/users/{user}", headers=acme).json()):
            assert (binding["version"], binding["sha256"], binding["variant"]) == (
                want,
                (v3 if want == 3 else v2)["sha256"],
                "canary" if want == 3 else "serving",
            )
    # Roll back: name the old version; no new version is written.
    back = client.put("/v1/adapters/bot/policy", json={"version": 1}, headers=acme).json()
    assert (back["version"], back["canary"]) == (1, None)
    assert _states(back) == {1: "serving", 2: "retired", 3: "retired"}
    assert len(back["versions"]) == 3
    ref = _served(redis_server, namespace, "bot")
    assert (ref.version, ref.sha256, ref.canary) == (1, v1["sha256"], None)
    # The convenience route promotes, and the old rollback route still adds a version.
    promoted = client.post("/v1/adapters/bot/versions/3/promote", headers=acme)
    assert promoted.status_code == 200 and promoted.json()["version"] == 3
    rolled = client.post("/v1/adapters/bot/rollback", json={"version": 1}, headers=acme)
    assert rolled.status_code == 201 and rolled.json()["version"] == 4
    final = client.get("/v1/adapters/bot/policy", headers=acme).json()
    assert _states(final) == {1: "retired", 2: "retired", 3: "retired", 4: "serving"}
    assert _served(redis_server, namespace, "bot").sha256 == v1["sha256"]


def test_an_upload_that_promotes_ends_the_canary(
    client, acme, three_versions, lora_dir, redis_server, namespace
):
    body = {"version": 1, "canary": {"version": 2, "weight": 0.5}}
    assert client.put("/v1/adapters/bot/policy", json=body, headers=acme).status_code == 200
    back = client.post("/v1/adapters/bot/rollback", json={"version": 3}, headers=acme).json()
    assert back["version"] == 4
    policy = client.get("/v1/adapters/bot/policy", headers=acme).json()
    assert (policy["version"], policy["canary"]) == (4, None)
    assert _states(policy) == {1: "retired", 2: "retired", 3: "staged", 4: "serving"}
    assert _served(redis_server, namespace, "bot").canary is None


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"version": 9}, 404, "adapter 'bot' has no version 9; its versions are 1 to 3"),
        ({"version": 1, "canary": {"version": 7, "weight": 0.1}}, 404, "has no version 7"),
        ({"version": 2, "canary": {"version": 2, "weight": 0.1}}, 400, "is the served version"),
        ({"version": 1, "canary": {"version": 2, "weight": 0}}, 422, "greater than 0"),
        ({"version": 1, "canary": {"version": 2, "weight": 1}}, 422, "less than 1"),
        ({"version": 1, "canary": {"version": 2, "weight": 0.12345}}, 422, "more than 4 decimals"),
        ({"version": 1, "canary": {"version": 2}}, 422, "weight"),
        ({"version": 0}, 422, "greater than or equal to 1"),
        ({"version": 1, "extra": True}, 422, "extra"),
    ],
)
def test_bad_policies_are_refused_and_change_nothing(
    client, acme, three_versions, state_snapshot, body, status, says
):
    before = state_snapshot()
    resp = client.put("/v1/adapters/bot/policy", json=body, headers=acme)
    assert resp.status_code == status, resp.text
    assert says in error_message(resp)
    assert state_snapshot() == before


def test_a_version_whose_content_is_gone_is_refused(
    client, acme, three_versions, s3, bucket, state_snapshot
):
    v2 = three_versions[1]
    for obj in s3.list_objects_v2(Bucket=bucket)["Contents"]:
        if v2["sha256"] in obj["Key"]:
            s3.delete_object(Bucket=bucket, Key=obj["Key"])
    before = state_snapshot()
    resp = client.put("/v1/adapters/bot/policy", json={"version": 2}, headers=acme)
    assert resp.status_code == 400
    assert "version 2 is no longer in the object store" in error_message(resp)
    assert state_snapshot() == before


def test_another_tenant_can_neither_read_nor_set_the_policy(
    client, acme, new_tenant, three_versions, state_snapshot
):
    other = new_tenant("globex")
    before = state_snapshot()
    assert client.get("/v1/adapters/bot/policy", headers=other).status_code == 404
    resp = client.put("/v1/adapters/bot/policy", json={"version": 2}, headers=other)
    assert resp.status_code == 404 and "adapter 'bot' does not exist" in error_message(resp)
    assert client.post("/v1/adapters/bot/versions/2/promote", headers=other).status_code == 404
    assert state_snapshot() == before
    assert client.get("/v1/adapters/bot/policy").status_code == 401


def test_policy_changes_are_audited_with_before_and_after(client, acme, three_versions):
    v1, v2, v3 = (f"v{v['version']}:{v['sha256']}" for v in three_versions)
    body = {"version": 2, "canary": {"version": 3, "weight": 0.1}}
    client.put("/v1/adapters/bot/policy", json=body, headers=acme)
    client.put("/v1/adapters/bot/policy", json=body, headers=acme)  # unchanged: no entry
    client.post("/v1/adapters/bot/versions/1/promote", headers=acme)
    entries = client.get("/v1/audit", headers=acme).json()["data"]
    summary = [(e["action"], e["target"], e["before"], e["after"]) for e in entries[1:]]
    assert entries[0]["action"] == "tenant.create"
    assert summary == [
        ("adapter.upload", "bot", None, v1),
        ("adapter.version", "bot", None, f"{v2} staged"),
        ("adapter.version", "bot", None, f"{v3} staged"),
        ("adapter.policy", "bot", v1, f"{v2} canary {v3} weight 0.1"),
        ("adapter.policy", "bot", f"{v2} canary {v3} weight 0.1", v1),
    ]


def test_records_written_before_states_existed_read_as_served_or_retired(
    client, acme, lora_dir, lora_dir2, redis_client: redis.Redis, namespace
):
    upload(client, acme, "bot", lora_dir)
    upload(client, acme, "bot", lora_dir2, method="PUT")
    keys = RegistryKeys(namespace)
    for version, raw in redis_client.hgetall(keys.versions("acme", "bot")).items():
        record = json.loads(raw)
        record.pop("state")
        redis_client.hset(keys.versions("acme", "bot"), version, json.dumps(record))
    redis_client.hdel(keys.adapter("acme", "bot"), "latest_version")
    policy = client.get("/v1/adapters/bot/policy", headers=acme).json()
    assert _states(policy) == {1: "retired", 2: "serving"}
    back = client.put("/v1/adapters/bot/policy", json={"version": 1}, headers=acme).json()
    assert _states(back) == {1: "serving", 2: "retired"}


def test_the_policy_routes_are_in_the_openapi_document(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert {"get", "put"} <= set(paths["/v1/adapters/{name}/policy"])
    assert "post" in paths["/v1/adapters/{name}/versions/{version}/promote"]
    params = {p["name"] for p in paths["/v1/adapters/{name}"]["put"]["parameters"]}
    assert {"promote", "strict"} <= params


def test_a_change_sent_with_a_stale_etag_is_refused_and_changes_nothing(
    client, acme, three_versions, state_snapshot
):
    """Two editors read the same policy; the second one's change, made on what it read,
    must not silently undo the first one's."""
    read = client.get("/v1/adapters/bot/policy", headers=acme)
    etag = read.headers["etag"]
    assert etag.startswith('"') and etag.endswith('"')
    first = client.put(
        "/v1/adapters/bot/policy",
        json={"version": 1, "canary": {"version": 2, "weight": 0.2}},
        headers={**acme, "If-Match": etag},
    )
    assert first.status_code == 200, first.text
    assert first.headers["etag"] != etag
    assert read.headers["cache-control"] == first.headers["cache-control"] == "no-store"
    assert (
        client.get("/v1/adapters/bot/policy", headers=acme).headers["etag"]
        == (first.headers["etag"])
    )
    before = state_snapshot()
    entries = len(client.get("/v1/audit", headers=acme).json()["data"])
    for stale in (
        client.put(
            "/v1/adapters/bot/policy",
            json={"version": 1, "canary": {"version": 3, "weight": 0.5}},
            headers={**acme, "If-Match": etag},
        ),
        client.post("/v1/adapters/bot/versions/3/promote", headers={**acme, "If-Match": etag}),
    ):
        assert stale.status_code == 412, stale.text
        assert stale.json()["error"]["code"] == "precondition_failed"
        assert error_message(stale) == (
            "the serving policy of adapter 'bot' changed since it was read (If-Match): it now "
            "serves version 1 with version 2 to 0.2 of users, and nothing was changed; read "
            "it again (GET the policy, whose ETag header is its current tag) and decide anew"
        )
    assert state_snapshot() == before
    assert len(client.get("/v1/audit", headers=acme).json()["data"]) == entries
    # The current tag (or "*", or a list holding it) lets the change through.
    current = first.headers["etag"]
    for if_match in (f'"nope", {current}', "*"):
        ok = client.post(
            "/v1/adapters/bot/versions/3/promote", headers={**acme, "If-Match": if_match}
        )
        assert ok.status_code == 200, ok.text
        client.post("/v1/adapters/bot/versions/1/promote", headers=acme)
    # A weak tag never matches, and an oversize header is refused before it is read.
    weak = client.post(
        "/v1/adapters/bot/versions/3/promote",
        headers={
            **acme,
            "If-Match": "W/" + client.get("/v1/adapters/bot/policy", headers=acme).headers["etag"],
        },
    )
    assert weak.status_code == 412
    huge = client.post(
        "/v1/adapters/bot/versions/3/promote", headers={**acme, "If-Match": '"x"' * 400}
    )
    assert huge.status_code == 422 and "if-match" in huge.text.lower()
    assert client.get("/v1/adapters/bot/policy", headers=acme).json()["version"] == 1
