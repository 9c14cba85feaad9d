"""Shared start-up for the HTTP services' ``python -m`` entry points.

Flags override environment settings; an invalid configuration becomes a usage error that
names every problem, and the app runs under uvicorn with the project's logging.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TypeVar

import uvicorn
from preft_serve.common.logging import setup_logging
from pydantic import ValidationError
from pydantic_settings import BaseSettings

S = TypeVar("S", bound=BaseSettings)


def load_settings(parser: argparse.ArgumentParser, settings_cls: type[S],
                  overrides: dict[str, Any], env_prefix: str) -> S:
    """Settings from the environment with non-None flag ``overrides`` on top."""
    try:
        return settings_cls(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors()
        )
        parser.error(f"invalid configuration ({env_prefix}<NAME> or flags): {problems}")


def serve(settings: Any, create_app: Callable[[Any], Any]) -> int:
    """Configure logging from ``settings`` and run the app until shutdown."""
    setup_logging(settings.log_level, json_output=settings.log_json)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_config=None)
    return 0
