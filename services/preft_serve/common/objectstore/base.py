"""The object-store interface and the content-addressed adapter layout on top of it.

Blobs are immutable and named by content (``adapters/<sha256>/<file>``), so a write never
changes what an existing name means and every implementation only needs atomic
whole-object puts. The registry writes through :meth:`ObjectStore.put_adapter`; workers
read through :meth:`ObjectStore.fetch_adapter`, which re-computes the digest so a corrupt
or truncated download is never loaded.

Failures come in three kinds, and callers must not mix them up: :class:`ObjectNotFound`
(the store works, the key is absent: 404), :class:`StoreUnavailable` (the store itself
cannot be used: 503 and retry, never "not found") and :class:`BlobIntegrityError`.
"""

from __future__ import annotations

import abc
import enum
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

from preft_serve.adapters.format import CONFIG_FILE, WEIGHTS_FILE, file_digest, is_digest

ADAPTER_KEY_PREFIX = "adapters/"  # object keys; not the model-name prefix "sha256:"
ADAPTER_FILES = (CONFIG_FILE, WEIGHTS_FILE)


class ObjectStoreKind(str, enum.Enum):
    """Implementations, selectable by name in typed config."""

    LOCAL = "local"
    S3 = "s3"


class ObjectStoreError(RuntimeError):
    """The store could not complete an operation (unreachable, denied, misconfigured)."""


class StoreUnavailable(ObjectStoreError):
    """The store as a whole cannot serve requests right now: its directory is missing or is
    not a directory, access is denied, the endpoint does not answer, the bucket is gone.

    Never an answer about one key (that is :class:`ObjectNotFound`): callers answer 503 and
    retry, not 404. ``reason`` is safe to show to clients (no paths, hosts or errno text);
    ``str()`` adds the detail for the server log.
    """

    def __init__(self, reason: str, detail: object = None) -> None:
        super().__init__(f"{reason} ({detail})" if detail is not None else reason)
        self.reason = reason


class StoreFull(StoreUnavailable):
    """The store has no space left: an operator must free or add space (retrying soon will
    not help, so callers say so instead of "retry shortly")."""

    def __init__(self, detail: object = None) -> None:
        super().__init__("the object store is full", detail)


class ObjectNotFound(ObjectStoreError, KeyError):
    """No object under that key (the store itself is fine)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "object not found"


class BlobIntegrityError(ObjectStoreError):
    """Downloaded adapter files do not hash to the digest they are stored under."""


def adapter_key(sha256: str, filename: str) -> str:
    """Key of one adapter file: ``adapters/<sha256>/<filename>``."""
    if not is_digest(sha256):
        raise ValueError(f"not a lowercase hex sha256: {sha256!r}")
    if filename not in ADAPTER_FILES:
        raise ValueError(f"adapter file must be one of {ADAPTER_FILES} (got {filename!r})")
    return f"{ADAPTER_KEY_PREFIX}{sha256}/{filename}"


class ObjectStore(abc.ABC):
    """Flat key -> immutable bytes store. Implementations must make each put atomic."""

    kind: ClassVar[ObjectStoreKind]

    @abc.abstractmethod
    def put_file(self, key: str, path: Path) -> None:
        """Store the file's bytes under ``key`` (streamed, atomic: all or nothing)."""

    @abc.abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None:
        """Store small ``data`` under ``key`` (atomic)."""

    @abc.abstractmethod
    def get_bytes(self, key: str) -> bytes:
        """Whole object; raises :class:`ObjectNotFound` (or :class:`StoreUnavailable`)."""

    @abc.abstractmethod
    def download_file(self, key: str, dest: Path) -> None:
        """Stream the object to ``dest``; raises :class:`ObjectNotFound` (or
        :class:`StoreUnavailable`)."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """Whether ``key`` holds an object; an unusable store raises, never answers False."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is not an error."""

    @abc.abstractmethod
    def list_keys(self, prefix: str = "") -> Iterator[str]:
        """Keys starting with ``prefix``, in no particular order."""

    @abc.abstractmethod
    def check(self) -> None:
        """Raise :class:`StoreUnavailable` unless the store is reachable and usable."""

    # -- content-addressed adapters -------------------------------------------------------

    def has_adapter(self, sha256: str) -> bool:
        """Both files present (the config is written last, so it marks completeness)."""
        return all(self.exists(adapter_key(sha256, f)) for f in ADAPTER_FILES)

    def put_adapter(
        self, sha256: str, config_bytes: bytes, weights_path: Path, *, verify: bool = True
    ) -> bool:
        """Store an adapter under its digest; returns False if it was already complete.

        Weights go first and the config last, so a crash in between leaves an object that
        :meth:`has_adapter` reports as absent and the next upload completes. ``verify=False``
        skips re-hashing when the caller has just computed the digest from these bytes.
        """
        if verify and (actual := file_digest(config_bytes, weights_path)) != sha256:
            raise BlobIntegrityError(f"content hashes to {actual}, not {sha256}")
        if self.has_adapter(sha256):
            return False
        self.put_file(adapter_key(sha256, WEIGHTS_FILE), weights_path)
        self.put_bytes(adapter_key(sha256, CONFIG_FILE), config_bytes)
        return True

    def fetch_adapter(self, sha256: str, dest_dir: Path, *, verify: bool = True) -> Path:
        """Download an adapter into ``dest_dir`` (created) and check it hashes to ``sha256``.

        Files are written under temporary names and renamed only after verification, so a
        reader of ``dest_dir`` never sees a partial or corrupt adapter.
        """
        dest_dir = Path(dest_dir)
        dest_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=dest_dir, prefix=".fetch-") as tmp:
            tmp_dir = Path(tmp)
            config_bytes = self.get_bytes(adapter_key(sha256, CONFIG_FILE))
            (tmp_dir / CONFIG_FILE).write_bytes(config_bytes)
            self.download_file(adapter_key(sha256, WEIGHTS_FILE), tmp_dir / WEIGHTS_FILE)
            if verify:
                actual = file_digest(config_bytes, tmp_dir / WEIGHTS_FILE)
                if actual != sha256:
                    raise BlobIntegrityError(
                        f"adapter {sha256} in the object store hashes to {actual}; "
                        "the stored blob is corrupt"
                    )
            for name in (WEIGHTS_FILE, CONFIG_FILE):
                os.replace(tmp_dir / name, dest_dir / name)
        return dest_dir

    def delete_adapter(self, sha256: str) -> None:
        """Remove an adapter's files (config first, so it reads as absent at once)."""
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            self.delete(adapter_key(sha256, name))

    def list_adapters(self) -> Iterator[str]:
        """Digests of complete adapters."""
        suffix = "/" + CONFIG_FILE
        for key in self.list_keys(ADAPTER_KEY_PREFIX):
            if key.endswith(suffix):
                yield key[len(ADAPTER_KEY_PREFIX) : -len(suffix)]
