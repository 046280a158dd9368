"""Processes by pid: is one still alive (and the same one), and which are our descendants.

Linux's ``/proc`` is read directly; elsewhere liveness falls back to ``kill(pid, 0)`` and
nothing is known about descendants.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

PROC = Path("/proc")


def _stat(pid: int) -> list[str] | None:
    """Fields 3 onwards of ``/proc/PID/stat`` (those after the command name's ``)``)."""
    try:
        return (PROC / str(pid) / "stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def start_ticks(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot), to tell it from a later reuse of its pid."""
    fields = _stat(pid)
    return fields[19] if fields else None  # field 22


def alive(pid: int, started: str | None = None) -> bool:
    """Whether process ``pid`` of this host runs, and is the one that started at ``started``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    fields = _stat(pid)
    if fields is None:
        return True  # no /proc: kill(pid, 0) is all we know
    return fields[0] not in ("Z", "X") and (started is None or fields[19] == started)  # a zombie has exited


def this_host() -> str:
    return socket.gethostname()


def command_line(pid: int) -> str:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def descendants(pid: int | None = None) -> list[int]:
    """Every process below ``pid`` (default: this one), children first."""
    parents: dict[int, list[int]] = {}
    for entry in PROC.glob("[0-9]*"):
        fields = _stat(int(entry.name))
        if fields is not None:
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found, frontier = [], [os.getpid() if pid is None else pid]
    while frontier:
        children = [child for parent in frontier for child in parents.get(parent, [])]
        found += children
        frontier = children
    return found
