"""Reads an adapter's mode, type and content digest from its directory, once.

Both the scheduler (engine-core process) and the model runner (worker process) need to
know whether a request's adapter is prefill-only; vLLM only carries ``LoRARequest``
(name, int id, path), so the config on disk is the one source both can read.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

from preft_serve.adapters.families import AdapterFamily, Runtime, family_of
from preft_serve.adapters.format import (
    WEIGHTS_FILE,
    AdapterMode,
    AdapterType,
    adapter_mode,
    adapter_type,
    read_config,
    weights_file_digest,
)


@dataclasses.dataclass(frozen=True)
class AdapterInfo:
    """What the engine needs to know about one loaded adapter."""

    mode: AdapterMode
    type: AdapterType
    digest: str
    positions: str | None = None  # ReFT only: "f{n}+l{n}", "f{n}", "l{n}" or "prefill"

    @property
    def family(self) -> AdapterFamily:
        return family_of(self.type)

    @property
    def runtime(self) -> Runtime:
        """What applies it: vLLM's LoRA manager or the ReFT runtime."""
        return self.family.runtime

    @property
    def prefill_only(self) -> bool:
        """Applied to prompt tokens only (PreFT LoRA, and every ReFT adapter)."""
        return self.mode is AdapterMode.PREFILL or self.family.prompt_only

    @property
    def prompt_length_dependent(self) -> bool:
        """Prompt KV depends on the prompt's length (ReFT at first/last-n positions)."""
        return self.runtime is Runtime.REFT and self.positions != "prefill"


class AdapterInfoCache:
    """Memoises :class:`AdapterInfo` per ``(adapter int id, path)``.

    vLLM gives a re-registered adapter a new int id, so the key never goes stale. vLLM's
    ``load_inplace`` (new weights under the same id) is not tracked: content-addressed
    adapter directories never change in place.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._infos: dict[tuple[int, str], AdapterInfo] = {}

    def get(self, adapter_id: int, path: str) -> AdapterInfo:
        key = (adapter_id, path)
        info = self._infos.get(key)
        if info is None:
            config = read_config(Path(path))
            kind = adapter_type(config)
            positions = (
                str(config.get("positions", "prefill"))
                if family_of(kind).runtime is Runtime.REFT
                else None
            )
            digest = weights_file_digest(config, Path(path) / WEIGHTS_FILE)
            info = AdapterInfo(adapter_mode(config), kind, digest, positions)
            with self._lock:
                self._infos[key] = info
        return info


ADAPTER_INFO = AdapterInfoCache()
"""Process-wide cache shared by the scheduler, model runner and prefix-cache hashing."""
