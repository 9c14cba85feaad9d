"""Bound users are listed a page at a time, by user id (``registry.user_index``): a page
reads what it returns, not every binding of the tenant, so listing a tenant with 100,000
users no longer reads them all in one Redis transaction. The index follows every binding,
unbinding and delete; bindings made before it existed are added the first time a tenant's
users are listed; an index entry whose binding is gone is never listed."""

from __future__ import annotations

import time
from typing import Any

from preft_serve.common.registry_client import RegistryKeys
from preft_serve.registry.user_index import RECHECK_S, SCAN_FACTOR
from tests.support.registry_api import create_tenant, upload


def _bind(client: Any, headers: dict[str, str], user: str, adapter: str) -> None:
    answer = client.put(f"/v1/users/{user}", json={"adapter": adapter}, headers=headers)
    assert answer.status_code == 200, answer.text


def _pages(client: Any, headers: dict[str, str], **params: Any) -> list[dict[str, Any]]:
    pages, cursor = [], None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        answer = client.get("/v1/users", params=query, headers=headers)
        assert answer.status_code == 200, answer.text
        pages.append(answer.json())
        cursor = pages[-1]["next_cursor"]
        if cursor is None:
            return pages


def test_a_page_past_many_removed_ids_ends_early_with_a_cursor(
    client, acme, lora_dir, redis_client, namespace
) -> None:
    keys = RegistryKeys(namespace)
    assert upload(client, acme, "a", lora_dir).status_code == 201
    _bind(client, acme, "zed", "a")
    client.get("/v1/users", headers=acme)
    ghosts = {f"ghost-{i:02d}": 0 for i in range(25)}  # ids whose bindings are gone
    redis_client.zadd(keys.user_index("acme"), ghosts)
    first = client.get("/v1/users", params={"limit": 2}, headers=acme).json()
    assert first == {"items": [], "next_cursor": "ghost-19"}  # read 2 x SCAN_FACTOR
    rest = client.get("/v1/users", params={"limit": 2, "cursor": "ghost-19"}, headers=acme)
    assert rest.json() == {"items": [{"user": "zed", "adapter": "a"}], "next_cursor": None}
    assert redis_client.zrange(keys.user_index("acme"), 0, -1) == ["zed"]


def test_pages_follow_user_ids_and_every_change(client, acme, lora_dir, lora_dir2) -> None:
    for name, folder in (("a", lora_dir), ("b", lora_dir2)):
        assert upload(client, acme, name, folder).status_code == 201
    users = {f"user-{i:02d}": "a" if i % 3 else "b" for i in range(25)}
    for user, adapter in users.items():
        _bind(client, acme, user, adapter)
    pages = _pages(client, acme, limit=10)
    assert [len(p["items"]) for p in pages] == [10, 10, 5]
    assert [p["next_cursor"] for p in pages] == ["user-09", "user-19", None]
    listed = [(b["user"], b["adapter"]) for p in pages for b in p["items"]]
    assert listed == sorted(users.items())

    _bind(client, acme, "user-01", "b")  # rebound: listed once, under its new adapter
    assert client.delete("/v1/users/user-02", headers=acme).status_code == 204
    assert client.delete("/v1/adapters/b?force=true", headers=acme).status_code == 204
    expected = {u: a for u, a in users.items() if a == "a" and u not in ("user-01", "user-02")}
    listed = [(b["user"], b["adapter"]) for p in _pages(client, acme, limit=7) for b in p["items"]]
    assert listed == sorted(expected.items())


def test_an_adapters_users_are_paged_with_bounded_reads(client, acme, lora_dir, lora_dir2) -> None:
    for name, folder in (("common", lora_dir), ("rare", lora_dir2)):
        assert upload(client, acme, name, folder).status_code == 201
    for i in range(40):
        _bind(client, acme, f"u{i:02d}", "rare" if i in (3, 38) else "common")
    pages = _pages(client, acme, limit=1, adapter="rare")
    # A page reads at most SCAN_FACTOR users per item asked for: between the two rare
    # users it ends early, empty, with a cursor; the last reads the one user after u38.
    assert SCAN_FACTOR == 10
    found = [[b["user"] for b in p["items"]] for p in pages]
    assert found == [["u03"], [], [], [], ["u38"], []]
    assert pages[1]["next_cursor"] == "u13"
    common = [
        b["user"] for p in _pages(client, acme, limit=15, adapter="common") for b in p["items"]
    ]
    assert common == [f"u{i:02d}" for i in range(40) if i not in (3, 38)]
    missing = client.get("/v1/users", params={"adapter": "nope"}, headers=acme)
    assert missing.status_code == 404


def test_bindings_made_before_the_index_are_listed(
    client, acme, lora_dir, redis_client, namespace
) -> None:
    keys = RegistryKeys(namespace)
    assert upload(client, acme, "a", lora_dir).status_code == 201
    for user in ("carol", "alice", "bob"):
        _bind(client, acme, user, "a")
    # As a registry from before the index left them: bindings and sets, no index.
    redis_client.delete(keys.user_index("acme"), keys.user_index_complete("acme"))
    pages = _pages(client, acme, limit=2)
    assert [[b["user"] for b in p["items"]] for p in pages] == [["alice", "bob"], ["carol"]]
    assert redis_client.get(keys.user_index_complete("acme")) is not None
    assert redis_client.zrange(keys.user_index("acme"), 0, -1) == ["alice", "bob", "carol"]


def test_bindings_an_older_registry_makes_later_are_listed(
    client, acme, lora_dir, lora_dir2, redis_client, namespace
) -> None:
    """During a rolling update a registry of the older version binds users without the
    index (and counts them): once the index holds fewer users than the count it is filled
    again, at most every RECHECK_S; a rebind puts a lost entry back at once."""
    keys = RegistryKeys(namespace)
    for name, folder in (("a", lora_dir), ("b", lora_dir2)):
        assert upload(client, acme, name, folder).status_code == 201
    _bind(client, acme, "alice", "a")
    client.get("/v1/users", headers=acme)  # the index is complete
    for user in ("dave", "erin"):  # as the older registry writes them
        redis_client.set(keys.binding("acme", user), "a")
        redis_client.sadd(keys.adapter_users("acme", "a"), user)
        redis_client.incr(keys.bound_users("acme"))

    def listed() -> list[str]:
        return [b["user"] for b in client.get("/v1/users", headers=acme).json()["items"]]

    assert listed() == ["alice"]  # filled again at most every RECHECK_S
    redis_client.set(keys.user_index_complete("acme"), str(time.time() - RECHECK_S - 1))
    assert listed() == ["alice", "dave", "erin"]
    redis_client.zrem(keys.user_index("acme"), "erin")  # an entry lost
    _bind(client, acme, "erin", "b")  # a rebind adds it back
    assert listed() == ["alice", "dave", "erin"]


def test_a_user_bound_while_a_page_reads_is_not_dropped(
    client, acme, lora_dir, redis_client, namespace, monkeypatch
) -> None:
    """A page drops ids whose binding it read as gone; the drop checks again, so a user
    bound between the read and the drop keeps its entry."""
    keys = RegistryKeys(namespace)
    assert upload(client, acme, "a", lora_dir).status_code == 201
    for user in ("alice", "bob"):
        _bind(client, acme, user, "a")
    client.get("/v1/users", headers=acme)
    registry_redis = client.app.state.registry.bindings.redis
    mget = registry_redis.mget

    def read_before_bob_was_bound(names: list[str]) -> list[str | None]:
        return [
            None if name == keys.binding("acme", "bob") else value
            for name, value in zip(names, mget(names), strict=True)
        ]

    monkeypatch.setattr(registry_redis, "mget", read_before_bob_was_bound)
    assert [b["user"] for b in client.get("/v1/users", headers=acme).json()["items"]] == ["alice"]
    monkeypatch.undo()
    assert redis_client.zrange(keys.user_index("acme"), 0, -1) == ["alice", "bob"]


def test_an_index_entry_without_a_binding_is_dropped(
    client, acme, lora_dir, redis_client, namespace
) -> None:
    """As a backfill racing an unbind can leave: the id is in the index, its binding gone."""
    keys = RegistryKeys(namespace)
    assert upload(client, acme, "a", lora_dir).status_code == 201
    for user in ("alice", "bob"):
        _bind(client, acme, user, "a")
    client.get("/v1/users", headers=acme)  # the index is complete
    redis_client.zadd(keys.user_index("acme"), {"ghost": 0})
    page = client.get("/v1/users", headers=acme).json()
    assert [b["user"] for b in page["items"]] == ["alice", "bob"]
    assert redis_client.zrange(keys.user_index("acme"), 0, -1) == ["alice", "bob"]


def test_bad_paging_parameters_are_refused(client, acme, state_snapshot) -> None:
    before = state_snapshot()
    for params, status, says in (
        ({"limit": 0}, 422, "limit: Input should be greater than or equal to 1"),
        ({"limit": 1001}, 422, "limit: Input should be less than or equal to 1000"),
        ({"cursor": "a/b"}, 400, "user id 'a/b' is invalid"),
        ({"cursor": "x" * 129}, 400, "is invalid: use 1-128 letters"),
    ):
        answer = client.get("/v1/users", params=params, headers=acme)
        assert answer.status_code == status, (params, answer.text)
        assert says in answer.json()["error"]["message"]
    assert state_snapshot() == before


def test_tenants_page_only_their_own_users(client, acme, lora_dir) -> None:
    beta = create_tenant(client, "beta")
    for headers in (acme, beta):
        assert upload(client, headers, "a", lora_dir).status_code == 201
    _bind(client, acme, "shared-id", "a")
    _bind(client, beta, "other", "a")
    assert [b["user"] for b in client.get("/v1/users", headers=beta).json()["items"]] == ["other"]
