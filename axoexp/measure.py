"""The timed loop: updates timed one by one on the host clock (and, on CUDA, by CUDA events
around the same update), and what they logged.

A run passes through windows (:data:`WINDOWS`): ``prepare`` (compile, capture), ``warmup``,
``measured`` and ``verify``. :class:`Observer` hooks run at window boundaries and after each
timed update, outside the clock: that is where anything that watches a run (a journal, a
contention guard, a progress display) does its work, so its cost never lands in a timing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

import numpy as np
import torch

from axoexp import names
from axoexp.executors.base import Executor
from axoexp.interfaces import Batch, RunLog
from axoexp.statistics import NOISE_THRESHOLD, noise_verdict, rel_iqr
from axoexp.timing import LatencySummary, device_events, elapsed_ms, synchronizer

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
def window(
    observers: Sequence[Observer], name: str, planned_updates: int = 0, trace: UpdateTrace | None = None
) -> Iterator[None]:
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
    """Per-update latencies (ms) and losses, filled in as updates complete; on CUDA also each
    update's device-clock time (ms), read after its window."""

    latencies_ms: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    device_ms: list[float] = field(default_factory=list)


def run_updates(
    executor: Executor,
    batches: list[Batch],
    count: int,
    first: int,
    trace: UpdateTrace,
    observers: Sequence[Observer] = (),
    window_name: str = MEASURED,
) -> None:
    """Time ``count`` updates, cycling through the batches.

    The clock covers exactly one update and the synchronisations around it; the loss is
    read back and the observers told after the clock stops. On CUDA two pre-created events
    are recorded around ``executor.step`` inside the same clock, and read after the last update.
    """
    device = batches[0][0].device
    sync = synchronizer(device)
    events = device_events(device, count)
    stream = torch.cuda.current_stream(device) if events else None
    completed = 0
    try:
        for index in range(first, first + count):
            inputs, targets = batches[index % len(batches)]
            sync()
            start = time.perf_counter_ns()
            if events:
                events[completed][0].record(stream)
            loss = executor.step(inputs, targets)
            if events:
                events[completed][1].record(stream)
            sync()
            latency_ms = (time.perf_counter_ns() - start) / 1e6
            completed += 1
            trace.latencies_ms.append(latency_ms)
            trace.losses.append(float(loss))
            for observer in observers:
                observer.update_finished(window_name, index, latency_ms, trace.losses[-1])
    except BaseException:
        with suppress(RuntimeError):  # a broken CUDA context must not hide the update's own error
            trace.device_ms += elapsed_ms(events, completed)
        raise
    trace.device_ms += elapsed_ms(events, completed)


def measure_until_stable(
    executor: Executor,
    batches: list[Batch],
    first: int,
    trace: UpdateTrace,
    observers: Sequence[Observer],
    block: int,
    min_time_s: float,
    max_time_s: float,
    started: float,
) -> str:
    """Adaptive measuring (``run.min_time_s``): more blocks of updates until the measured updates
    add up to ``min_time_s`` and IQR / median is at most the noise threshold, or until
    ``max_time_s`` have passed since the window began. Says which happened."""
    while True:
        measured_s = sum(trace.latencies_ms) / 1e3
        spread = rel_iqr(trace.latencies_ms)
        if measured_s >= min_time_s and spread <= NOISE_THRESHOLD:
            return (
                f"stable after {len(trace.latencies_ms)} updates ({measured_s:.2f} s measured, "
                f"IQR/median {spread:.3f} <= {NOISE_THRESHOLD})"
            )
        remaining_s = max_time_s - (time.monotonic() - started)
        if remaining_s <= 0:
            return (
                f"stopped at run.max_time_s={max_time_s:g} after {len(trace.latencies_ms)} updates "
                f"({measured_s:.2f} s measured, IQR/median {spread:.3f})"
            )
        median_s = float(np.median(trace.latencies_ms)) / 1e3
        count = max(1, min(block, math.ceil(remaining_s / median_s) if median_s > 0 else block))
        run_updates(executor, batches, count, first + len(trace.latencies_ms), trace, observers, MEASURED)


def log_traces(tracker: RunLog, warmup: UpdateTrace, measured: UpdateTrace, planned: int) -> None:
    """Log whatever completed, also when an update failed part-way."""
    tracker.log_series(names.UPDATE_SERIES, warmup.latencies_ms + measured.latencies_ms)
    tracker.log_series(names.LOSS_SERIES, warmup.losses + measured.losses)
    if warmup.device_ms or measured.device_ms:
        tracker.log_series(names.UPDATE_DEVICE_SERIES, warmup.device_ms + measured.device_ms)
    metrics = {names.MEASURED_COMPLETED: float(len(measured.latencies_ms))}
    if warmup.latencies_ms:
        metrics[names.FIRST_UPDATE] = warmup.latencies_ms[0]
    if measured.latencies_ms:
        metrics.update(LatencySummary.of(measured.latencies_ms).as_metrics(names.update_metric))
        tracker.set_tags({names.TIMING_NOISE: noise_verdict(metrics[names.UPDATE_REL_IQR])})
    if measured.device_ms:
        device = LatencySummary.of(measured.device_ms)
        metrics.update({names.device_metric(stat): getattr(device, stat) for stat in ("median", "p10", "p90")})
        overhead = np.subtract(measured.latencies_ms[: len(measured.device_ms)], measured.device_ms)
        metrics[names.HOST_OVERHEAD_MEDIAN] = float(np.median(overhead))
    losses = warmup.losses + measured.losses
    if losses:
        metrics.update({names.LOSS_INITIAL: losses[0], names.LOSS_FINAL: losses[-1]})
    tracker.log_metrics(metrics)
    if len(measured.latencies_ms) < planned:
        tracker.set_tags({names.PARTIAL: f"{len(measured.latencies_ms)} of {planned} measured updates"})


def measure_updates(
    executor: Executor,
    batches: list[Batch],
    warmup_count: int,
    measured_count: int,
    tracker: RunLog,
    observers: Sequence[Observer] = (),
    min_time_s: float = 0.0,
    max_time_s: float = math.inf,
) -> tuple[UpdateTrace, UpdateTrace]:
    """Warm-up then measured updates (more with ``min_time_s``, see :func:`measure_until_stable`);
    whatever completed is logged, also on failure."""
    warmup, measured = UpdateTrace(), UpdateTrace()
    try:
        with window(observers, WARMUP, warmup_count, warmup):
            run_updates(executor, batches, warmup_count, 0, warmup, observers, WARMUP)
        with window(observers, MEASURED, measured_count, measured):
            started = time.monotonic()
            run_updates(executor, batches, measured_count, warmup_count, measured, observers, MEASURED)
            if min_time_s > 0:
                outcome = measure_until_stable(
                    executor,
                    batches,
                    warmup_count,
                    measured,
                    observers,
                    measured_count,
                    min_time_s,
                    max_time_s,
                    started,
                )
        if min_time_s > 0:
            tracker.set_tags({names.TIMING_ADAPTIVE: outcome})
    finally:
        log_traces(tracker, warmup, measured, measured_count)
    return warmup, measured
