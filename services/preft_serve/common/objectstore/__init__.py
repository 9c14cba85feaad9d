"""Object stores behind one interface, chosen by URL.

``create_object_store("s3://bucket/prefix", endpoint_url=...)`` or
``create_object_store("/var/lib/preft/objects")`` (also ``file:///...``). Services put an
:class:`ObjectStoreSettings` in their own settings class and call ``.create()``.
A new backend is one module with an :class:`ObjectStore` subclass plus one
:func:`register_object_store` line here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

from pydantic import BaseModel, SecretStr

from preft_serve.common.objectstore.base import (
    ADAPTER_FILES,
    ADAPTER_KEY_PREFIX,
    BlobIntegrityError,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
    ObjectStoreKind,
    StoreFull,
    StoreUnavailable,
    adapter_key,
)
from preft_serve.common.objectstore.local import LocalObjectStore
from preft_serve.common.objectstore.s3 import S3ObjectStore

__all__ = [
    "ADAPTER_FILES",
    "ADAPTER_KEY_PREFIX",
    "BlobIntegrityError",
    "LocalObjectStore",
    "ObjectNotFound",
    "ObjectStore",
    "ObjectStoreError",
    "ObjectStoreKind",
    "ObjectStoreSettings",
    "S3ObjectStore",
    "StoreFull",
    "StoreUnavailable",
    "adapter_key",
    "create_object_store",
    "parse_store_url",
    "register_object_store",
]


class ObjectStoreSettings(BaseModel):
    """Typed object-store configuration to embed in a service's settings class."""

    url: str = "var/objects"
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_access_key_id: str | None = None
    s3_secret_access_key: SecretStr | None = None
    s3_create_bucket: bool = False
    # Local: make the directory (and parents) if missing, once, when the service starts;
    # never afterwards (a store that disappears later is an outage, not an empty store).
    local_create_root: bool = True

    @property
    def kind(self) -> ObjectStoreKind:
        return parse_store_url(self.url)[0]

    def create(self) -> ObjectStore:
        return create_object_store(
            self.url,
            endpoint_url=self.s3_endpoint_url,
            region=self.s3_region,
            access_key_id=self.s3_access_key_id,
            secret_access_key=(
                self.s3_secret_access_key.get_secret_value() if self.s3_secret_access_key else None
            ),
            create_bucket=self.s3_create_bucket,
            create_root=self.local_create_root,
        )


_Factory = Callable[..., ObjectStore]
_REGISTRY: dict[ObjectStoreKind, _Factory] = {}
# URL schemes that name each kind; a bare path (no scheme) means local.
_SCHEMES: dict[str, ObjectStoreKind] = {
    "file": ObjectStoreKind.LOCAL,
    "local": ObjectStoreKind.LOCAL,
    "s3": ObjectStoreKind.S3,
}


def register_object_store(kind: ObjectStoreKind, factory: _Factory) -> None:
    """Make ``kind`` constructible; ``factory(location, **options)`` builds the store."""
    _REGISTRY[kind] = factory


def _valid_names() -> str:
    return "local (a path or file:///path), s3 (s3://bucket[/prefix])"


def parse_store_url(url: str) -> tuple[ObjectStoreKind, str]:
    """(kind, location) of a store URL or bare kind name; unknown schemes list valid ones."""
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if not scheme or (len(scheme) == 1 and url[1:3] in (":\\", ":/")):  # bare or Windows path
        return ObjectStoreKind.LOCAL, url
    if scheme not in _SCHEMES:
        raise ValueError(f"unknown object store {scheme!r} in {url!r}; valid: {_valid_names()}")
    kind = _SCHEMES[scheme]
    if kind is ObjectStoreKind.LOCAL:
        return kind, (parsed.netloc + parsed.path) or "."
    return kind, parsed.netloc + parsed.path


def create_object_store(url: str | ObjectStoreKind, **options: object) -> ObjectStore:
    """Build the store named by ``url`` (``s3://b/p``, ``file:///p``, a path, or a kind).

    ``options`` go to the implementation (S3: endpoint_url, region, access_key_id,
    secret_access_key, create_bucket; local: create_root). Each implementation ignores the
    others' options. A local root is never created unless ``create_root=True``.
    """
    if isinstance(url, ObjectStoreKind):
        kind, location = url, ""
    elif url in {k.value for k in ObjectStoreKind}:
        kind, location = ObjectStoreKind(url), ""
    else:
        kind, location = parse_store_url(url)
    factory = _REGISTRY.get(kind)
    if factory is None:
        raise ValueError(f"object store {kind.value!r} is not available; valid: {_valid_names()}")
    return factory(location, **options)


def _local(location: str, *, create_root: bool = False, **_: object) -> ObjectStore:
    if not location:
        raise ValueError("local object store needs a directory, e.g. file:///var/lib/preft")
    return LocalObjectStore(Path(location), create=create_root)


def _s3(location: str, *, create_root: bool = False, **options: object) -> ObjectStore:
    bucket, _, prefix = location.partition("/")
    if not bucket:
        raise ValueError("s3 object store needs a bucket: s3://BUCKET[/prefix]")
    return S3ObjectStore(bucket, prefix=prefix, **options)  # type: ignore[arg-type]


register_object_store(ObjectStoreKind.LOCAL, _local)
register_object_store(ObjectStoreKind.S3, _s3)
