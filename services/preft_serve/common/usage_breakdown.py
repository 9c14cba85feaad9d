"""Redis layout of the usage breakdowns (per user, per API key, per UTC hour), written by
the gateway (``gateway.usage``) and read by the registry (``registry.usage``).

Beside the per day x model hash (``RegistryKeys.usage``), each request adds to:

- ``{usage}:{dimension}`` (``dimension`` user, key or version): the day's counts per user
  id / key id / served adapter version;
- ``{usage}:{HH}:{dimension}`` (``dimension`` model, user, key or version): the same per UTC
  hour,

``{usage}`` being the day's ``RegistryKeys.usage`` key, so every key holds ``:usage:``.
Fields are ``{name}:{kind}`` as in the day hash.

Bounds (so that a tenant sending a new user id per request cannot grow Redis without
limit): a user or key hash names at most ``NAMED_PER_BUCKET`` distinct users (keys): the
first ones seen in that day (hour) are counted exactly under their own name, every later
one under ``OTHER``. Requests that named no user are counted under ``NO_USER``. Both are
spelled with ``*``, which no user id, key id or model name contains. Model hashes are not
capped: a tenant's models are its adapters and the base model.

Version hashes count per adapter version that served (``{name}@{version}``; the base model
under its public name): beside the :data:`USAGE_KINDS`, the requests that ended in an error
(status 400 or more) after the version was chosen, and the time to first token of streamed
requests as a sum in microseconds and a count (so a reader can take the mean over any set of
buckets). Their names come from the registry (versions that exist), not from the client, so
they are bounded as the model hashes are and not capped. Hourly hashes are kept
``HOURLY_DAYS`` days (their TTL), day hashes ``USAGE_TTL_S`` as the day x model one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from preft_serve.common.registry_client import USAGE_KINDS, RegistryKeys

DIMENSIONS = ("model", "user", "key", "version")
CAPPED = ("user", "key")  # the dimensions whose names a tenant picks freely
NAMED_PER_BUCKET = 100
HOURLY_DAYS = 7
HOURLY_TTL_S = HOURLY_DAYS * 86_400
OTHER = "*other*"
NO_USER = "*none*"
VERSION_KINDS = (*USAGE_KINDS, "errors", "ttft_us_sum", "ttft_count")
NAMES_FIELD = "*named*"  # how many names the hash counts under their own name
_HOUR = re.compile(r"[0-9]{2}")
_KEY_ID = re.compile(r"[0-9a-f]{1,64}")

# Add one batch to a capped hash, atomically (several gateways write at once): a name the
# hash already counts, or a new one while fewer than the cap are counted, gets its own
# fields; any other name goes to OTHER. KEYS[1]: the hash; ARGV: cap, ttl, then
# name, kind, amount triples (each name's "requests" first: it marks the name as counted).
CAPPED_INCREMENT = """
local cap, other, none, named = tonumber(ARGV[1]), ARGV[3], ARGV[4], ARGV[5]
local admitted = {}
for i = 6, #ARGV, 3 do
  local name, kind, amount = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  if name ~= other and name ~= none then
    local known = admitted[name]
    if known == nil then
      if redis.call('HEXISTS', KEYS[1], name .. ':requests') == 1 then
        known = true
      elseif tonumber(redis.call('HGET', KEYS[1], named) or '0') < cap then
        redis.call('HINCRBY', KEYS[1], named, 1)
        known = true
      else
        known = false
      end
      admitted[name] = known
    end
    if not known then name = other end
  end
  redis.call('HINCRBY', KEYS[1], name .. ':' .. kind, amount)
end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
return 0
"""


def capped_args(cap: int, ttl_s: int, triples: list[tuple[str, str, int]]) -> list[str | int]:
    """ARGV of :data:`CAPPED_INCREMENT` for ``(name, kind, amount)`` triples."""
    ordered = sorted(triples, key=lambda t: (t[0], t[1] != "requests"))
    flat: list[str | int] = [cap, ttl_s, OTHER, NO_USER, NAMES_FIELD]
    for name, kind, amount in ordered:
        flat += [name, kind, amount]
    return flat


def day_key(keys: RegistryKeys, tenant: str, day: str, dimension: str) -> str:
    """The day's hash of ``dimension`` (``day``: YYYYMMDD); model: the day x model hash."""
    base = keys.usage(tenant, day)
    if dimension == "model":
        return base
    return f"{base}:{_dimension(dimension)}"


def hour_key(keys: RegistryKeys, tenant: str, hour: str, dimension: str) -> str:
    """The hour's hash of ``dimension`` (``hour``: YYYYMMDDHH, UTC)."""
    day, hh = hour[:8], hour[8:]
    if _HOUR.fullmatch(hh) is None or int(hh) > 23:
        raise ValueError(f"invalid usage hour {hour!r}: give YYYYMMDDHH")
    return f"{keys.usage(tenant, day)}:{hh}:{_dimension(dimension)}"


def parse_versions(raw: Mapping[Any, Any]) -> dict[str, dict[str, int]]:
    """A version hash as ``{name@version: {kind: count}}`` (every :data:`VERSION_KINDS`
    present; unknown or malformed fields skipped)."""
    found: dict[str, dict[str, int]] = {}
    for key, value in raw.items():
        field = key.decode() if isinstance(key, bytes) else str(key)
        name, _, kind = field.rpartition(":")
        if not name or kind not in VERSION_KINDS:
            continue
        try:
            count = int(value)
        except ValueError:
            continue
        found.setdefault(name, dict.fromkeys(VERSION_KINDS, 0))[kind] = count
    return found


def key_id_of(authorization: str | None) -> str | None:
    """The key id of an ``Authorization: Bearer pft_<key_id>.<secret>`` header (the id is
    public, part of the key itself); None when the header has no such shape."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.startswith("pft_"):
        return None
    key_id, dot, _ = token[4:].partition(".")
    return key_id if dot and _KEY_ID.fullmatch(key_id) else None


def _dimension(dimension: str) -> str:
    if dimension not in DIMENSIONS:
        raise ValueError(f"invalid usage dimension {dimension!r}")
    return dimension
