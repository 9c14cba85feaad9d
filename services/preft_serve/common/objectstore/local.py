"""Local-directory object store: the embedded default for single-node and dev setups.

The root directory is created only when asked (``create=True``, once, at a service's
start-up). After that a root that is missing (a moved or unmounted volume), is not a
directory, or cannot be accessed makes every operation raise :class:`StoreUnavailable`;
nothing recreates it, so uploads never land in an empty stand-in store that the real
volume later hides. A missing key under a healthy root is :class:`ObjectNotFound`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from preft_serve.common.objectstore.base import (
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
    ObjectStoreKind,
    StoreFull,
    StoreUnavailable,
)

# Client-safe reasons (StoreUnavailable.reason): no paths, no errno text.
_MISSING = "the object store directory is missing"
_NOT_A_DIR = "the object store path is not a directory"
_INACCESSIBLE = "the object store directory cannot be accessed"
_IO_ERROR = "the object store cannot be read or written"


class LocalObjectStore(ObjectStore):
    """Objects are files under ``root``; puts go to a temp file, fsync, then rename."""

    kind = ObjectStoreKind.LOCAL

    def __init__(self, root: str | Path, *, create: bool = False) -> None:
        self.root = Path(root).expanduser().resolve()
        if create:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreUnavailable(
                    _NOT_A_DIR if isinstance(exc, FileExistsError) else _INACCESSIBLE, exc
                ) from exc

    def __repr__(self) -> str:
        return f"LocalObjectStore({str(self.root)!r})"

    # -- failure classification -----------------------------------------------------------

    def _root_problem(self) -> str | None:
        """Why the root cannot be used (a client-safe reason), or None if it can."""
        try:
            mode = os.stat(self.root).st_mode
        except FileNotFoundError:
            return _MISSING
        except NotADirectoryError:  # a parent of the root is a file
            return _NOT_A_DIR
        except OSError:
            return _INACCESSIBLE
        return None if stat.S_ISDIR(mode) else _NOT_A_DIR

    def _error(self, key: str, exc: OSError, *, reading: bool) -> ObjectStoreError:
        """What ``exc`` from an operation on ``key`` means: the whole store is unavailable,
        or (reads only, root healthy) the key is absent."""
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return StoreFull(f"{self.root}: {exc.strerror or exc}")
        problem = self._root_problem()
        if problem is not None:
            return StoreUnavailable(problem, f"{self.root}: {exc.strerror or exc}")
        if reading and isinstance(exc, (FileNotFoundError, NotADirectoryError, IsADirectoryError)):
            return ObjectNotFound(key)
        return StoreUnavailable(_IO_ERROR, exc)

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"invalid object key {key!r}")
        return self.root.joinpath(*parts)

    # -- writes ---------------------------------------------------------------------------

    def _make_parents(self, path: Path) -> None:
        """Create the key's directories one level at a time below the root, so a missing
        root fails here instead of being recreated (``mkdir(parents=True)`` would)."""
        current = self.root
        for part in path.relative_to(self.root).parts[:-1]:
            current = current / part
            with contextlib.suppress(FileExistsError):
                os.mkdir(current)

    def _atomic_write(self, key: str, write: Callable[[BinaryIO], object]) -> None:
        path = self._path(key)
        try:
            self._make_parents(path)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        except OSError as exc:
            raise self._error(key, exc, reading=False) from exc
        try:
            with os.fdopen(fd, "wb") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except BaseException as exc:
            Path(tmp).unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise self._error(key, exc, reading=False) from exc
            raise

    def put_file(self, key: str, path: Path) -> None:
        with open(path, "rb") as src:  # the caller's file: its errors are not the store's
            self._atomic_write(key, lambda dst: shutil.copyfileobj(src, dst, 1 << 20))

    def put_bytes(self, key: str, data: bytes) -> None:
        self._atomic_write(key, lambda dst: dst.write(data))

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink()
        except (FileNotFoundError, NotADirectoryError) as exc:
            if (problem := self._root_problem()) is not None:
                raise StoreUnavailable(problem, f"{self.root}: {exc.strerror}") from exc
        except OSError as exc:
            raise self._error(key, exc, reading=False) from exc

    # -- reads ----------------------------------------------------------------------------

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except OSError as exc:
            raise self._error(key, exc, reading=True) from exc

    def download_file(self, key: str, dest: Path) -> None:
        with contextlib.ExitStack() as files:
            try:
                src = files.enter_context(open(self._path(key), "rb"))
            except OSError as exc:
                raise self._error(key, exc, reading=True) from exc
            # Errors writing ``dest`` (the caller's disk) stay plain OSErrors.
            dst = files.enter_context(open(dest, "wb"))
            shutil.copyfileobj(src, dst, 1 << 20)

    def exists(self, key: str) -> bool:
        try:
            return stat.S_ISREG(os.stat(self._path(key)).st_mode)
        except (FileNotFoundError, NotADirectoryError) as exc:
            if (problem := self._root_problem()) is not None:
                raise StoreUnavailable(problem, f"{self.root}: {exc.strerror}") from exc
            return False
        except OSError as exc:
            raise self._error(key, exc, reading=True) from exc

    def list_keys(self, prefix: str = "") -> Iterator[str]:
        self._require_root()

        def on_error(exc: OSError) -> None:
            # A directory deleted while walking is fine; anything else is an outage.
            if self._root_problem() is not None or not isinstance(exc, FileNotFoundError):
                raise self._error(prefix or ".", exc, reading=False) from exc

        for dirpath, _, filenames in os.walk(self.root, onerror=on_error):
            for name in filenames:
                if name.startswith(".tmp-"):
                    continue
                key = Path(dirpath, name).relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    yield key

    # -- health ---------------------------------------------------------------------------

    def _require_root(self) -> None:
        """Raise :class:`StoreUnavailable` unless the root is an existing directory."""
        if (problem := self._root_problem()) is not None:
            raise StoreUnavailable(problem, self.root)

    def check(self) -> None:
        self._require_root()
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise StoreUnavailable("the object store directory is not writable", self.root)
