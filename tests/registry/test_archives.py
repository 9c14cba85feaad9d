"""Archive uploads: accepted layouts give the same content hash as plain files; links,
traversal, bombs and clutter are refused without storing anything."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from preft_serve.adapters.format import CONFIG_FILE, WEIGHTS_FILE
from preft_serve.common.domain_errors import Unavailable
from preft_serve.registry.archives import extract_archive
from preft_serve.registry.validation import UploadBounds
from tests.support.registry_api import error_message, upload


def _post_archive(client, headers, filename: str, data: bytes, name: str = "bot"):
    return client.post(
        "/v1/adapters",
        data={"name": name, "mode": "prefill"},
        files=[("files", (filename, data, "application/octet-stream"))],
        headers=headers,
    )


def _tar(entries: list[tarfile.TarInfo | tuple[str, bytes]], mode: str = "w:gz") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:
        for entry in entries:
            if isinstance(entry, tarfile.TarInfo):
                tar.addfile(entry)
            else:
                info = tarfile.TarInfo(entry[0])
                info.size = len(entry[1])
                tar.addfile(info, io.BytesIO(entry[1]))
    return buf.getvalue()


def _zip(entries: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            zf.writestr(name, data)
    return buf.getvalue()


def _adapter_entries(adapter_dir: Path, folder: str = "") -> list[tuple[str, bytes]]:
    return [(folder + n, (adapter_dir / n).read_bytes()) for n in (CONFIG_FILE, WEIGHTS_FILE)]


@pytest.mark.parametrize("kind", ["tar.gz", "tgz", "tar", "zip"])
@pytest.mark.parametrize("folder", ["", "my-adapter/", "./"])
def test_archive_matches_plain_upload(kind, folder, client, acme, lora_dir):
    plain = upload(client, acme, "plain", lora_dir)
    assert plain.status_code == 201
    entries = [*_adapter_entries(lora_dir, folder), (folder + "README.md", b"# PEFT readme")]
    data = _zip(entries) if kind == "zip" else _tar(entries, "w" if kind == "tar" else "w:gz")
    resp = _post_archive(client, acme, f"adapter.{kind}", data)
    assert resp.status_code == 201, resp.text
    assert resp.json()["sha256"] == plain.json()["sha256"]


def _link(name: str, target: str, hard: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.LNKTYPE if hard else tarfile.SYMTYPE
    info.linkname = target
    return info


def _sparse(pax: bool) -> bytes:
    """A tar whose weights entry is a GNU sparse file (old-style header, or pax 1.0)."""
    info = tarfile.TarInfo(WEIGHTS_FILE)
    if pax:
        info.pax_headers = {
            "GNU.sparse.major": "1",
            "GNU.sparse.minor": "0",
            "GNU.sparse.name": WEIGHTS_FILE,
            "GNU.sparse.realsize": "1",
        }
    else:
        info.type = tarfile.GNUTYPE_SPARSE
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info)
    return buf.getvalue()


def _zip_symlink() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        info = zipfile.ZipInfo(WEIGHTS_FILE)
        info.external_attr = 0o120777 << 16
        zf.writestr(info, "/etc/passwd")
    return buf.getvalue()


def _bomb_zip() -> bytes:
    return _zip([(CONFIG_FILE, b"{}"), (WEIGHTS_FILE, b"\0" * (3 << 20))])


def _zip_entry_patched(
    entries: list[tuple[str, bytes]],
    target: str,
    *,
    method: int | None = None,
    data_head: bytes | None = None,
) -> bytes:
    """A deflated zip whose ``target`` entry claims compression ``method`` (in its local
    header and the central directory) or whose compressed data starts with ``data_head``."""
    raw = bytearray(_zip(entries))
    with zipfile.ZipFile(io.BytesIO(bytes(raw))) as zf:
        info = zf.getinfo(target)
    local = info.header_offset
    name_len, extra_len = (
        int.from_bytes(raw[local + i : local + i + 2], "little") for i in (26, 28)
    )
    if method is not None:
        raw[local + 8 : local + 10] = method.to_bytes(2, "little")
        central = raw.find(b"PK\x01\x02")
        while central >= 0:  # the central directory record of this name too
            name = raw[
                central + 46 : central
                + 46
                + int.from_bytes(raw[central + 28 : central + 30], "little")
            ]
            if name == target.encode():
                raw[central + 10 : central + 12] = method.to_bytes(2, "little")
            central = raw.find(b"PK\x01\x02", central + 4)
    if data_head is not None:
        data = local + 30 + name_len + extra_len
        raw[data : data + len(data_head)] = data_head
    return bytes(raw)


def _xz_corrupt(entries: list[tuple[str, bytes]]) -> bytes:
    data = bytearray(_tar(entries, "w:xz"))
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(64)  # inside the LZMA stream
    return bytes(data)


BAD_ARCHIVES = {
    "symlink": (
        lambda d: _tar([_link(WEIGHTS_FILE, "/etc/passwd")]),
        "adapter.tar.gz",
        400,
        f"archive entry '{WEIGHTS_FILE}' is a link; only regular files are allowed",
    ),
    "hardlink": (
        lambda d: _tar([_link(CONFIG_FILE, "x", hard=True)]),
        "adapter.tgz",
        400,
        f"archive entry '{CONFIG_FILE}' is a link",
    ),
    "sparse": (
        lambda d: _sparse(pax=False),
        "adapter.tar.gz",
        400,
        (f"archive entry '{WEIGHTS_FILE}' is a sparse file; only regular files are allowed"),
    ),
    "pax sparse": (
        lambda d: _sparse(pax=True),
        "adapter.tar.gz",
        400,
        f"archive entry '{WEIGHTS_FILE}' is a sparse file",
    ),
    "zip symlink": (
        lambda d: _zip_symlink(),
        "adapter.zip",
        400,
        f"archive entry '{WEIGHTS_FILE}' is a symbolic link",
    ),
    "traversal": (
        lambda d: _tar(_adapter_entries(d, "../")),
        "adapter.tar.gz",
        400,
        f"archive entry '../{CONFIG_FILE}' points outside the archive ('..')",
    ),
    "zip traversal": (
        lambda d: _zip(_adapter_entries(d, "a/../../")),
        "adapter.zip",
        400,
        "points outside the archive ('..')",
    ),
    "absolute": (
        lambda d: _tar(_adapter_entries(d, "/tmp/")),
        "adapter.tar.gz",
        400,
        f"archive entry '/tmp/{CONFIG_FILE}' has an absolute or Windows path",
    ),
    "too deep": (
        lambda d: _tar(_adapter_entries(d, "a/b/")),
        "adapter.tar.gz",
        400,
        f"archive entry 'a/b/{CONFIG_FILE}' is nested too deeply",
    ),
    "zip bomb": (lambda d: _bomb_zip(), "adapter.zip", 400, "over the 100x limit (zip bomb?)"),
    "gzip bomb": (
        lambda d: _tar([(CONFIG_FILE, b"{}"), (WEIGHTS_FILE, b"\0" * (3 << 20))]),
        "adapter.tar.gz",
        400,
        "archive expands more than 100x (zip bomb?)",
    ),
    "too many entries": (
        lambda d: _zip([(f"README{i}/README.md", b"") for i in range(20)]),
        "adapter.zip",
        400,
        "archive has more than 16 entries",
    ),
    "pickle inside": (
        lambda d: _tar([(CONFIG_FILE, b"{}"), ("adapter_model.bin", b"\x80\x04")]),
        "adapter.tar.gz",
        415,
        "adapter_model.bin is a pickle-based PyTorch file",
    ),
    "stranger inside": (
        lambda d: _zip([*_adapter_entries(d), ("run.sh", b"rm -rf /")]),
        "adapter.zip",
        400,
        "unexpected file 'run.sh'",
    ),
    "duplicate": (
        lambda d: _tar(_adapter_entries(d) + _adapter_entries(d, "x/")),
        "adapter.tar.gz",
        400,
        "archive contains adapter_config.json more than once",
    ),
    "two folders": (
        lambda d: _zip(_adapter_entries(d, "a/")[:1] + _adapter_entries(d, "b/")[1:]),
        "adapter.zip",
        400,
        (
            "archive has adapter_config.json in folder 'a' and adapter_model.safetensors "
            "in folder 'b'; put both adapter files at the archive root or both in one "
            "top-level folder"
        ),
    ),
    "root and folder": (
        lambda d: _tar(_adapter_entries(d)[:1] + _adapter_entries(d, "w/")[1:]),
        "adapter.tar.gz",
        400,
        (
            "archive has adapter_config.json at the archive root and "
            "adapter_model.safetensors in folder 'w'"
        ),
    ),
    "missing weights": (
        lambda d: _zip(_adapter_entries(d)[:1]),
        "adapter.zip",
        400,
        "the upload lacks adapter_model.safetensors",
    ),
    "corrupt zip": (
        lambda d: b"PK\x03\x04 definitely not a zip",
        "adapter.zip",
        400,
        "upload is not a readable .zip archive",
    ),
    "corrupt tar.gz": (
        lambda d: _tar(_adapter_entries(d))[:300],
        "adapter.tar.gz",
        400,
        "corrupt or truncated",
    ),
    # Each of these was a 500 (an exception zipfile, zlib or lzma raise outside the ones
    # caught): found by a review of the upload paths.
    "zip entry: corrupt deflate data": (
        lambda d: _zip_entry_patched(_adapter_entries(d), WEIGHTS_FILE, data_head=b"\xff"),
        "adapter.zip",
        400,
        f"archive entry '{WEIGHTS_FILE}' is corrupt",
    ),
    "zip entry: unknown compression method": (
        lambda d: _zip_entry_patched(_adapter_entries(d), WEIGHTS_FILE, method=99),
        "adapter.zip",
        400,
        f"archive entry '{WEIGHTS_FILE}' uses a compression method this registry cannot read",
    ),
    "corrupt xz stream named .tar.gz": (
        lambda d: _xz_corrupt(_adapter_entries(d)),
        "adapter.tar.gz",
        400,
        "corrupt or truncated",
    ),
    "declared too large": (
        lambda d: _tar([(CONFIG_FILE, b"{" + b" " * 5000 + b"}")]),
        "adapter.tar.gz",
        413,
        "adapter_config.json in the archive is 5002 bytes; the limit is 4096",
    ),
}


@pytest.mark.parametrize("case", list(BAD_ARCHIVES))
def test_bad_archive_rejected_and_nothing_stored(case, make_client, lora_dir, state_snapshot):
    from tests.support.registry_api import create_tenant

    client = make_client(max_config_bytes=4096)
    headers = create_tenant(client, "acme")
    build, filename, status, message = BAD_ARCHIVES[case]
    before = state_snapshot()
    resp = _post_archive(client, headers, filename, build(lora_dir))
    assert resp.status_code == status, resp.text
    assert message in error_message(resp)
    assert state_snapshot() == before


def test_archive_with_other_files_rejected(client, acme, lora_dir, state_snapshot):
    before = state_snapshot()
    data = _zip(_adapter_entries(lora_dir))
    resp = client.post(
        "/v1/adapters",
        data={"name": "bot", "mode": "prefill"},
        headers=acme,
        files=[
            ("files", ("a.zip", data, "application/zip")),
            ("files", (CONFIG_FILE, b"{}", "application/json")),
        ],
    )
    assert resp.status_code == 400
    assert "send either one archive or the two adapter files, not both" in error_message(resp)
    assert state_snapshot() == before


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_a_staging_failure_is_the_registrys_503_not_a_corrupt_archive(
    kind: str, lora_dir: Path, tmp_path: Path
) -> None:
    """The staging file cannot be written (here a folder stands where it goes, as a full
    disk or too many open files would fail it): 503 without the server's path, not 400."""
    entries = _adapter_entries(lora_dir)
    data = _zip(entries) if kind == "zip" else _tar(entries)
    dest = tmp_path / "staging"
    (dest / CONFIG_FILE).mkdir(parents=True)
    with pytest.raises(Unavailable) as refused:
        extract_archive(io.BytesIO(data), f"adapter.{kind}", dest, UploadBounds())
    message = str(refused.value)
    assert "could not stage this upload" in message and str(tmp_path) not in message


def test_a_staging_file_that_fails_as_it_closes_is_the_registrys_503() -> None:
    """A full disk can show only when the last buffered bytes are flushed at close
    (``/dev/full`` takes every write, then fails the flush): 503, not the 400 a
    tenant's corrupt archive gets; an error already raised inside is left as it is."""
    from preft_serve.registry.archives import _StagingFile

    full = Path("/dev/full")
    with pytest.raises(Unavailable, match="could not stage this upload"), _StagingFile(full) as out:
        out.write(b"x" * 100)
    with pytest.raises(ValueError, match="the archive's own"), _StagingFile(full) as out:
        out.write(b"x" * 100)
        raise ValueError("the archive's own")
