"""Shared start-up for the HTTP services' ``python -m`` entry points.

Flags override environment settings; an invalid configuration becomes a usage error that
names every problem, and the app runs under uvicorn with the project's logging.
"""

from __future__ import annotations

import argparse
import enum
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import uvicorn
from pydantic import ValidationError
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

from preft_serve.common.logging import setup_logging

S = TypeVar("S", bound=BaseSettings)


def load_settings(
    parser: argparse.ArgumentParser,
    settings_cls: type[S],
    overrides: dict[str, Any],
    env_prefix: str,
) -> S:
    """Settings from the environment with non-None flag ``overrides`` on top."""
    try:
        return settings_cls(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors()
        )
        parser.error(f"invalid configuration ({env_prefix}<NAME> or flags): {problems}")


def serve(settings: Any, create_app: Callable[[Any], Any]) -> int:
    """Configure logging from ``settings`` and run the app until shutdown (uvicorn's own
    access lines are off: the apps log one richer line per request, common.access_log)."""
    setup_logging(settings.log_level, json_output=settings.log_json)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        timeout_keep_alive=settings.keepalive_s,
    )
    return 0


def add_settings_flags(
    parser: argparse.ArgumentParser,
    settings_cls: type[BaseSettings],
    env_prefix: str,
    fields: Iterable[str],
    flag_names: Mapping[str, str] | None = None,
) -> None:
    """One ``--flag`` per settings field, its help, type, choices and default read from the
    field itself, so a flag never repeats a default by hand. ``flag_names`` renames a
    field's flag (``worker_urls`` -> ``--workers``); values land on ``args.<field>``."""
    renamed = flag_names or {}
    for name in fields:
        info = settings_cls.model_fields[name]
        env = f"{env_prefix}{name.upper()}"
        default = info.default.value if isinstance(info.default, enum.Enum) else info.default
        unset: tuple[Any, ...] = (None, PydanticUndefined, [], False)
        shown = f", default {default}" if default not in unset else ""
        text = f"{info.description or name.replace('_', ' ')} ({env}{shown})"
        flag = renamed.get(name, "--" + name.replace("_", "-"))
        kind = info.annotation
        if kind is bool:
            parser.add_argument(flag, dest=name, action="store_true", default=None, help=text)
        elif isinstance(kind, type) and issubclass(kind, enum.Enum):
            parser.add_argument(flag, dest=name, choices=[k.value for k in kind], help=text)
        elif kind is int or kind is float:
            parser.add_argument(flag, dest=name, type=int if kind is int else float, help=text)
        else:  # str, Path, lists given as text: the settings class parses them
            parser.add_argument(flag, dest=name, help=text)


def flag_overrides(args: argparse.Namespace, fields: Iterable[str]) -> dict[str, Any]:
    """The values of the flags :func:`add_settings_flags` added, for :func:`load_settings`."""
    return {name: getattr(args, name) for name in fields}
