"""Bounding a zip's central directory before :class:`zipfile.ZipFile` parses it.

``zipfile.ZipFile()`` reads the whole central directory into memory and builds a ZipInfo per
record when it opens an archive, so an entry cap checked afterwards comes too late: a
45 MiB upload listing a million one-byte entries held the registry for 12 s and ~300 MiB.
This module reads the end-of-central-directory record (and the zip64 one, if present) the
way ``zipfile`` finds them, and refuses an archive whose directory claims more entries, or
more bytes, than an adapter archive can need.

``zipfile`` reads as many records as the directory *size* holds, whatever the entry count
says, so both are checked.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import IO

from preft_serve.adapters.format import CONFIG_FILE, WEIGHTS_FILE
from preft_serve.common.domain_errors import InvalidRequest

# Central-directory bytes allowed per permitted entry: a 46-byte record plus its name,
# extra fields and comment (real adapter archives use ~100).
DIRECTORY_BYTES_PER_ENTRY = 4096

_END = struct.Struct("<4s4H2LH")  # end of central directory record
_END_SIG = b"PK\x05\x06"
_MAX_COMMENT = 0xFFFF
_LOCATOR = struct.Struct("<4sLQL")  # zip64 end of central directory locator
_LOCATOR_SIG = b"PK\x06\x07"
_END64 = struct.Struct("<4sQ2H2L4Q")  # zip64 end of central directory record
_END64_SIG = b"PK\x06\x06"
_WHAT = f"an adapter archive holds {CONFIG_FILE} and {WEIGHTS_FILE}"


@dataclasses.dataclass(frozen=True)
class DirectoryClaims:
    """What the end records say about the central directory."""

    entries: int  # the larger of "on this disk" and "in total"
    size: int  # bytes


def _read_at(fileobj: IO[bytes], offset: int, size: int) -> bytes:
    fileobj.seek(offset)
    return fileobj.read(size)


def _zip64_claims(fileobj: IO[bytes], end_at: int) -> DirectoryClaims | None:
    """Claims of the zip64 end record, if a locator precedes the end record.

    Python 3.11's zipfile reads the zip64 record just before the locator; newer versions
    follow the locator's offset. Both places are read and the larger claims kept.
    """
    if end_at < _LOCATOR.size:
        return None
    locator = _read_at(fileobj, end_at - _LOCATOR.size, _LOCATOR.size)
    sig, _, stated_at, _ = _LOCATOR.unpack(locator)
    if sig != _LOCATOR_SIG:
        return None
    found: list[DirectoryClaims] = []
    for at in {end_at - _LOCATOR.size - _END64.size, stated_at}:
        if 0 <= at <= end_at - _LOCATOR.size - _END64.size:
            record = _read_at(fileobj, at, _END64.size)
            if len(record) == _END64.size and record[:4] == _END64_SIG:
                fields = _END64.unpack(record)
                found.append(DirectoryClaims(max(fields[6], fields[7]), fields[8]))
    if not found:
        return None
    return DirectoryClaims(max(c.entries for c in found), max(c.size for c in found))


def directory_claims(fileobj: IO[bytes]) -> DirectoryClaims:
    """Read the end records of a zip (``fileobj`` seekable); InvalidRequest if there are none."""
    fileobj.seek(0, 2)
    file_size = fileobj.tell()
    tail_at = max(file_size - _END.size - _MAX_COMMENT, 0)
    tail = _read_at(fileobj, tail_at, file_size - tail_at)
    # zipfile's search: a comment-less record at the very end, else the last signature.
    if tail[-_END.size :][:4] == _END_SIG and tail[-2:] == b"\0\0":
        at = len(tail) - _END.size
    else:
        at = tail.rfind(_END_SIG)
    if at < 0 or len(tail) - at < _END.size:
        raise InvalidRequest(
            "upload is not a readable .zip archive: it has no end of central "
            "directory record (truncated, or not a zip)"
        )
    fields = _END.unpack(tail[at : at + _END.size])
    zip64 = _zip64_claims(fileobj, tail_at + at)
    if zip64 is not None:
        return zip64
    return DirectoryClaims(max(fields[3], fields[4]), fields[5])


def check_zip_directory(fileobj: IO[bytes], max_entries: int) -> None:
    """Refuse a zip whose central directory is bigger than ``max_entries`` can need."""
    claims = directory_claims(fileobj)
    fileobj.seek(0)
    if claims.entries > max_entries:
        raise InvalidRequest(
            f"archive has more than {max_entries} entries (its zip central "
            f"directory lists {claims.entries}); {_WHAT}"
        )
    cap = max_entries * DIRECTORY_BYTES_PER_ENTRY
    if claims.size > cap:
        raise InvalidRequest(
            f"archive's zip central directory is {claims.size} bytes; "
            f"{max_entries} entries need at most {cap}; {_WHAT}"
        )
