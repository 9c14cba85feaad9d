"""A tenant's API keys: their records, what a new key may be, and who is still admin.

A key is ``pft_<key_id>.<secret>``: the key id is public (it names the key in listings,
logs and revocation), the secret has 256 bits of entropy, so an unsalted hash is enough
and lets authentication be one Redis lookup. Two records per key:

- ``tenant_keys(t)`` field ``key_id``: JSON ``{key_id, hash, created_at}`` plus, where
  set, ``role``, ``name``, ``expires_at`` (RFC 3339) and ``created_by``, for listings;
- ``api_key(hash)``: HASH ``tenant, key_id`` plus ``role`` (when not admin) and
  ``expires`` (unix seconds), the one lookup authentication makes.

A record without a role is ``admin`` (the operator's keys, and keys from before roles).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import secrets
from collections.abc import Iterable, Mapping
from typing import Any

from preft_serve.common.domain_errors import InvalidRequest
from preft_serve.common.key_roles import DEFAULT_ROLE, KeyRole, parse_role
from preft_serve.common.registry_client import (
    API_KEY_PREFIX,
    EventType,
    RegistryEvent,
    RegistryKeys,
    hash_api_key,
)
from preft_serve.common.text import shown
from preft_serve.registry.events import queue_event
from preft_serve.registry.schemas import (
    KEY_MAX_TTL_S,
    KEY_MIN_TTL_S,
    KEY_NAME_MAX,
    KEY_ROLES,
    ApiKeyCreate,
    ApiKeyCreated,
    ApiKeyInfo,
)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._@-]{0,63}")  # schemas.KEY_NAME_PATTERN
_EXPIRES_AT_MAX = 64  # characters read before parsing
# An expired key's lookup record outlives its expiry by a day, so a caller is told it
# expired rather than that it is unknown; Redis then drops it.
LOOKUP_GRACE_S = 86400


@dataclasses.dataclass(frozen=True)
class KeySpec:
    """A checked request for a key."""

    role: KeyRole = DEFAULT_ROLE
    name: str | None = None
    expires: dt.datetime | None = None


def key_spec(body: ApiKeyCreate, now: dt.datetime) -> KeySpec:
    """``body`` checked: a known role, a valid name, one expiry in the future and in
    bounds. Raises :class:`InvalidRequest` saying what to fix."""
    if body.role not in KEY_ROLES:
        raise InvalidRequest(
            f"role {shown(body.role)} is unknown: use one of {', '.join(KEY_ROLES)}",
            param="role",
        )
    if body.name is not None and _NAME.fullmatch(body.name) is None:
        raise InvalidRequest(
            f"key name {shown(body.name)} is invalid: use 1-{KEY_NAME_MAX} letters, digits, "
            "spaces or '.', '_', '@', '-', starting with a letter or digit",
            param="name",
        )
    if body.expires_at is not None and body.ttl_s is not None:
        raise InvalidRequest("give expires_at or ttl_s, not both", param="expires_at")
    expires: dt.datetime | None = None
    if body.ttl_s is not None:
        if not KEY_MIN_TTL_S <= body.ttl_s <= KEY_MAX_TTL_S:
            raise InvalidRequest(
                f"ttl_s {body.ttl_s} is out of bounds: use {KEY_MIN_TTL_S} to "
                f"{KEY_MAX_TTL_S} seconds ({KEY_MAX_TTL_S // 86400} days)",
                param="ttl_s",
            )
        expires = now + dt.timedelta(seconds=body.ttl_s)
    elif body.expires_at is not None:
        expires = _expiry(body.expires_at, now)
    return KeySpec(KeyRole(body.role), body.name, expires)


def _expiry(raw: str, now: dt.datetime) -> dt.datetime:
    stamp: dt.datetime | None = None
    if len(raw) <= _EXPIRES_AT_MAX:
        try:
            stamp = dt.datetime.fromisoformat(raw)
        except ValueError:
            stamp = None
    if stamp is None or stamp.tzinfo is None:
        raise InvalidRequest(
            f"expires_at {shown(raw)} is not an RFC 3339 time with an offset: "
            "write it like 2027-01-31T12:00:00Z",
            param="expires_at",
        )
    ahead = (stamp - now).total_seconds()
    if ahead < KEY_MIN_TTL_S:
        raise InvalidRequest(
            f"expires_at {shown(raw)} is not in the future: give a time at least "
            f"{KEY_MIN_TTL_S} seconds from now ({_rfc3339(now)})",
            param="expires_at",
        )
    if ahead > KEY_MAX_TTL_S:
        raise InvalidRequest(
            f"expires_at {shown(raw)} is too far ahead: keys last at most "
            f"{KEY_MAX_TTL_S // 86400} days",
            param="expires_at",
        )
    return stamp.astimezone(dt.UTC)


def _rfc3339(stamp: dt.datetime) -> str:
    return stamp.astimezone(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def queue_key(
    pipe: Any,
    keys: RegistryKeys,
    maxlen: int,
    tenant: str,
    spec: KeySpec,
    created_by: str,
    created_at: str,
) -> ApiKeyCreated:
    """Queue a new key's records and event on a MULTI pipeline; the result carries the
    secret, the only time it exists outside the caller's hands."""
    key_id = secrets.token_hex(6)
    api_key = f"{API_KEY_PREFIX}{key_id}.{secrets.token_urlsafe(32)}"
    digest = hash_api_key(api_key)
    expires_at = _rfc3339(spec.expires) if spec.expires else None
    record: dict[str, Any] = {"key_id": key_id, "hash": digest, "created_at": created_at}
    lookup = {"tenant": tenant, "key_id": key_id}
    if spec.role is not DEFAULT_ROLE:
        record["role"] = lookup["role"] = spec.role.value
    if spec.name is not None:
        record["name"] = spec.name
    if spec.expires is not None:
        record["expires_at"] = expires_at
        lookup["expires"] = f"{spec.expires.timestamp():.3f}"
    record["created_by"] = created_by
    pipe.hset(keys.tenant_keys(tenant), key_id, json.dumps(record))
    pipe.hset(keys.api_key(digest), mapping=lookup)
    if spec.expires is not None:
        pipe.expireat(keys.api_key(digest), int(spec.expires.timestamp()) + LOOKUP_GRACE_S)
    queue_event(
        pipe, keys, RegistryEvent(EventType.API_KEY_CREATED.value, tenant, key_id=key_id), maxlen
    )
    return ApiKeyCreated(
        tenant=tenant,
        api_key=api_key,
        **key_info(record, None).model_dump(),
    )


def key_info(record: Mapping[str, Any], last_used_at: str | None) -> ApiKeyInfo:
    """A stored record as listed (no hash)."""
    return ApiKeyInfo(
        key_id=record["key_id"],
        created_at=record["created_at"],
        role=parse_role(record.get("role")).value,
        name=record.get("name"),
        expires_at=record.get("expires_at"),
        last_used_at=last_used_at,
        created_by=record.get("created_by"),
    )


def expired(record: Mapping[str, Any], now: dt.datetime) -> bool:
    raw = record.get("expires_at")
    return raw is not None and dt.datetime.fromisoformat(raw) <= now


def live_admins(records: Iterable[Mapping[str, Any]], now: dt.datetime) -> list[str]:
    """Key ids of the unexpired admin keys among ``records``."""
    return [
        r["key_id"]
        for r in records
        if parse_role(r.get("role")) is KeyRole.ADMIN and not expired(r, now)
    ]
