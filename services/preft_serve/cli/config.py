"""The CLI's config file: named contexts (a registry URL and its API key) and the current one.

Keys live here so that nobody has to put them on a command line (where ``ps`` and shell
history see them). The file is written with mode 0600 (its directory, when preft creates it,
0700), atomically: a temporary file in the same directory, then a rename, so a crash never
leaves half a file. It is read bounded (:data:`MAX_CONFIG_BYTES`) and validated; a broken
file is a :class:`~preft_serve.cli.client.CliError` naming the file and what to fix.

Location: ``$PREFT_CONFIG``, else ``$XDG_CONFIG_HOME/preft/config.yaml``, else
``~/.config/preft/config.yaml``.
"""

from __future__ import annotations

import os
import re
import stat
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from preft_serve.cli.client import CliError

MAX_CONFIG_BYTES = 64 * 1024
MAX_CONTEXTS = 100
CONTEXT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,63}")
_KEY_CHARS = re.compile(r"[\x21-\x7e]{1,512}")  # printable ASCII, no spaces


def check_context_name(name: str) -> str:
    if not CONTEXT_NAME.fullmatch(name):
        raise ValueError(
            f"context name {name!r} must be 1-64 letters, digits or . _ : @ - "
            "(starting with a letter or digit)"
        )
    return name


def check_url(url: str) -> str:
    """An http(s) URL with a host; kept without a trailing slash, so URLs compare equal."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"URL {url!r} must be http:// or https:// with a host, e.g. "
            "https://registry.example.com"
        )
    return url.rstrip("/")


def check_api_key(key: str) -> str:
    if not _KEY_CHARS.fullmatch(key):
        raise ValueError("an API key is 1-512 printable characters without spaces")
    return key


def masked(key: str) -> str:
    """Enough of a key to tell keys apart, never enough to use one: ``pft_…abcd``."""
    prefix = key.split("_", 1)[0] + "_" if "_" in key[:8] else ""
    return f"{prefix}…{key[-4:]}" if len(key) >= 16 else f"{prefix}…"


class Context(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    url: Annotated[str, AfterValidator(check_url)]
    api_key: Annotated[str, AfterValidator(check_api_key)]


class Config(BaseModel):
    """The file's schema: ``current-context`` names one of ``contexts`` (or is absent)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    current_context: str | None = Field(default=None, alias="current-context")
    contexts: dict[Annotated[str, AfterValidator(check_context_name)], Context] = Field(
        default_factory=dict, max_length=MAX_CONTEXTS
    )

    @model_validator(mode="after")
    def _current_exists(self) -> Config:
        if self.current_context is not None and self.current_context not in self.contexts:
            raise ValueError(
                f"current-context {self.current_context!r} is not one of the "
                f"contexts ({', '.join(sorted(self.contexts)) or 'none'})"
            )
        return self

    def to_yaml(self) -> str:
        data = self.model_dump(by_alias=True, exclude_none=True)
        return str(yaml.safe_dump(data, sort_keys=True, default_flow_style=False))


def config_path() -> Path:
    if explicit := os.environ.get("PREFT_CONFIG"):
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "preft" / "config.yaml"


def _broken(path: Path, problem: str) -> CliError:
    return CliError(
        f"config file {path} {problem}; fix it, or delete it and run `preft login` again",
        code="config",
    )


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'the file'}: "
        f"{e['msg'].removeprefix('Value error, ')}"
        for e in exc.errors(include_url=False)
    )


def load(path: Path | None = None) -> Config:
    """The config at ``path`` (default :func:`config_path`); an absent file is empty."""
    path = path or config_path()
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
            mode = os.fstat(fh.fileno()).st_mode
    except FileNotFoundError:
        return Config()
    except OSError as exc:
        raise _broken(path, f"cannot be read ({exc.strerror})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise _broken(
            path, f"is larger than {MAX_CONFIG_BYTES} bytes, more than any preft config holds"
        )
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        sys.stderr.write(
            f"warning: config file {path} holds API keys and others can read "
            f"it; run chmod 600 {path}\n"
        )
    try:
        data: Any = yaml.safe_load(raw.decode("utf-8")) if raw.strip() else {}
    except UnicodeDecodeError:
        raise _broken(path, "is not UTF-8 text") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise _broken(path, f"is not valid YAML{where}") from None
    if not isinstance(data, dict):
        raise _broken(path, "must be a YAML mapping with 'contexts' and 'current-context'")
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise _broken(path, f"is invalid: {_problems(exc)}") from None


def save(config: Config, path: Path | None = None) -> Path:
    """Write ``config`` atomically with mode 0600; returns the path written. A failure
    leaves the old file as it was and no temporary file behind."""
    path = path or config_path()
    parent = path.parent
    try:
        if not parent.is_dir():
            parent.mkdir(parents=True, exist_ok=True)
            parent.chmod(0o700)  # mkdir's mode is masked by the umask
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise _unwritable(path, exc) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            os.fchmod(fh.fileno(), 0o600)
            fh.write(config.to_yaml())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise _unwritable(path, exc) from None
        raise
    return path


def _unwritable(path: Path, exc: OSError) -> CliError:
    return CliError(
        f"cannot write config file {path} ({exc.strerror or exc}); nothing was "
        "changed: check that directory's permissions and free space, or set "
        "PREFT_CONFIG to another path",
        code="config",
    )
