"""The canary split restated independently of ``common.version_split``: a user is in an
adapter's canary iff SHA-256 of ``adapter:user``, its first 8 bytes as a fraction of 2**64,
falls under the weight. Tests compare what the product serves with this."""

from __future__ import annotations

import hashlib


def in_canary(adapter: str, user: str, weight: float) -> bool:
    head = hashlib.sha256(f"{adapter}:{user}".encode()).digest()[:8]
    return int.from_bytes(head, "big") / 2**64 < weight
