"""Unpacking an uploaded adapter archive (.tar, .tar.gz/.tgz, .zip) safely.

Only regular files named like adapter files are extracted, both at the archive root or
both in one top-level folder. Links, devices, absolute paths and ``..`` are rejected before
anything is written; sizes are enforced on the bytes actually produced while decompressing
(never on header claims alone), and a compression ratio cap stops zip/gzip bombs. Metadata
is bounded before the archive libraries parse it: a zip's central directory by its end
record (``zipdir``), tar extension headers by their header blocks (``tarheaders``). Entry
names are quoted in messages through ``text.shown``, never in full.
"""

from __future__ import annotations

import logging
import lzma
import stat
import tarfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath
from typing import IO, Any

from preft_serve.adapters.format import CONFIG_FILE, WEIGHTS_FILE
from preft_serve.common.domain_errors import (
    InvalidRequest,
    TooLarge,
    Unavailable,
    UnsupportedFormat,
)
from preft_serve.common.text import clip, shown
from preft_serve.registry.tarheaders import BoundedTarInfo
from preft_serve.registry.transfers import hold_scratch
from preft_serve.registry.validation import UploadBounds
from preft_serve.registry.validation.weights import CONVERT_HINT
from preft_serve.registry.zipdir import check_zip_directory

logger = logging.getLogger(__name__)

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")
IGNORED = ("README.md", ".gitattributes")  # written by PEFT's save_pretrained; not stored
_RATIO_FLOOR = 1 << 20  # ratios only matter once output passes 1 MiB
_CHUNK = 1 << 20

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def is_archive(filename: str) -> bool:
    return filename.lower().endswith(ARCHIVE_SUFFIXES)


def file_role(basename: str) -> str:
    """Which adapter file an uploaded name is; rejects pickles and strangers with a hint."""
    if basename in (CONFIG_FILE, WEIGHTS_FILE):
        return basename
    if basename.lower().endswith(PICKLE_SUFFIXES):
        raise UnsupportedFormat(
            f"{clip(basename, 100)} is a pickle-based PyTorch file, which the registry never "
            f"loads; {CONVERT_HINT}"
        )
    raise InvalidRequest(
        f"unexpected file {shown(basename)}: an adapter is exactly {CONFIG_FILE} "
        f"and {WEIGHTS_FILE} (or one .tar.gz/.zip of a folder holding them)"
    )


def _place(folder: str) -> str:
    return f"in folder {shown(folder)}" if folder else "at the archive root"


class _Extractor:
    """Shared member checks and bounded copying for tar and zip."""

    def __init__(self, dest: Path, bounds: UploadBounds, compressed_size: int) -> None:
        self.dest = dest
        self.bounds = bounds
        self.compressed_size = max(compressed_size, 1)
        self.members = 0
        self.total_out = 0
        self.found: dict[str, Path] = {}
        self.folders: dict[str, str] = {}  # role -> top-level folder ("" = archive root)

    def count(self, name: str) -> None:
        self.members += 1
        if self.members > self.bounds.max_archive_members:
            raise InvalidRequest(
                f"archive has more than {self.bounds.max_archive_members} "
                f"entries; an adapter archive holds {CONFIG_FILE} and "
                f"{WEIGHTS_FILE}"
            )

    def role(self, name: str) -> tuple[str, str] | None:
        """Which adapter file this member is and its top-level folder ("" at the root);
        None: ignorable. Rejects unsafe paths."""
        if "\\" in name or name.startswith("/") or (len(name) > 1 and name[1] == ":"):
            raise InvalidRequest(
                f"archive entry {shown(name)} has an absolute or Windows path; use relative paths"
            )
        parts = [p for p in PurePosixPath(name).parts if p != "."]
        if ".." in parts:
            raise InvalidRequest(f"archive entry {shown(name)} points outside the archive ('..')")
        if not parts or parts[0] == "__MACOSX" or parts[-1].startswith("._"):
            return None
        if len(parts) > 2:
            raise InvalidRequest(
                f"archive entry {shown(name)} is nested too deeply; put the "
                "adapter files at the archive root or in one top-level folder"
            )
        base = parts[-1]
        if base in IGNORED:
            return None
        return file_role(base), parts[0] if len(parts) == 2 else ""

    def _check_folder(self, role: str, folder: str) -> None:
        for other, where in self.folders.items():
            if where != folder:
                raise InvalidRequest(
                    f"archive has {other} {_place(where)} and {role} "
                    f"{_place(folder)}; put both adapter files at the archive "
                    "root or both in one top-level folder"
                )
        self.folders[role] = folder

    def take(
        self, name: str, place: tuple[str, str], size: int, compressed: int, src: IO[bytes]
    ) -> None:
        role, folder = place
        if role in self.found:
            raise InvalidRequest(f"archive contains {role} more than once")
        self._check_folder(role, folder)
        limit = (
            self.bounds.max_config_bytes if role == CONFIG_FILE else (self.bounds.max_weights_bytes)
        )
        if size > limit:
            raise TooLarge(f"{role} in the archive is {size} bytes; the limit is {limit}")
        ratio_cap = self.bounds.max_compression_ratio
        if size > _RATIO_FLOOR and compressed and size / compressed > ratio_cap:
            raise InvalidRequest(
                f"archive entry {shown(name)} expands {size / compressed:.0f}x, "
                f"over the {ratio_cap:.0f}x limit (zip bomb?)"
            )
        path = self.dest / role
        written = 0
        with _StagingFile(path) as out:
            while chunk := src.read(_CHUNK):
                written += len(chunk)
                self.total_out += len(chunk)
                if written > min(limit, size):
                    raise TooLarge(
                        f"{role} in the archive expands beyond its declared "
                        f"size or the {limit}-byte limit"
                    )
                if (
                    self.total_out > _RATIO_FLOOR
                    and self.total_out / self.compressed_size > ratio_cap
                ):
                    raise InvalidRequest(f"archive expands more than {ratio_cap:.0f}x (zip bomb?)")
                out.write(chunk)
        self.found[role] = path


class _StagingFile:
    """A staging file whose own failures (disk full, too many open files) are the
    registry's 503, never the archive's 'corrupt' 400: the archive readers catch OSError
    from the archive, and a server path must not reach a tenant. Each write is counted
    against the transfer's scratch bytes first (``transfers.hold_scratch``)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> _StagingFile:
        try:
            self.out = open(self.path, "wb")
        except OSError as exc:
            raise _staging_failed(exc) from None
        return self

    def write(self, chunk: bytes) -> None:
        hold_scratch(len(chunk))
        try:
            self.out.write(chunk)
        except OSError as exc:
            raise _staging_failed(exc) from None

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        try:
            self.out.close()  # flushes the last buffered bytes: a full disk can show here
        except OSError as exc:
            if exc_type is None:  # an error already on its way is the one to report
                raise _staging_failed(exc) from None


def _staging_failed(exc: OSError) -> Unavailable:
    logger.error("upload staging failed: %s", exc)
    return Unavailable(
        "the registry could not stage this upload (its staging space is full or failing); "
        "retry shortly"
    )


def extract_archive(
    fileobj: IO[bytes], filename: str, dest: Path, bounds: UploadBounds
) -> dict[str, Path]:
    """Extract adapter files from an archive upload into ``dest``: role -> path."""
    fileobj.seek(0, 2)
    compressed_size = fileobj.tell()
    fileobj.seek(0)
    ex = _Extractor(dest, bounds, compressed_size)
    if filename.lower().endswith(".zip"):
        _zip(fileobj, ex)
    else:
        _tar(fileobj, ex)
    return ex.found


def _zip(fileobj: IO[bytes], ex: _Extractor) -> None:
    check_zip_directory(fileobj, ex.bounds.max_archive_members)  # before zipfile parses it
    try:
        archive = zipfile.ZipFile(fileobj)
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:
        raise InvalidRequest(f"upload is not a readable .zip archive: {clip(str(exc))}") from None
    with archive:
        for info in archive.infolist():
            ex.count(info.filename)
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise InvalidRequest(
                    f"archive entry {shown(info.filename)} is a symbolic link; "
                    "only regular files are allowed"
                )
            if info.is_dir():
                continue
            if info.flag_bits & 0x1:
                raise InvalidRequest(f"archive entry {shown(info.filename)} is encrypted")
            role = ex.role(info.filename)
            if role is None:
                continue
            try:
                with archive.open(info) as src:
                    ex.take(info.filename, role, info.file_size, info.compress_size, src)
            except NotImplementedError:
                raise InvalidRequest(
                    f"archive entry {shown(info.filename)} uses a compression "
                    "method this registry cannot read; use deflate or store "
                    "(zip's defaults)"
                ) from None
            except (
                zipfile.BadZipFile,
                EOFError,
                OSError,
                zlib.error,
                lzma.LZMAError,
                UnicodeDecodeError,
            ) as exc:
                raise InvalidRequest(
                    f"archive entry {shown(info.filename)} is corrupt: {clip(str(exc))}"
                ) from None


def _tar(fileobj: IO[bytes], ex: _Extractor) -> None:
    try:
        with tarfile.open(fileobj=fileobj, mode="r|*", tarinfo=BoundedTarInfo) as archive:
            for member in archive:
                ex.count(member.name)
                if member.issym() or member.islnk():
                    raise InvalidRequest(
                        f"archive entry {shown(member.name)} is a link; only "
                        "regular files are allowed"
                    )
                if member.isdir():
                    continue
                if not member.isreg():
                    raise InvalidRequest(
                        f"archive entry {shown(member.name)} is not a regular file"
                    )
                role = ex.role(member.name)
                if role is None:
                    if member.size > ex.bounds.max_config_bytes:
                        raise TooLarge(f"archive entry {shown(member.name)} is too large")
                    continue
                src = archive.extractfile(member)
                assert src is not None
                ex.take(member.name, role, member.size, 0, src)
    except tarfile.ReadError as exc:
        raise InvalidRequest(
            f"upload is not a readable .tar/.tar.gz archive, or it is corrupt or "
            f"truncated: {clip(str(exc))}"
        ) from None
    except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError) as exc:
        raise InvalidRequest(f"archive is corrupt or truncated: {clip(str(exc))}") from None


def copy_bounded(
    src: IO[bytes],
    dest: Path,
    limit: int,
    what: str,
    *,
    digest: Any = None,
    too_large: str | None = None,
    param: str | None = None,
) -> int:
    """Copy an uploaded part to ``dest``, failing as soon as it passes ``limit`` bytes
    (413 with ``too_large`` as the message, if given); ``digest`` (a hashlib object) sees
    every byte copied."""
    written = 0
    src.seek(0)
    with _StagingFile(dest) as out:
        while chunk := src.read(_CHUNK):
            written += len(chunk)
            if written > limit:
                raise TooLarge(
                    too_large or f"{what} is larger than the {limit}-byte limit", param=param
                )
            if digest is not None:
                digest.update(chunk)
            out.write(chunk)
    return written
