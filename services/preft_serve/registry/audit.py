"""The audit log: who changed what in the registry, kept in Redis with bounded retention.

Every change a tenant or the operator makes through the API is recorded *after* it
committed, as one entry in two streams: the tenant's own (what its keys may read) and the
registry-wide one (what the operator reads). One Lua call appends both with the same id,
so an entry has one id, the pagination cursor, in either view. Both are trimmed on every
write to the newest ``max_entries`` (per tenant) / ``max_entries_all`` entries and to
``max_age_s``; reads also hide entries older than ``max_age_s``, so a quiet tenant's stale
entries are never served. The audit keys live outside the tenant's key prefix, so deleting
a tenant keeps the registry-wide record of what happened; its own stream starts over with
the deletion, so a tenant created again under that name cannot read its predecessor's log.

Recording never fails the change it describes: a Redis error is logged and counted
(``preft_registry_audit_write_failures_total``), and the change stands. The actor is the
caller's API key id (public: it names the key in listings and revocation, never the
secret) or ``operator`` for the admin token.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import re
from typing import Any

from prometheus_client import Counter

from preft_serve.common.audit_wire import AuditAction, AuditEntry, AuditPage
from preft_serve.common.domain_errors import InvalidRequest
from preft_serve.common.registry_client import RegistryKeys
from preft_serve.common.text import shown
from preft_serve.registry.names import check_tenant_name
from preft_serve.registry.settings import RegistrySettings

logger = logging.getLogger(__name__)

OPERATOR = "operator"
MAX_LIMIT = 500
DEFAULT_LIMIT = 100
# Entries one read looks at before it returns a partial page with a cursor (sparse
# actor/action filters stay cheap; the caller pages on).
MAX_SCAN = 5000
MAX_VALUE_CHARS = 512
ACTOR_PATTERN = r"^(operator|[0-9a-f]{12})$"
CURSOR_PATTERN = r"^[0-9]{1,15}-[0-9]{1,19}$"
# RFC 3339 (or a bare date), or unix seconds: the document's shape of since/until; the
# values themselves (a real date, since <= until) are checked by parse_time/build_query.
TIME_PATTERN = (
    r"^([0-9]{1,12}(\.[0-9]{1,9})?|[0-9]{4}-[0-9]{2}-[0-9]{2}"
    r"([Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?([Zz]|[+-][0-9]{2}:[0-9]{2}))?)$"
)
_ACTOR = re.compile(ACTOR_PATTERN)
_CURSOR = re.compile(CURSOR_PATTERN)
_UNIX = re.compile(r"^[0-9]{1,12}(\.[0-9]{1,9})?$")
_EARLIEST, _LATEST = 0, 253402300799  # 9999-12-31T23:59:59Z


@dataclasses.dataclass(frozen=True)
class AuditRetention:
    max_entries: int  # per tenant
    max_entries_all: int  # the registry-wide stream
    max_age_s: int


@dataclasses.dataclass(frozen=True)
class AuditQuery:
    """Validated filters: stream ids bound the range, actor/action are matched per entry."""

    tenant: str | None  # None: every tenant (the operator)
    start: str  # XRANGE start (inclusive, or exclusive with a leading '(')
    end: str  # XRANGE end (inclusive)
    actor: str | None
    action: AuditAction | None
    limit: int


# KEYS: the registry-wide stream, the tenant's. ARGV: caps (all, tenant), max age in
# seconds, reset ('1': empty the tenant's stream first), then field/value pairs.
_RECORD_LUA = """
if ARGV[4] == '1' then redis.call('DEL', KEYS[2]) end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', ARGV[1], '*', unpack(ARGV, 5))
redis.call('XADD', KEYS[2], 'MAXLEN', ARGV[2], id, unpack(ARGV, 5))
local now = redis.call('TIME')
local oldest = (tonumber(now[1]) - tonumber(ARGV[3])) * 1000
if oldest > 0 then
  redis.call('XTRIM', KEYS[1], 'MINID', oldest)
  redis.call('XTRIM', KEYS[2], 'MINID', oldest)
end
return id
"""


def _clip(value: str | None) -> str | None:
    if value is None:
        return None
    return value if len(value) <= MAX_VALUE_CHARS else value[: MAX_VALUE_CHARS - 1] + "…"


class AuditLog:
    @classmethod
    def for_settings(cls, client: Any, settings: RegistrySettings, failures: Counter) -> AuditLog:
        """The log as the settings size it (the routes' and the fine-tuning dispatcher's)."""
        retention = AuditRetention(
            settings.audit_max_entries, settings.audit_max_entries_all, settings.audit_max_age_s
        )
        return cls(client, RegistryKeys(settings.namespace), retention, failures)

    def __init__(
        self, client: Any, keys: RegistryKeys, retention: AuditRetention, failures: Counter
    ) -> None:
        self.redis = client
        self.keys = keys
        self.retention = retention
        self.failures = failures

    def record(
        self,
        tenant: str,
        actor: str,
        action: AuditAction,
        target: str,
        *,
        before: str | None = None,
        after: str | None = None,
        request_id: str | None = None,
        reset: bool = False,
    ) -> str | None:
        """Append one entry (after the change committed); returns its id, or None when the
        write failed, which is logged and counted but never raised."""
        fields = {
            "tenant": tenant,
            "actor": actor,
            "action": action.value,
            "target": target,
            "before": _clip(before),
            "after": _clip(after),
            "request_id": request_id,
        }
        args: list[str | int] = [
            self.retention.max_entries_all,
            self.retention.max_entries,
            self.retention.max_age_s,
            "1" if reset else "0",
        ]
        for name, value in fields.items():
            if value is not None:
                args += [name, value]
        try:
            entry_id: str = self.redis.eval(
                _RECORD_LUA, 2, self.keys.audit(None), self.keys.audit(tenant), *args
            )
        except Exception:
            self.failures.inc()
            logger.exception(
                "audit write failed (the change stands): %s %s %s by %s",
                tenant,
                action.value,
                target,
                actor,
            )
            return None
        return entry_id

    def query(self, q: AuditQuery) -> AuditPage:
        """One page, oldest first. Stops after ``MAX_SCAN`` entries even when fewer than
        ``limit`` matched, with a cursor to go on from."""
        key = self.keys.audit(q.tenant)
        start = max(q.start, self._oldest_kept(), key=_start_order)
        items: list[AuditEntry] = []
        scanned = 0
        batch = max(q.limit, 100)
        while True:
            found = self.redis.xrange(key, start, q.end, count=batch)
            for entry_id, fields in found:
                scanned += 1
                if (q.actor is None or fields.get("actor") == q.actor) and (
                    q.action is None or fields.get("action") == q.action.value
                ):
                    items.append(_entry(entry_id, fields))
                if len(items) == q.limit or scanned >= MAX_SCAN:
                    more = bool(self.redis.xrange(key, f"({entry_id}", q.end, count=1))
                    return AuditPage(data=items, next_cursor=entry_id if more else None)
            if len(found) < batch:
                return AuditPage(data=items, next_cursor=None)
            start = f"({found[-1][0]}"

    def _oldest_kept(self) -> str:
        seconds, _ = self.redis.time()
        return f"{max(0, seconds - self.retention.max_age_s) * 1000}-0"


def _start_order(start: str) -> tuple[int, int, int]:
    if start == "-":
        return 0, 0, 0
    exclusive = start.startswith("(")
    ms, _, seq = start.lstrip("(").partition("-")
    return int(ms), int(seq or 0), int(exclusive)


def _entry(entry_id: str, fields: dict[str, str]) -> AuditEntry:
    ms = int(entry_id.split("-")[0])
    time = dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")
    return AuditEntry(id=entry_id, time=time.replace("+00:00", "Z"), **fields)


def parse_time(value: str, param: str) -> float:
    """RFC 3339 (``2026-01-31T12:00:00Z``, an offset, or a date) or unix seconds."""
    if len(value) > 64:
        raise InvalidRequest(
            f"'{param}' is too long: give RFC 3339 time or unix seconds", param=param
        )
    if _UNIX.fullmatch(value):
        seconds = float(value)
    else:
        try:
            parsed = dt.datetime.fromisoformat(value.replace("z", "Z"))
        except ValueError:
            raise InvalidRequest(
                f"'{param}' {shown(value)} is not a time: give RFC 3339 "
                "(e.g. 2026-01-31T12:00:00Z) or unix seconds",
                param=param,
            ) from None
        if parsed.tzinfo is None:
            if "T" in value or " " in value:
                raise InvalidRequest(
                    f"'{param}' {shown(value)} has no time zone: end it "
                    "with Z or an offset such as +02:00",
                    param=param,
                )
            parsed = parsed.replace(tzinfo=dt.UTC)
        seconds = parsed.timestamp()
    if not _EARLIEST <= seconds <= _LATEST:
        raise InvalidRequest(f"'{param}' must lie between 1970 and 9999", param=param)
    return seconds


def build_query(
    *,
    tenant: str | None,
    since: str | None,
    until: str | None,
    actor: str | None,
    action: str | None,
    limit: int,
    after: str | None,
) -> AuditQuery:
    """Every filter checked before use; each bad one is a 400 naming what to send."""
    if tenant is not None:
        try:
            check_tenant_name(tenant)
        except InvalidRequest as exc:
            raise InvalidRequest(exc.message, param="tenant") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidRequest(f"'limit' must be 1 to {MAX_LIMIT}", param="limit")
    if actor is not None and not _ACTOR.fullmatch(actor):
        raise InvalidRequest(
            f"'actor' {shown(actor)} is not an actor: give an API key id "
            "(12 hex digits) or 'operator'",
            param="actor",
        )
    chosen = None
    if action is not None:
        try:
            chosen = AuditAction(action)
        except ValueError:
            raise InvalidRequest(
                f"'action' {shown(action)} is not recorded; use one of "
                f"{', '.join(a.value for a in AuditAction)}",
                param="action",
            ) from None
    if after is not None and not _CURSOR.fullmatch(after):
        raise InvalidRequest(
            f"'after' {shown(after)} is not a cursor: pass the next_cursor of the previous page",
            param="after",
        )
    first = parse_time(since, "since") if since is not None else None
    last = parse_time(until, "until") if until is not None else None
    if first is not None and last is not None and first > last:
        raise InvalidRequest(
            "'since' is after 'until': swap them or widen the range", param="since"
        )
    start = f"{int(first * 1000) + (first * 1000 % 1 > 0)}-0" if first is not None else "-"
    if after is not None:
        start = f"({after}" if start == "-" else max(start, f"({after}", key=_start_order)
    end = str(int(last * 1000)) if last is not None else "+"
    return AuditQuery(tenant=tenant, start=start, end=end, actor=actor, action=chosen, limit=limit)
