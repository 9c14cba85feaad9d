"""The registry's Redis contract: key layout, event format and the resolved records.

The registry service writes exactly what this module describes and the clients read it,
so both import it from here.

Names become parts of keys (``{ns}:tenant:{t}:adapter:{name}:users``), so the naming
rules live here too: no name may contain ``:`` or anything else that would let it address
another key (``adapter("t", "bot:users")`` would be bot's user set). :class:`RegistryKeys`
refuses such parts with :class:`InvalidKeyPart`; the registry checks names first, with
messages for people, and the clients treat an invalid name as one that does not exist.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from preft_serve.adapters.format import AdapterMode, AdapterType, is_digest
from preft_serve.common.key_roles import DEFAULT_ROLE, KeyRole, parse_role

# The current-version HASH fields a lookup reads (``adapter_created_at``: when the adapter's
# first version was written, ISO 8601 UTC; it survives later versions).
ADAPTER_FIELDS = (
    "version",
    "sha256",
    "type",
    "mode",
    "rank",
    "base_model",
    "adapter_created_at",
    # The serving policy's canary, JSON {version, sha256, type, mode, rank, base_model,
    # weight} or absent (common.version_split picks per user).
    "canary",
)

# fullmatch only: `$` would also accept a trailing newline.
_TENANT = re.compile(r"[a-z0-9][a-z0-9-]{1,62}")
_ADAPTER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_USER = re.compile(r"[A-Za-z0-9._@+=-]{1,128}")
_DAY = re.compile(r"[0-9]{8}")
# Fine-tuning ids (OpenAI's shapes): "file-" / "ftjob-" and 24 letters or digits.
_FILE_ID = re.compile(r"file-[A-Za-z0-9]{24}")
_JOB_ID = re.compile(r"ftjob-[A-Za-z0-9]{24}")


def is_tenant_name(name: str) -> bool:
    """2-63 lowercase letters, digits or '-', starting with a letter or digit."""
    return _TENANT.fullmatch(name) is not None


def is_adapter_name(name: str) -> bool:
    """1-64 letters, digits, '.', '_' or '-', starting with a letter or digit, no '..'."""
    return _ADAPTER.fullmatch(name) is not None and ".." not in name


PIN_SEPARATOR = "@"  # never in an adapter name, so "carol@2" is unambiguous


def split_pinned(model: str) -> tuple[str, int] | None:
    """``name@version`` (version 1 or more, plain digits) -> (name, version); None for
    anything else, a plain adapter name included."""
    name, sep, version = model.rpartition(PIN_SEPARATOR)
    if (
        not sep
        or not version.isascii()
        or not version.isdigit()
        or len(version) > 9
        or int(version) < 1
        or not is_adapter_name(name)
    ):
        return None
    return name, int(version)


def is_user_id(user: str) -> bool:
    """1-128 letters, digits or '.', '_', '@', '+', '=', '-'."""
    return _USER.fullmatch(user) is not None


# Usage hash fields per model (see RegistryKeys.usage) and how long a day's hash is kept.
USAGE_KINDS = ("requests", "prompt_tokens", "completion_tokens")
USAGE_TTL_S = 400 * 86400


def usage_field(model: str, kind: str) -> str:
    return f"{model}:{kind}"


def parse_usage(raw: Mapping[Any, Any]) -> dict[str, dict[str, int]]:
    """A day's usage hash as ``{model: {kind: count}}`` (every kind present, unknown or
    malformed fields skipped)."""
    found: dict[str, dict[str, int]] = {}
    for key, value in raw.items():
        field = key.decode() if isinstance(key, bytes) else str(key)
        model, _, kind = field.rpartition(":")
        if not model or kind not in USAGE_KINDS:
            continue
        try:
            count = int(value)
        except ValueError:
            continue
        found.setdefault(model, dict.fromkeys(USAGE_KINDS, 0))[kind] = count
    return found


def is_file_id(file_id: str) -> bool:
    """A fine-tuning file id: ``file-`` and 24 letters or digits."""
    return _FILE_ID.fullmatch(file_id) is not None


def is_job_id(job_id: str) -> bool:
    """A fine-tuning job id: ``ftjob-`` and 24 letters or digits."""
    return _JOB_ID.fullmatch(job_id) is not None


def _is_instance(instance: str) -> bool:
    return re.fullmatch(r"[0-9a-f]{32}", instance) is not None


def is_usage_day(day: str) -> bool:
    """A UTC day as eight digits, YYYYMMDD (the date itself is not checked)."""
    return _DAY.fullmatch(day) is not None


class InvalidKeyPart(ValueError):
    """A name that is not valid for its kind, so it cannot be part of a registry key."""


def _part(value: str, valid: Callable[[str], bool], kind: str) -> str:
    if not (isinstance(value, str) and valid(value)):
        shown = repr(value) if len(repr(value)) <= 100 else repr(value)[:100] + "…"
        raise InvalidKeyPart(f"invalid {kind} {shown}: it cannot be part of a registry key")
    return value


class RegistryKeys:
    """Every Redis key and channel the registry uses, under one namespace.

    Each name is checked against its kind's rule (:class:`InvalidKeyPart` otherwise), so
    no name can address another key.
    """

    def __init__(self, namespace: str = "preft") -> None:
        self.ns = namespace
        self.tenants = f"{namespace}:tenants"  # SET of tenant names
        self.events = f"{namespace}:events"  # STREAM of RegistryEvent fields
        self.channel = f"{namespace}:events:live"  # pub/sub: JSON RegistryEvent with id

    def tenant(self, tenant: str) -> str:  # HASH name, created_at
        return f"{self.ns}:tenant:{_part(tenant, is_tenant_name, 'tenant name')}"

    def tenant_rate_limits(self, tenant: str) -> str:  # HASH overrides (RATE_LIMIT_FIELDS)
        return f"{self.tenant(tenant)}:limits"

    def rate_limit(self, bucket: str, tenant: str, user: str | None = None) -> str:
        """HASH token bucket {t, ts} of the gateway's rate limiter. ``bucket``: tenant,
        user, tenant-tokens or user-tokens. ``user`` is any request's user id (at most 256
        characters, checked by the gateway), so it is not held to :func:`is_user_id`."""
        owner = _part(tenant, is_tenant_name, "tenant name")
        if user is not None:
            owner = f"{owner}:{user}"
        return f"{self.ns}:ratelimit:{bucket}:{owner}"

    def tenant_keys(self, tenant: str) -> str:  # HASH key_id -> JSON {key_id, hash, created_at}
        return f"{self.tenant(tenant)}:keys"

    def api_key(self, key_hash: str) -> str:
        """HASH tenant, key_id, and only where they are set: role (else admin) and expires
        (unix seconds)."""
        return f"{self.ns}:apikey:{_part(key_hash, is_digest, 'key hash')}"

    def key_use(self, tenant: str) -> str:
        """HASH key_id -> when the key last authenticated a request (ISO 8601 UTC, written
        at most once a minute per key). Use, like the usage counters, so it lives under
        ``usage:`` (``key_use`` has a '_', so it is no tenant name) with their TTL."""
        return f"{self.ns}:usage:key_use:{_part(tenant, is_tenant_name, 'tenant name')}"

    def adapters(self, tenant: str) -> str:  # ZSET (score 0) of adapter names, for paging
        return f"{self.tenant(tenant)}:adapters"

    def adapter_prefix(self, tenant: str) -> str:
        return f"{self.tenant(tenant)}:adapter:"

    def adapter(self, tenant: str, name: str) -> str:  # HASH current version (ADAPTER_FIELDS+)
        return f"{self.adapter_prefix(tenant)}{_part(name, is_adapter_name, 'adapter name')}"

    def versions(self, tenant: str, name: str) -> str:  # HASH version -> JSON version record
        return f"{self.adapter(tenant, name)}:versions"

    def adapter_users(self, tenant: str, name: str) -> str:  # SET of user ids bound to it
        return f"{self.adapter(tenant, name)}:users"

    def binding(self, tenant: str, user: str) -> str:  # STRING adapter name
        return f"{self.tenant(tenant)}:user:{_part(user, is_user_id, 'user id')}"

    def bound_users(self, tenant: str) -> str:  # STRING count of bindings (the tenant's cap)
        return f"{self.tenant(tenant)}:bound_users"

    def user_index(self, tenant: str) -> str:  # ZSET bound user ids, score 0: paged by id
        return f"{self.tenant(tenant)}:user_index"

    def user_index_complete(self, tenant: str) -> str:  # STRING when older bindings went in
        return f"{self.tenant(tenant)}:user_index_complete"

    def blob(self, sha256: str) -> str:  # HASH sha256 type mode rank base_model size_bytes gen
        return f"{self.ns}:blob:{_part(sha256, is_digest, 'content hash')}"

    def blob_deleting(self, sha256: str) -> str:  # STRING, while unreferenced content goes
        return f"{self.ns}:blobdeleting:{_part(sha256, is_digest, 'content hash')}"

    def blob_epoch(self, sha256: str) -> str:  # STRING, a new token at each such delete
        return f"{self.ns}:blobepoch:{_part(sha256, is_digest, 'content hash')}"

    def usage(self, tenant: str, day: str) -> str:
        """HASH of one tenant's usage on one UTC day (``day``: YYYYMMDD), written by the
        gateway: fields ``{model}:requests``, ``{model}:prompt_tokens`` and
        ``{model}:completion_tokens``, ``model`` being the adapter's (or the base model's)
        public name, so the field's last ``:`` separates the two."""
        return (
            f"{self.ns}:usage:{_part(tenant, is_tenant_name, 'tenant name')}:"
            f"{_part(day, is_usage_day, 'usage day')}"
        )

    def audit(self, tenant: str | None) -> str:
        """STREAM of one tenant's audit entries, or (None) the registry-wide one
        (``preft_serve.registry.audit``); outside ``tenant:<name>:*``, which a tenant's
        deletion removes."""
        if tenant is None:
            return f"{self.ns}:audit:all"
        return f"{self.ns}:audit:tenant:{_part(tenant, is_tenant_name, 'tenant name')}"

    # -- fine-tuning (preft_serve.registry.finetune) ---------------------------------------

    def tenant_files(self, tenant: str) -> str:  # ZSET file id by created_at ms (listing)
        return f"{self.tenant(tenant)}:files"

    def file(self, file_id: str) -> str:  # HASH file object fields + tenant, sha256
        return f"{self.ns}:file:{_part(file_id, is_file_id, 'file id')}"

    def file_blob_refs(self, sha256: str) -> str:  # SET file ids whose content is sha256
        return f"{self.ns}:fileblob:{_part(sha256, is_digest, 'content hash')}"

    def tenant_jobs(self, tenant: str) -> str:  # ZSET job id by created_at ms (listing)
        return f"{self.tenant(tenant)}:ftjobs"

    def tenant_active_jobs(self, tenant: str) -> str:  # ZSET its queued and running job ids
        return f"{self.tenant(tenant)}:ftjobs:active"

    def tenant_finished_jobs(self, tenant: str) -> str:  # ZSET its ended job ids by when (µs)
        return f"{self.tenant(tenant)}:ftjobs:finished"

    def tenant_finished_indexed(self, tenant: str) -> str:  # STRING when others last went in
        return f"{self.tenant(tenant)}:ftjobs:finished:complete"

    def tenant_pruned_jobs(self, tenant: str) -> str:  # ZSET deleted job ids by listing place
        return f"{self.tenant(tenant)}:ftjobs:pruned"

    def job(self, job_id: str) -> str:  # STRING JSON job record (incl. tenant, runner)
        return f"{self.ns}:ftjob:{_part(job_id, is_job_id, 'job id')}"

    def job_events(self, job_id: str) -> str:  # STREAM of the job's events
        return f"{self.job(job_id)}:events"

    @property
    def active_jobs(self) -> str:  # ZSET job id (queued or running) by created_at ms
        return f"{self.ns}:ftjobs:active"

    @property
    def active_jobs_by_tenant(self) -> str:  # STRING once tenant_active_jobs holds them all
        return f"{self.ns}:ftjobs:active:by_tenant"

    def runner_heartbeat(self, instance: str) -> str:  # STRING with a TTL: runner alive
        return f"{self.ns}:ftrunner:{_part(instance, _is_instance, 'runner instance')}"


class EventType(str, enum.Enum):
    """Kinds of change the registry publishes."""

    ADAPTER_UPDATED = "adapter.updated"  # new current version (incl. the first)
    ADAPTER_DELETED = "adapter.deleted"  # adapter and, if forced, its bindings are gone
    BINDING_UPDATED = "binding.updated"
    BINDING_DELETED = "binding.deleted"
    TENANT_CREATED = "tenant.created"
    API_KEY_CREATED = "apikey.created"
    API_KEY_REVOKED = "apikey.revoked"


@dataclasses.dataclass(frozen=True)
class RegistryEvent:
    """One change. ``id`` is its position in the event stream (the catch-up cursor)."""

    type: str
    tenant: str
    id: str = ""
    adapter: str | None = None
    user: str | None = None
    version: int | None = None
    sha256: str | None = None
    key_id: str | None = None
    ts: float = 0.0

    def fields(self) -> dict[str, str]:
        """Flat string fields as stored in the stream (``id`` is assigned by Redis)."""
        out = {"type": self.type, "tenant": self.tenant, "ts": f"{self.ts or time.time():.3f}"}
        for name in ("adapter", "user", "version", "sha256", "key_id"):
            value = getattr(self, name)
            if value is not None:
                out[name] = str(value)
        return out

    @classmethod
    def from_fields(cls, event_id: str, fields: Mapping[str, str]) -> RegistryEvent:
        version = fields.get("version")
        return cls(
            id=event_id,
            type=fields.get("type", ""),
            tenant=fields.get("tenant", ""),
            adapter=fields.get("adapter"),
            user=fields.get("user"),
            version=int(version) if version else None,
            sha256=fields.get("sha256"),
            key_id=fields.get("key_id"),
            ts=float(fields.get("ts", 0) or 0),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class AdapterRef:
    """What a request needs to run an adapter: its content hash and how to apply it."""

    tenant: str
    name: str
    version: int
    sha256: str
    type: AdapterType
    mode: AdapterMode
    rank: int
    base_model: str
    # Unix seconds when the adapter (its first version) was created; 0 if unknown. Left out
    # of equality, so a ref built without it still equals the same version read from Redis.
    created: int = dataclasses.field(default=0, compare=False)
    # The serving policy's canary: another version of this adapter for the users whose
    # stable hash falls under ``canary_weight`` (``common.version_split.pick``).
    canary: AdapterRef | None = None
    canary_weight: float = 0.0


@dataclasses.dataclass(frozen=True)
class BlobInfo:
    """Metadata of stored adapter content, enough for a worker to load it by hash alone."""

    sha256: str
    type: AdapterType
    mode: AdapterMode
    rank: int
    base_model: str
    size_bytes: int


@dataclasses.dataclass(frozen=True)
class ChangeBatch:
    """Events after a cursor. ``reset``: some were trimmed away, so rebuild all state."""

    events: list[RegistryEvent]
    cursor: str
    reset: bool


def stream_id_key(event_id: str) -> tuple[int, int]:
    """Sort key of a Redis stream id ``ms-seq``."""
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq or 0)


API_KEY_PREFIX = "pft_"


def hash_api_key(api_key: str) -> str:
    """How API keys are stored and looked up (``pft_<key_id>.<256-bit secret>``: no salt
    needed at that entropy, and one hash means one Redis lookup per request)."""
    return hashlib.sha256(api_key.encode()).hexdigest()


@dataclasses.dataclass(frozen=True, slots=True)
class KeyOwner:
    """Who a valid API key belongs to, its role, and when it expires (unix seconds; 0:
    never). Expiry is checked on every authentication, cached or not."""

    tenant: str
    key_id: str
    role: KeyRole = DEFAULT_ROLE
    expires: float = 0.0

    def expired(self, now: float) -> bool:
        return bool(self.expires) and now >= self.expires

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> KeyOwner:
        """A key's ``api_key`` HASH (see :meth:`RegistryKeys.api_key`): ``role`` and
        ``expires`` are written only when they say something (admin, no expiry otherwise)."""
        expires = fields.get("expires")
        return cls(
            fields["tenant"],
            fields["key_id"],
            parse_role(fields.get("role")),
            float(expires) if expires else 0.0,
        )
