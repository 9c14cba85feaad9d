"""Local-directory object store: the embedded default for single-node and dev setups."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from preft_serve.common.objectstore.base import (
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
    ObjectStoreKind,
)


class LocalObjectStore(ObjectStore):
    """Objects are files under ``root``; puts go to a temp file, fsync, then rename."""

    kind = ObjectStoreKind.LOCAL

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser().resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"LocalObjectStore({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"invalid object key {key!r}")
        return self.root.joinpath(*parts)

    def _atomic_write(self, key: str, write: Callable[[BinaryIO], object]) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def put_file(self, key: str, path: Path) -> None:
        with open(path, "rb") as src:
            self._atomic_write(key, lambda dst: shutil.copyfileobj(src, dst, 1 << 20))

    def put_bytes(self, key: str, data: bytes) -> None:
        self._atomic_write(key, lambda dst: dst.write(data))

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise ObjectNotFound(key) from None

    def download_file(self, key: str, dest: Path) -> None:
        try:
            shutil.copyfile(self._path(key), dest)
        except FileNotFoundError:
            raise ObjectNotFound(key) from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def list_keys(self, prefix: str = "") -> Iterator[str]:
        for dirpath, _, filenames in os.walk(self.root):
            for name in filenames:
                if name.startswith(".tmp-"):
                    continue
                key = Path(dirpath, name).relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    yield key

    def check(self) -> None:
        if not os.access(self.root, os.W_OK):
            raise ObjectStoreError(f"object store directory {self.root} is not writable")
