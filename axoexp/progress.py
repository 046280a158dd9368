"""Watching a run as it goes: every window and its duration in the job's log, and a live display;
a line for a phase without one of its own that takes long (:func:`noted_if_slow`).

:class:`RunProgress` is an :class:`~axoexp.measure.Observer`, so it works only between timed
updates. The display has no thread of its own: it is redrawn from the hooks, at most every
:data:`REFRESH_S`, so drawing it never lands inside a timed window. It is shown only when
stderr is a terminal and ``run.progress`` is true; the log lines are written either way
(Hydra sends them to the console and to ``<job>.log`` in the job's output directory).
"""

from __future__ import annotations

import logging
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from axoexp.windows import MEASURED, PREPARE, VERIFY, WARMUP, Observer

REFRESH_S = 0.1
NOTICE_AFTER_S = 10.0
"""How long a phase without lines of its own (planning, the population's build) runs before it says so."""
LABELS = {PREPARE: "prepare (compile, capture)", WARMUP: "warm-up", MEASURED: "measured", VERIFY: "verify"}

log = logging.getLogger("axoexp.run")


class RunProgress(Observer):
    """Logs each window's start and end (updates, duration, median); optionally draws a live bar.

    One observer does both so that the order on the console is right: the start line, then
    the bar; the bar is cleared before the end line.
    """

    def __init__(self, display: bool, stream: TextIO | None = None, refresh_s: float = REFRESH_S) -> None:
        self.console = Console(file=stream or sys.stderr) if display else None
        self.refresh_s = refresh_s
        self.progress: Progress | None = None
        self.task: TaskID | None = None
        self.started = 0.0
        self.next_refresh = 0.0
        self.planned = 0
        self.latencies_ms: list[float] = []

    def window_started(self, window: str, planned_updates: int) -> None:
        self.started, self.planned, self.latencies_ms = time.perf_counter(), planned_updates, []
        label = LABELS.get(window, window)
        log.info("%s: started%s", label, f", {planned_updates} updates" if planned_updates else "")
        if self.console is not None:
            self._start_display(label, planned_updates)

    def update_finished(self, window: str, index: int, latency_ms: float, loss: float, bucket: int | None) -> None:
        self.latencies_ms.append(latency_ms)
        if self.progress is None or self.task is None:
            return
        self.progress.advance(self.task)
        now = time.monotonic()
        if now >= self.next_refresh:
            self.progress.update(self.task, last=f"last {latency_ms:.3f} ms  loss {loss:.4g}")
            self.progress.refresh()
            self.next_refresh = now + self.refresh_s

    def window_finished(self, window: str, completed_updates: int) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress, self.task = None, None
        label, seconds = LABELS.get(window, window), time.perf_counter() - self.started
        if not self.planned:
            log.info("%s: done in %.2f s", label, seconds)
            return
        median = f", median {statistics.median(self.latencies_ms):.3f} ms" if self.latencies_ms else ""
        if completed_updates < self.planned:
            log.warning(
                "%s: stopped after %d of %d updates in %.2f s%s",
                label,
                completed_updates,
                self.planned,
                seconds,
                median,
            )
        else:
            log.info("%s: %d updates in %.2f s%s", label, completed_updates, seconds, median)

    def _start_display(self, label: str, planned_updates: int) -> None:
        columns: list[ProgressColumn] = [TextColumn("[bold]{task.description}")]
        if planned_updates:
            columns += [BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[last]}")]
        else:
            columns += [TextColumn("...")]
        # auto_refresh=False: no refresh thread; redrawn only from these hooks, between updates
        self.progress = Progress(
            *columns,
            console=self.console,
            transient=True,
            auto_refresh=False,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self.task = self.progress.add_task(label, total=planned_updates or None, last="")
        self.progress.start()
        self.next_refresh = 0.0  # the first update is shown at once


def run_observers(progress: bool, in_this_terminal: bool = True) -> list[Observer]:
    """What watches a CLI run: the log always, the live display when asked for and stderr is a terminal."""
    return [RunProgress(display=progress and in_this_terminal and sys.stderr.isatty())]


@contextmanager
def noted_if_slow(what: str, after_s: float | None = None) -> Iterator[None]:
    """Log ``WHAT: still going after N s`` once the block has run :data:`NOTICE_AFTER_S` seconds
    (``after_s``), and ``WHAT: done in N s`` (``stopped after``, where it raised) as a block that long
    ends: a population of tens of thousands of time steps plans and builds for minutes, which would
    otherwise pass in silence. A quicker block says nothing."""
    after = NOTICE_AFTER_S if after_s is None else after_s
    started, said = time.monotonic(), threading.Event()

    def say() -> None:
        log.info("%s: still going after %.0f s", what, after)
        said.set()

    timer = threading.Timer(after, say)
    timer.daemon = True
    timer.start()
    ended = "done in"
    try:
        yield
    except BaseException:  # a refusal, a signal: said as what it is, after this line
        ended = "stopped after"
        raise
    finally:
        timer.cancel()
        timer.join()  # a line being said now is said before its end
        took = time.monotonic() - started
        if said.is_set() or took >= after:
            log.info("%s: %s %.1f s", what, ended, took)
