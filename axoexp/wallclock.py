"""A single run's wall time from its process's start, in phases: where the seconds before the first number go.

The clock starts when the kernel created the process (so the interpreter's start and every
import count) and is read at the end of each phase on the main thread; a phase is the time
since the previous mark, so the phases add up to the total by construction. What overlaps
(the store opened in a background thread) counts only where the main thread waits for it.
The process's exit comes after the last mark: it is measured from outside
(``benchmarks/startup.py``), not logged.
"""

from __future__ import annotations

import os
import time

from axoexp import names

_CLOCK = getattr(time, "CLOCK_BOOTTIME", None)


def now_s() -> float:
    """Seconds on the clock the process's start time is read against (since boot on Linux)."""
    return time.clock_gettime(_CLOCK) if _CLOCK is not None else time.time()


def process_start_s() -> float:
    """When this process was created, on :func:`now_s`'s clock.

    On Linux from ``/proc/self/stat`` (clock ticks since boot, 10 ms); elsewhere psutil's
    ``create_time`` against ``time.time``. psutil's Linux value adds a boot time read in whole
    seconds, which would shift the start by up to a second.
    """
    if _CLOCK is not None:
        try:
            with open("/proc/self/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
            return int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
        except (OSError, ValueError, IndexError):
            pass
    import psutil

    return float(psutil.Process().create_time()) - time.time() + now_s()


class PhaseClock:
    """Marks the end of each phase; ``phases_ms`` holds each phase's total (a phase marked
    twice, like the imports before and after Hydra composes the config, adds up)."""

    def __init__(self, started_s: float) -> None:
        self._last = started_s
        self.phases_ms: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        current = now_s()
        self.phases_ms[phase] = self.phases_ms.get(phase, 0.0) + (current - self._last) * 1000
        self._last = current

    def metrics(self) -> dict[str, float]:
        """``process_<phase>_ms`` for every phase so far, and ``process_total_ms``."""
        return {
            **{names.process_metric(phase): ms for phase, ms in self.phases_ms.items()},
            names.PROCESS_TOTAL: sum(self.phases_ms.values()),
        }


_process_clock: PhaseClock | None = None


def start_process_clock() -> None:
    """Time this process's runs from the process's start (the command line calls it once)."""
    global _process_clock
    _process_clock = PhaseClock(process_start_s())


def mark(phase: str) -> None:
    """End ``phase`` on the process clock; nothing when no clock runs (a run started from Python)."""
    if _process_clock is not None:
        _process_clock.mark(phase)


def take_phases() -> dict[str, float]:
    """The metrics of the phases marked so far, then start the next job's phases from now
    (a multirun's later jobs count from the end of the previous one). Empty with no clock."""
    global _process_clock
    if _process_clock is None:
        return {}
    metrics = _process_clock.metrics()
    _process_clock = PhaseClock(now_s())
    return metrics
