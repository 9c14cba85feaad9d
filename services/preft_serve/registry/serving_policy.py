"""An adapter's serving policy: which of its versions users get, and version states.

The policy lives in the adapter's Redis hash, where the gateway already reads it with one
lookup: the served version's fields (``version``, ``sha256``, ...) and, for a canary split,
a ``canary`` field (JSON of the canary version and its weight; ``common.version_split``
decides per user). Each version record in the history carries its ``state``: ``staged``
(stored, never served), ``serving`` (the policy's version or its canary) or ``retired``.
Records written before states existed have none; theirs is derived (served now: serving,
else retired, since every such version was served when it was uploaded).

A policy change is one WATCH/MULTI transaction over the adapter's hash and history that
also emits ``adapter.updated``, the event that drops the gateways' cached copy (as an
upload's hot swap does), so the change reaches every gateway at once.

Every policy answer carries an entity tag (:func:`policy_etag`: the served version and the
canary). A change sent with ``If-Match`` is made only while the policy is still the one
that tag names, checked inside the same transaction, so two people editing one policy
(a console tab and the CLI, say) cannot undo each other's change unseen: the later one gets
412 and reads the policy again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from preft_serve.common.domain_errors import (
    Conflict,
    InvalidRequest,
    NotFound,
    PreconditionFailed,
)
from preft_serve.common.objectstore import ObjectStore
from preft_serve.common.registry_client import EventType, RegistryEvent, RegistryKeys
from preft_serve.common.text import shown
from preft_serve.common.version_split import in_canary
from preft_serve.registry.evaluation import gate_refusal
from preft_serve.registry.events import queue_event
from preft_serve.registry.names import check_adapter_name, utcnow
from preft_serve.registry.policy_schemas import (
    CanaryOut,
    PolicyIn,
    PolicyOut,
    PolicyVersion,
    UserPick,
    VersionState,
)
from preft_serve.registry.txn import Redis, transact

# A version's fields, as stored in its history record and (for the served one) the hash.
VERSION_FIELDS = (
    "version",
    "sha256",
    "type",
    "rank",
    "mode",
    "base_model",
    "size_bytes",
    "created_at",
)
CANARY_FIELD = "canary"
LATEST_FIELD = "latest_version"  # the highest version number, staged ones included
_CANARY_REF_FIELDS = ("version", "sha256", "type", "mode", "rank", "base_model")


def latest_version(current: Mapping[str, str]) -> int:
    """The adapter's highest version number (hashes from before staging: the current one)."""
    return int(current.get(LATEST_FIELD) or current["version"])


def canary_of(current: Mapping[str, str]) -> dict[str, Any] | None:
    raw = current.get(CANARY_FIELD)
    return json.loads(raw) if raw else None


def served_versions(current: Mapping[str, str]) -> set[int]:
    """The versions users get now: the policy's and its canary's."""
    canary = canary_of(current)
    return {int(current["version"])} | ({int(canary["version"])} if canary else set())


def state_of(record: Mapping[str, Any], served: set[int]) -> VersionState:
    state = record.get("state")
    if state:
        return VersionState(state)
    return VersionState.SERVING if int(record["version"]) in served else VersionState.RETIRED


def next_state(record: Mapping[str, Any], before: set[int], after: set[int]) -> VersionState:
    """A record's state once the served versions go from ``before`` to ``after``: served
    versions are serving, versions no longer served retired, staged ones stay staged."""
    if int(record["version"]) in after:
        return VersionState.SERVING
    old = state_of(record, before)
    return VersionState.RETIRED if old is VersionState.SERVING else old


def queue_states(
    pipe: Any,
    versions_key: str,
    records: Mapping[int, dict[str, Any]],
    before: set[int],
    after: set[int],
) -> dict[int, dict[str, Any]]:
    """Queue the rewrites of the records whose state changes; every record as it will be."""
    updated = {}
    for version, record in records.items():
        new = next_state(record, before, after).value
        updated[version] = {**record, "state": new}
        if record.get("state") != new:
            pipe.hset(versions_key, str(version), json.dumps(updated[version]))
    return updated


def describe(current: Mapping[str, str]) -> str:
    """A policy for the audit log: ``v3:<sha>``, plus ``canary v4:<sha> weight 0.1``."""
    text = f"v{current['version']}:{current['sha256']}"
    canary = canary_of(current)
    if canary:
        text += f" canary v{canary['version']}:{canary['sha256']} weight {canary['weight']}"
    return text


def policy_etag(policy: PolicyOut) -> str:
    """The policy's entity tag (RFC 9110, strong): the same exactly while the served
    version and the canary (version and weight) are."""
    canary = policy.canary
    text = f"{policy.version}:{policy.sha256}"
    if canary is not None:
        text += f"|{canary.version}:{canary.sha256}:{canary.weight!r}"
    return '"' + hashlib.sha256(text.encode()).hexdigest()[:32] + '"'


def etag_matches(if_match: str, etag: str) -> bool:
    """Whether an ``If-Match`` value (``*`` or a comma-separated list of tags) allows a
    change of the resource tagged ``etag``. Weak tags never match (strong comparison)."""
    tags = [tag.strip() for tag in if_match.split(",")]
    return "*" in tags or etag in tags


@dataclasses.dataclass(frozen=True)
class PolicyChange:
    policy: PolicyOut
    before: str
    after: str
    changed: bool  # False: the policy already was this one, nothing written
    forced: str | None = None  # the evaluation gate's refusal that force=true overrode


class PolicyService:
    def __init__(
        self, client: Redis, keys: RegistryKeys, store: ObjectStore, events_maxlen: int
    ) -> None:
        self.redis, self.keys, self.store, self.maxlen = client, keys, store, events_maxlen

    def get(self, tenant: str, name: str, user: str | None = None) -> PolicyOut:
        check_adapter_name(name)
        pipe = self.redis.pipeline(transaction=True)  # one consistent snapshot
        pipe.hgetall(self.keys.adapter(tenant, name))
        pipe.hgetall(self.keys.versions(tenant, name))
        current, raw = pipe.execute()
        if not current:
            raise NotFound(f"adapter {shown(name)} does not exist")
        return _policy_out(name, current, _records(raw), user)

    def set(
        self,
        tenant: str,
        name: str,
        body: PolicyIn,
        force: bool = False,
        if_match: str | None = None,
    ) -> PolicyChange:
        """Serve ``body.version`` (and its canary); refuses versions that do not exist,
        whose content is gone, or a canary equal to the served version, changing nothing.
        A staged ``body.version`` of an adapter with an evaluation must have passed it
        (``registry.evaluation``) unless ``force``; a canary needs no evaluation. With
        ``if_match`` (an ``If-Match`` header) the policy must still carry one of its tags."""
        check_adapter_name(name)
        adapter_key = self.keys.adapter(tenant, name)
        versions_key = self.keys.versions(tenant, name)
        wanted = [body.version] + ([body.canary.version] if body.canary else [])
        if body.canary is not None and body.canary.version == body.version:
            raise InvalidRequest(
                f"the canary version {body.version} is the served version; name another "
                "version as the canary, or set canary to null"
            )
        self._check_content(tenant, name, wanted)

        def txn(pipe: Any) -> PolicyChange:
            current = pipe.hgetall(adapter_key)
            if not current:
                raise NotFound(f"adapter {shown(name)} does not exist")
            records = _records(pipe.hgetall(versions_key))
            for version in wanted:
                if version not in records:
                    raise NotFound(
                        f"adapter {shown(name)} has no version {version}; its versions are "
                        f"1 to {latest_version(current)}"
                    )
                sha = records[version]["sha256"]
                if not pipe.exists(self.keys.blob(sha)):
                    raise InvalidRequest(
                        f"the content of adapter {shown(name)} version {version} is no "
                        "longer registered; upload it again"
                    )
            # After the checks any request fails without a precondition (RFC 9110 13.2.1),
            # before the evaluation gate's.
            if if_match is not None:
                _check_precondition(name, if_match, _policy_out(name, current, records))
            serving = records[body.version]
            refusal = None
            if state_of(serving, served_versions(current)) is VersionState.STAGED:
                refusal = gate_refusal(name, current, serving)
            if refusal is not None and not force:
                raise Conflict(refusal, code="evaluation_required")
            after = {**current, **{f: str(serving[f]) for f in VERSION_FIELDS}}
            canary: dict[str, Any] | None = None
            if body.canary is not None:
                canary_rec = records[body.canary.version]
                canary = {f: str(canary_rec[f]) for f in _CANARY_REF_FIELDS}
                canary["weight"] = str(body.canary.weight)
                after[CANARY_FIELD] = json.dumps(canary)
            else:
                after.pop(CANARY_FIELD, None)
            before_text, after_text = describe(current), describe(after)
            if before_text == after_text:
                return PolicyChange(
                    _policy_out(name, current, records), before_text, after_text, False
                )
            now = utcnow()
            after["updated_at"] = now
            pipe.multi()
            pipe.hset(
                adapter_key,
                mapping={**{f: str(serving[f]) for f in VERSION_FIELDS}, "updated_at": now},
            )
            if canary is None:
                pipe.hdel(adapter_key, CANARY_FIELD)
            else:
                pipe.hset(adapter_key, CANARY_FIELD, json.dumps(canary))
            states = queue_states(
                pipe, versions_key, records, served_versions(current), served_versions(after)
            )
            queue_event(
                pipe,
                self.keys,
                RegistryEvent(
                    EventType.ADAPTER_UPDATED.value,
                    tenant,
                    adapter=name,
                    version=body.version,
                    sha256=str(serving["sha256"]),
                ),
                self.maxlen,
            )
            return PolicyChange(
                _policy_out(name, after, states), before_text, after_text, True, refusal
            )

        return transact(self.redis, txn, adapter_key, versions_key)

    def _check_content(self, tenant: str, name: str, versions: Iterable[int]) -> None:
        """Each version's blob is still in the object store (outside the transaction: a
        network call; blobs are never deleted while a version names them)."""
        raw = self.redis.hmget(self.keys.versions(tenant, name), [str(v) for v in versions])
        for version, record in zip(versions, raw, strict=True):
            if record is not None and not self.store.has_adapter(json.loads(record)["sha256"]):
                raise InvalidRequest(
                    f"the content of adapter {shown(name)} version {version} is no longer "
                    "in the object store; upload it again"
                )


def _check_precondition(name: str, if_match: str, policy: PolicyOut) -> None:
    if etag_matches(if_match, policy_etag(policy)):
        return
    canary = policy.canary
    split = f" with version {canary.version} to {canary.weight:g} of users" if canary else ""
    raise PreconditionFailed(
        f"the serving policy of adapter {shown(name)} changed since it was read (If-Match): "
        f"it now serves version {policy.version}{split}, and nothing was changed; read it "
        "again (GET the policy, whose ETag header is its current tag) and decide anew"
    )


def _records(raw: Mapping[str, str]) -> dict[int, dict[str, Any]]:
    return {int(v): json.loads(record) for v, record in raw.items()}


def _policy_out(
    name: str,
    current: Mapping[str, str],
    records: Mapping[int, dict[str, Any]],
    user: str | None = None,
) -> PolicyOut:
    served = served_versions(current)
    canary = canary_of(current)
    pick = None
    if user is not None:
        inside = canary is not None and in_canary(name, user, canary["weight"])
        pick = UserPick(
            user=user,
            version=int(canary["version"]) if inside and canary else int(current["version"]),
            variant="canary" if inside else "serving",
        )
    return PolicyOut(
        name=name,
        version=int(current["version"]),
        sha256=current["sha256"],
        canary=CanaryOut(
            version=int(canary["version"]),
            sha256=canary["sha256"],
            weight=float(canary["weight"]),
        )
        if canary
        else None,
        updated_at=current["updated_at"],
        versions=[
            PolicyVersion.model_validate({**r, "state": state_of(r, served)})
            for _, r in sorted(records.items())
        ],
        user=pick,
    )
