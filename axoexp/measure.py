"""The timed loop: updates timed one by one on the host clock, and what they logged.

A run passes through windows (:data:`WINDOWS`): ``prepare`` (compile, capture), ``warmup``,
``measured`` and ``verify``. :class:`Observer` hooks run at window boundaries and after each
timed update, outside the clock: that is where anything that watches a run (a journal, a
contention guard, a progress display) does its work, so its cost never lands in a timing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from axoexp import names
from axoexp.executors.base import Executor
from axoexp.interfaces import Batch
from axoexp.timing import LatencySummary, synchronizer

if TYPE_CHECKING:  # tracking's run context (axoexp.journal) is itself an Observer
    from axoexp.tracking import RunLog

PREPARE, WARMUP, MEASURED, VERIFY = "prepare", "warmup", "measured", "verify"
WINDOWS = (PREPARE, WARMUP, MEASURED, VERIFY)


class Observer:
    """Watches a run between timed updates, never inside one. The base class does nothing."""

    def window_started(self, window: str, planned_updates: int) -> None:
        """``window`` begins; it will time ``planned_updates`` updates (0 for prepare/verify)."""

    def update_finished(self, window: str, index: int, latency_ms: float, loss: float) -> None:
        """Update ``index`` (counted from the run's first update) took ``latency_ms``."""

    def window_finished(self, window: str, completed_updates: int) -> None:
        """``window`` ended, normally or not, after ``completed_updates`` updates."""


@contextmanager
def window(observers: Sequence[Observer], name: str, planned_updates: int = 0,
           trace: UpdateTrace | None = None) -> Iterator[None]:
    """Tell ``observers`` that window ``name`` starts and, however it ends, that it ended."""
    for observer in observers:
        observer.window_started(name, planned_updates)
    try:
        yield
    finally:
        for observer in observers:
            observer.window_finished(name, len(trace.latencies_ms) if trace is not None else 0)


@dataclass
class UpdateTrace:
    """Per-update latencies (ms) and losses, filled in as updates complete."""

    latencies_ms: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)


def run_updates(executor: Executor, batches: list[Batch], count: int, first: int, trace: UpdateTrace,
                observers: Sequence[Observer] = (), window_name: str = MEASURED) -> None:
    """Time ``count`` updates, cycling through the batches.

    The clock covers exactly one update and the synchronisations around it; the loss is
    read back and the observers told after the clock stops.
    """
    sync = synchronizer(batches[0][0].device)
    for index in range(first, first + count):
        inputs, targets = batches[index % len(batches)]
        sync()
        start = time.perf_counter_ns()
        loss = executor.step(inputs, targets)
        sync()
        latency_ms = (time.perf_counter_ns() - start) / 1e6
        trace.latencies_ms.append(latency_ms)
        trace.losses.append(float(loss))
        for observer in observers:
            observer.update_finished(window_name, index, latency_ms, trace.losses[-1])


def log_traces(tracker: RunLog, warmup: UpdateTrace, measured: UpdateTrace, planned: int) -> None:
    """Log whatever completed, also when an update failed part-way."""
    tracker.log_series(names.UPDATE_SERIES, warmup.latencies_ms + measured.latencies_ms)
    tracker.log_series(names.LOSS_SERIES, warmup.losses + measured.losses)
    metrics = {names.MEASURED_COMPLETED: float(len(measured.latencies_ms))}
    if warmup.latencies_ms:
        metrics[names.FIRST_UPDATE] = warmup.latencies_ms[0]
    if measured.latencies_ms:
        metrics.update(LatencySummary.of(measured.latencies_ms).as_metrics(names.update_metric))
    losses = warmup.losses + measured.losses
    if losses:
        metrics.update({names.LOSS_INITIAL: losses[0], names.LOSS_FINAL: losses[-1]})
    tracker.log_metrics(metrics)
    if len(measured.latencies_ms) < planned:
        tracker.set_tags({names.PARTIAL: f"{len(measured.latencies_ms)} of {planned} measured updates"})


def measure_updates(
    executor: Executor, batches: list[Batch], warmup_count: int, measured_count: int, tracker: RunLog,
    observers: Sequence[Observer] = (),
) -> tuple[UpdateTrace, UpdateTrace]:
    """Warm-up then measured updates; whatever completed is logged, also on failure."""
    warmup, measured = UpdateTrace(), UpdateTrace()
    try:
        with window(observers, WARMUP, warmup_count, warmup):
            run_updates(executor, batches, warmup_count, 0, warmup, observers, WARMUP)
        with window(observers, MEASURED, measured_count, measured):
            run_updates(executor, batches, measured_count, warmup_count, measured, observers, MEASURED)
    finally:
        log_traces(tracker, warmup, measured, measured_count)
    return warmup, measured
