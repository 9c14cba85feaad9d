"""Which URL (the gateway's, or the registry's) and API key a command uses, from flags,
environment and contexts.

Precedence, field by field: ``--url`` / ``--api-key`` > the context ``--context NAME``
names > ``PREFT_REGISTRY_URL`` / ``PREFT_API_KEY`` > the config file's current context >
the default URL. ``--context`` is a command-line flag, so it outranks the environment; the
current context is only the fallback. A context's key is sent only to that context's own URL:
when the URL comes from elsewhere and differs, the context supplies no key, so a key is never
sent to a server it was not issued for.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from preft_serve.cli import config
from preft_serve.cli.client import CliError

DEFAULT_URL = "http://127.0.0.1:8081"
NO_KEY = "no API key: pass --api-key or set PREFT_API_KEY, or run `preft login --url URL`"


@dataclass(frozen=True)
class Target:
    """Where a command goes and with which key (``None``: no key found)."""

    url: str
    api_key: str | None
    context: str | None = None  # the context consulted, if any
    context_url: str | None = None

    def missing_key(self) -> str:
        """Why no key was found, and what to run."""
        if self.context is not None and self.context_url is not None:
            return (
                f"no API key for {self.url}: context {self.context!r} holds a key for "
                f"{self.context_url} only (a key goes only to its own URL); pass "
                f"--api-key, use another --context, or run `preft login --url {self.url}`"
            )
        return NO_KEY


def named_context(name: str) -> config.Context:
    """The context ``name`` in the config file; an unknown name lists the known ones."""
    cfg = config.load()
    try:
        return cfg.contexts[name]
    except KeyError:
        raise unknown_context(name, cfg) from None


def unknown_context(name: str, cfg: config.Config) -> CliError:
    known = ", ".join(sorted(cfg.contexts)) or "none yet"
    return CliError(
        f"no context named {name!r} in {config.config_path()} (known: {known}); "
        "add one with `preft login --url URL --context NAME`",
        code="unknown_context",
    )


def _same(url_a: str, url_b: str) -> bool:
    return url_a.rstrip("/") == url_b.rstrip("/")


def resolve(
    url_flag: str | None, key_flag: str | None, context_flag: str | None, *, want_key: bool = True
) -> Target:
    """The URL and key for a command; the config file is read only when flags and
    environment leave something open (so a broken file does not stop env-only use)."""
    env_url = os.environ.get("PREFT_REGISTRY_URL") or None
    env_key = (os.environ.get("PREFT_API_KEY") or None) if want_key else None
    key = key_flag if want_key else None
    name, context = context_flag, None
    url: str | None
    if name is not None:
        context = named_context(name)
        url = url_flag or context.url
    else:
        url = url_flag or env_url
        key = key or env_key
        if not url or (want_key and not key):
            current = config.load()
            if current.current_context is not None:
                name = current.current_context
                context = current.contexts[name]
                url = url or context.url
    url = (url or DEFAULT_URL).rstrip("/")
    if not want_key or key:
        return Target(url, key)
    if context is not None and _same(context.url, url):
        return Target(url, context.api_key)
    key = env_key  # --context with a --url of another server: its key does not go there
    if context is not None:
        return Target(url, key, name, context.url)
    return Target(url, key)
