"""Where trainers run: one small interface, chosen by name (``Backend``) in settings.

The dispatcher only calls these methods; a backend never touches Redis. ``start`` returns
what must be recorded to find the trainer again (pid, Job name ...), ``poll`` reports its
state and the progress lines it printed since the last poll, ``cancel`` stops it, and
``orphan`` decides about a job whose registry died: fail it (a local process lost its
parent) or keep following it (a Kubernetes Job does not care).
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import json
from typing import Any

from preft_serve.registry.finetune.spec import TrainerSpec


class RunState(str, enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclasses.dataclass
class Observation:
    state: RunState
    lines: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # preft events
    reason: str | None = None  # FAILED: why, for the job's error
    runner: dict[str, Any] | None = None  # updated runner info to store, if any


class Runner(abc.ABC):
    name: str
    poll_every_s: float = 0.0  # at most one poll per job this often (API-server load)
    # Whether its trainers die with the registry that started them (child processes): then
    # a stopping registry cancels and fails its jobs; otherwise another registry adopts them.
    stops_with_registry: bool = False

    @abc.abstractmethod
    def start(self, spec: TrainerSpec, tenant: str) -> dict[str, Any]:
        """Launch the trainer; returns the runner info to store on the job."""

    @abc.abstractmethod
    def poll(self, job_id: str, runner: dict[str, Any]) -> Observation:
        """The trainer's state and new progress lines."""

    @abc.abstractmethod
    def cancel(self, job_id: str, runner: dict[str, Any]) -> None:
        """Stop the trainer (idempotent; a trainer already gone is fine)."""

    @abc.abstractmethod
    def orphan(self, job_id: str, runner: dict[str, Any]) -> str | None:
        """The registry that ran it is gone: a reason to fail the job, or None to adopt
        it (keep polling it from this registry)."""

    def capacity(self) -> int:
        """How many more trainers this backend takes now."""
        return 1 << 30

    def close(self) -> None:  # noqa: B027 (optional: most backends hold nothing to stop)
        """Stop following trainers (the registry is shutting down)."""


def parse_line(line: str) -> dict[str, Any] | None:
    """A trainer's progress line, or None for anything else it printed."""
    text = line.strip()
    if not text.startswith("{") or len(text) > 65536:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) and "preft_event" in value else None
