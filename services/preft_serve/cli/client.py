"""The HTTP client of the registry's REST API, and the error every command reports."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Protocol

import httpx

from preft_serve.common.error_envelope import error_body
from preft_serve.common.text import clip


class CliError(Exception):
    """A failure to report with exit status 1: ``error: <message>``, or under ``--output json``
    ``{"error": {...}}`` on stdout.

    ``error`` is the registry's envelope body (OpenAI's ``message``, ``type``, ``param``,
    ``code``) when the registry answered; ``status`` its HTTP status. The CLI's own
    failures (registry unreachable, bad local file) have ``type`` ``cli_error``.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = "cli",
        status: int | None = None,
        error: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.error = (
            error
            if error is not None
            else {"message": message, "type": "cli_error", "param": None, "code": code}
        )


class ByteCounter(Protocol):
    def update(self, n: int) -> Any: ...


class ProgressFile:
    """A binary file that reports to ``progress`` how many more bytes httpx has read."""

    def __init__(self, path: Path, progress: ByteCounter | None) -> None:
        self._fh = open(path, "rb")  # noqa: SIM115  (closed by the upload command)
        self._progress = progress
        self._reported = 0
        self.name = str(path)

    def read(self, size: int = -1) -> bytes:
        chunk = self._fh.read(size)
        position = self._fh.tell()
        if self._progress is not None and position > self._reported:
            self._progress.update(position - self._reported)
            self._reported = position
        return chunk

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._fh.seek(offset, whence)

    def tell(self) -> int:
        return self._fh.tell()

    def fileno(self) -> int:
        return self._fh.fileno()

    def close(self) -> None:
        self._fh.close()


BUSY_CODES = frozenset({"too_many_transfers", "registry_busy", "uploads_busy"})
"""Refusals of an upload or download for want of a transfer slot (the registry's, or a
gateway's ``uploads_busy``): nothing was done, and the same request succeeds once one of
the transfers in progress ends."""
BUSY_WAIT_S = 120.0
"""How long a request keeps retrying those refusals before it reports the last one."""


class Registry:
    """Thin REST client; every non-2xx answer becomes a :class:`CliError` with its message.

    A refusal for want of a transfer slot (:data:`BUSY_CODES`) is retried after the
    answer's ``Retry-After``, for up to :data:`BUSY_WAIT_S` seconds; ``on_busy`` hears each
    wait (the CLI prints it)."""

    def __init__(
        self,
        url: str,
        token: str | None,
        timeout: float,
        on_busy: Callable[[str], None] | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.http = httpx.Client(
            base_url=self.url, headers=headers, timeout=httpx.Timeout(timeout, connect=10)
        )
        self.on_busy = on_busy
        self.busy_wait_s = BUSY_WAIT_S

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        resp = self._send(method, path, **kwargs)
        return resp.json() if resp.content else None

    def answer(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The whole 2xx answer (for its headers too, an ETag say); refusals raise."""
        return self._send(method, path, **kwargs)

    def download(
        self, path: str, out: IO[bytes], progress: Any = None, **kwargs: Any
    ) -> httpx.Headers:
        """Stream a GET response's body into ``out``; ``progress(total)`` returns a byte counter."""
        _check_path(path)
        deadline = time.monotonic() + self.busy_wait_s
        try:
            while True:
                with self.http.stream("GET", path, **kwargs) as resp:
                    if resp.is_success:
                        return self._save(resp, out, progress)
                    resp.read()
                    refusal = self._refused(resp)
                self._wait_if_busy(resp, refusal, deadline)
        except httpx.TransportError as exc:
            raise self._transport(exc) from None

    @staticmethod
    def _save(resp: httpx.Response, out: IO[bytes], progress: Any) -> httpx.Headers:
        total = int(resp.headers.get("content-length") or 0)
        counter = progress(total) if progress is not None else None
        try:
            for chunk in resp.iter_bytes():
                out.write(chunk)
                if counter is not None:
                    counter.update(len(chunk))
        finally:
            if counter is not None:
                counter.close()
        return resp.headers

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        _check_path(path)
        deadline = time.monotonic() + self.busy_wait_s
        while True:
            try:
                resp = self.http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                raise self._transport(exc) from None
            if resp.is_success:
                return resp
            self._wait_if_busy(resp, self._refused(resp), deadline)
            _rewind(kwargs.get("files"))

    def _wait_if_busy(self, resp: httpx.Response, refusal: CliError, deadline: float) -> None:
        """Sleep out a transfer-slot refusal's ``Retry-After`` (1-10 s); raise ``refusal``
        for any other answer, or once the wait would pass ``deadline``."""
        if refusal.error.get("code") not in BUSY_CODES:
            raise refusal
        try:
            asked = float(resp.headers.get("retry-after", "1"))
        except ValueError:
            asked = 1.0
        wait = min(max(asked, 1.0), 10.0) if math.isfinite(asked) else 1.0
        if time.monotonic() + wait > deadline:
            raise refusal
        if self.on_busy is not None:
            self.on_busy(f"{refusal.message} (retrying in {wait:g} s)")
        time.sleep(wait)

    def _refused(self, resp: httpx.Response) -> CliError:
        """A refusal, or a redirect (never followed: the request may not be one to
        repeat elsewhere, and nothing was done)."""
        if 300 <= resp.status_code < 400:
            where = resp.headers.get("location", "")
            return CliError(
                f"{self.url} answered HTTP {resp.status_code}, redirecting to "
                f"{clip(where, 200) or 'nowhere'}; nothing was done: pass the URL it "
                "redirects to as --url (https:// if it redirects there)",
                code="redirected",
                status=resp.status_code,
            )
        return _refusal(resp)

    def _transport(self, exc: httpx.TransportError) -> CliError:
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
            return CliError(
                f"cannot reach the registry at {self.url} ({exc}); check --url or "
                "PREFT_REGISTRY_URL",
                code="unreachable",
            )
        return CliError(
            f"the connection to {self.url} failed during the request ({exc!r}); "
            "if this was an upload, it may exceed the registry's size limit",
            code="connection_failed",
        )


def _rewind(files: Any) -> None:
    """Put an upload's file objects back at their start, for the same request again
    (``files`` as httpx takes it: a mapping or a list of (field, file) pairs; a file is
    an object or a (name, object[, type]) tuple)."""
    pairs = files.items() if isinstance(files, dict) else files or ()
    for _, spec in pairs:
        handle = spec[1] if isinstance(spec, tuple) else spec
        if hasattr(handle, "seek"):
            handle.seek(0)


def _check_path(path: str) -> None:
    """No '.' or '..' segment: httpx folds them, so the request would reach another route
    (commands check their names first; this is the last guard)."""
    segments = path.partition("?")[0].split("/")
    if "." in segments or ".." in segments:
        raise CliError(f"refusing to send {clip(path, 200)!r}: a '.' or '..' in a name")


def _refusal(resp: httpx.Response) -> CliError:
    try:
        error = resp.json()["error"]
        message = error["message"]
        if not isinstance(error, dict) or not isinstance(message, str):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        # A proxy's error page, say: a bounded, printable excerpt.
        text = "".join(c if c.isprintable() else " " for c in resp.text[:2000]).strip()
        message = clip(" ".join(text.split()), 300) or resp.reason_phrase
        error = error_body(resp.status_code, message, code=f"http_{resp.status_code}")["error"]
    return CliError(message, status=resp.status_code, error=error)


def list_pages(
    reg: Registry, path: str, args: Any, params: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A cursor-paged list (``/v1/adapters``, ``/v1/users``): the page after ``--cursor``
    of ``--limit`` items, or with ``--all`` every page after it, as one result whose
    ``next_cursor`` says where the next would start (None: nothing left)."""
    items: list[Any] = []
    cursor = args.cursor
    while True:
        query = {**(params or {}), "limit": args.limit, **({"cursor": cursor} if cursor else {})}
        page = reg.call("GET", path, params=query)
        items += page["items"]
        cursor = page["next_cursor"]
        if cursor is None or not args.all:
            return {"items": items, "next_cursor": cursor}


def add_paging_options(parser: Any, default_limit: int = 100) -> None:
    """``--limit``, ``--all`` and ``--cursor`` of a :func:`list_pages` command."""
    parser.add_argument(
        "--limit", type=int, default=default_limit, help=f"page size (default {default_limit})"
    )
    parser.add_argument("--all", action="store_true", help="fetch every page")
    parser.add_argument("--cursor", help="the page after this cursor (a list's next_cursor)")
