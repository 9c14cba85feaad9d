"""Bounding tar extension headers before :mod:`tarfile` reads them.

A tar member's name lives in its 512-byte header, unless an extension header precedes
it: a GNU long-name/long-link header or a pax header, whose *size* field says how many
bytes of name (or key=value records) follow. ``tarfile`` reads that many bytes into
memory in one go, and it recurses once per chained extension header. A 100 KiB .tar.gz
announcing a 100 MiB name cost ~500 MiB and came back as a 100 MiB error; a few thousand
chained headers made a RecursionError.

:class:`BoundedTarInfo` (pass ``tarinfo=BoundedTarInfo`` to ``tarfile.open``) checks each
extension header's size from its header block, and counts them, before ``tarfile`` reads
a byte of its content. It hooks ``TarInfo._proc_member``, the dispatch point ``tarfile``
documents for subclasses. Sparse members are refused outright: their maps (GNU extended
sparse blocks, pax sparse 1.0 data) are unbounded too, and an adapter file is never sparse.
"""

from __future__ import annotations

import tarfile
from typing import Any

from preft_serve.adapters.format import CONFIG_FILE, WEIGHTS_FILE
from preft_serve.common.domain_errors import InvalidRequest
from preft_serve.common.text import shown

MAX_LONG_NAME_BYTES = 4096  # GNU long name / long link name (PATH_MAX)
MAX_PAX_HEADER_BYTES = 64 << 10  # one pax header: path, times, ids, a few xattrs
MAX_EXTENSION_HEADERS = 64  # per archive; real ones have about one per member

_KINDS = {
    tarfile.GNUTYPE_LONGNAME: ("GNU long-name header", MAX_LONG_NAME_BYTES),
    tarfile.GNUTYPE_LONGLINK: ("GNU long-link header", MAX_LONG_NAME_BYTES),
    tarfile.XHDTYPE: ("pax extended header", MAX_PAX_HEADER_BYTES),
    tarfile.XGLTYPE: ("pax global header", MAX_PAX_HEADER_BYTES),
    tarfile.SOLARIS_XHDTYPE: ("Solaris extended header", MAX_PAX_HEADER_BYTES),
}
_COUNT_ATTR = "_preft_extension_headers"


def _sparse(name: str) -> InvalidRequest:
    return InvalidRequest(
        f"archive entry {shown(name)} is a sparse file; only regular files are "
        "allowed (pack the adapter with plain `tar czf`)"
    )


class BoundedTarInfo(tarfile.TarInfo):
    """TarInfo that refuses oversized or endless extension headers and sparse members."""

    def _proc_member(self, archive: tarfile.TarFile) -> Any:
        kind = _KINDS.get(self.type)
        if kind is not None:
            what, limit = kind
            if self.size > limit:
                raise InvalidRequest(
                    f"archive has a {what} of {self.size} bytes; the limit is "
                    f"{limit} (adapter archives need only short names)"
                )
            seen = getattr(archive, _COUNT_ATTR, 0) + 1
            if seen > MAX_EXTENSION_HEADERS:
                raise InvalidRequest(
                    f"archive has more than {MAX_EXTENSION_HEADERS} extended "
                    "(pax or GNU long-name) headers; an adapter archive holds "
                    f"{CONFIG_FILE} and {WEIGHTS_FILE}"
                )
            setattr(archive, _COUNT_ATTR, seen)
        elif self.type == tarfile.GNUTYPE_SPARSE:
            raise _sparse(self.name)
        return super()._proc_member(archive)  # type: ignore[misc]

    # pax-declared sparse members (GNU sparse 0.0, 0.1 and 1.0): refused before their map
    # is read.
    def _proc_gnusparse_00(self, next: tarfile.TarInfo, *args: Any) -> None:
        raise _sparse(next.name)

    def _proc_gnusparse_01(self, next: tarfile.TarInfo, *args: Any) -> None:
        raise _sparse(next.name)

    def _proc_gnusparse_10(self, next: tarfile.TarInfo, *args: Any) -> None:
        raise _sparse(next.name)
