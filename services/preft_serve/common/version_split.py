"""Which version of an adapter a user gets under its serving policy: the one function the
registry (``GET /v1/adapters/{name}/policy?user=``) and the gateway (every request) share.

A policy serves one version to everyone, or splits off a canary: a user sees the canary
version iff a stable hash of (adapter name, user id) falls under the canary's weight. The
hash is SHA-256 (not Python's salted ``hash``), so every gateway replica and the registry
agree, and a user keeps their version across requests and restarts. The comparison is a
threshold, so raising the weight only adds users to the canary: nobody who was in it
flips back while it grows.
"""

from __future__ import annotations

import enum
import hashlib
from decimal import Decimal, InvalidOperation

from preft_serve.common.registry_client.contract import AdapterRef

WEIGHT_DECIMALS = 4
SCALE = 10**WEIGHT_DECIMALS  # weights are whole multiples of 1 / SCALE


class Variant(enum.StrEnum):
    """Which part of the policy served a request (a bounded metric label)."""

    SERVING = "serving"  # the policy's version
    CANARY = "canary"  # the canary version, for a user inside its split
    PINNED = "pinned"  # ``name@version``: the client chose the version itself


def weight_units(weight: float | str) -> int:
    """``weight`` as whole 1/SCALE units; ValueError unless 0 < weight < 1 with at most
    WEIGHT_DECIMALS decimals."""
    try:
        exact = Decimal(str(weight))
    except InvalidOperation:
        raise ValueError(f"weight {str(weight)[:40]!r} is not a number") from None
    if not exact.is_finite() or not 0 < exact < 1:
        raise ValueError(f"weight {exact} must lie strictly between 0 and 1")
    units = exact * SCALE
    if units != units.to_integral_value():
        raise ValueError(f"weight {exact} has more than {WEIGHT_DECIMALS} decimals")
    return int(units)


def bucket(adapter: str, user: str) -> int:
    """The user's stable position in [0, 2**64) for this adapter (adapter names never
    contain ':', so the joined string is unambiguous)."""
    digest = hashlib.sha256(f"{adapter}:{user}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def in_canary(adapter: str, user: str, weight: float | str) -> bool:
    """Whether ``user`` is in the canary of ``adapter`` at ``weight`` (exact integer
    comparison: bucket / 2**64 < units / SCALE)."""
    return bool(bucket(adapter, user) * SCALE < weight_units(weight) << 64)


def pick(ref: AdapterRef, user: str | None) -> tuple[AdapterRef, Variant]:
    """The version of ``ref`` (an adapter resolved with its policy) that ``user`` gets;
    without a user id there is nothing to split on, so the policy's version."""
    canary = ref.canary
    if canary is None or user is None or not in_canary(ref.name, user, ref.canary_weight):
        return ref, Variant.SERVING
    return canary, Variant.CANARY
