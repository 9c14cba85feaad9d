"""Which processes are alive in a process group (read from /proc, Linux)."""

from __future__ import annotations

from pathlib import Path


def group_members(pgid: int) -> list[int]:
    """Pids of live (non-zombie) processes whose process group is ``pgid``."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        # Fields after the parenthesised command: state ppid pgrp ...
        state, _ppid, pgrp = text.rsplit(")", 1)[1].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            members.append(int(stat.parent.name))
    return members
