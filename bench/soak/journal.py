"""What every part of the soak records, and its progress lines."""

from __future__ import annotations

import threading
import time
from typing import Any


def say(line: str) -> None:
    print(line, flush=True)


class Journal:
    """Thread-safe lists of records; times are seconds since ``t0``."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self.mutations: list[dict[str, Any]] = []
        self.faults: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self.hostile: list[dict[str, Any]] = []  # the hostile tenant's calls
        self.leaving: list[dict[str, Any]] = []  # streams their clients left
        self.probes: list[dict[str, Any]] = []  # requests with fields no worker honours
        self.phases: dict[str, list[float]] = {}  # name -> [start, end]
        self.shed = 0

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    def add(self, kind: str, record: dict[str, Any]) -> None:
        with self.lock:
            getattr(self, kind).append(record)
