"""The windows of a run, the observers that watch them and the traces their updates leave.

A run passes through windows (:data:`WINDOWS`): ``prepare`` (compile, capture), ``warmup``,
``measured`` and ``verify``. :class:`Observer` hooks run at window boundaries and after each
timed update, outside the clock: that is where anything that watches a run (a journal, a
contention guard, a progress display) does its work, so its cost never lands in a timing.
:func:`log_traces` logs what the updates of a run left, live and when a journal is replayed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from axoexp import names
from axoexp.interfaces import MetricsLog
from axoexp.statistics import LatencySummary, noise_spread, noise_verdict

PREPARE, WARMUP, MEASURED, VERIFY = "prepare", "warmup", "measured", "verify"
WINDOWS = (PREPARE, WARMUP, MEASURED, VERIFY)


class Observer:
    """Watches a run between timed updates, never inside one. The base class does nothing."""

    def window_started(self, window: str, planned_updates: int) -> None:
        """``window`` begins; it will time ``planned_updates`` updates (0 for prepare/verify)."""

    def update_finished(self, window: str, index: int, latency_ms: float, loss: float, bucket: int | None) -> None:
        """Update ``index`` (counted from the run's first update) took ``latency_ms``; ``bucket``: the length
        bucket its noise is judged within (:attr:`UpdateTrace.buckets`), ``None`` where every batch has one length."""

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
    """Per-update latencies (ms) and losses, filled in as updates complete; where the batches' lengths
    differ, each update's length bucket (the executor's, eager: its exact length), which its noise is
    judged within (:func:`~axoexp.statistics.noise_spread`); on CUDA also each update's device-clock
    time (ms), read after its window."""

    latencies_ms: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    buckets: list[int] = field(default_factory=list)  # empty where every batch has one length
    device_ms: list[float] = field(default_factory=list)


def log_traces(tracker: MetricsLog, warmup: UpdateTrace, measured: UpdateTrace, planned: int) -> float | None:
    """Log whatever completed, also when an update failed part-way; return the noise spread logged
    (None where no update was measured), judged within the measured updates' length buckets where
    the trace has them."""
    spread = None
    tracker.log_series(names.UPDATE_SERIES, warmup.latencies_ms + measured.latencies_ms)
    tracker.log_series(names.LOSS_SERIES, warmup.losses + measured.losses)
    if warmup.device_ms or measured.device_ms:
        tracker.log_series(names.UPDATE_DEVICE_SERIES, warmup.device_ms + measured.device_ms)
    metrics = {names.MEASURED_COMPLETED: float(len(measured.latencies_ms))}
    if warmup.latencies_ms:
        metrics[names.FIRST_UPDATE] = warmup.latencies_ms[0]
    if measured.latencies_ms:
        metrics.update(LatencySummary.of(measured.latencies_ms).as_metrics(names.update_metric))
        aligned = len(measured.buckets) == len(measured.latencies_ms)  # else (a journal's records mixed) not known
        spread = metrics[names.NOISE_SPREAD] = noise_spread(
            measured.latencies_ms, measured.buckets if aligned else None
        )
        tracker.set_tags({names.TIMING_NOISE: noise_verdict(spread)})
    if measured.device_ms:
        device = LatencySummary.of(measured.device_ms)
        metrics.update({names.device_metric(stat): getattr(device, stat) for stat in names.DEVICE_STATS})
        overhead = np.subtract(measured.latencies_ms[: len(measured.device_ms)], measured.device_ms)
        metrics[names.HOST_OVERHEAD_MEDIAN] = float(np.median(overhead))
    losses = warmup.losses + measured.losses
    if losses:
        metrics.update({names.LOSS_INITIAL: losses[0], names.LOSS_FINAL: losses[-1]})
    tracker.log_metrics(metrics)
    if len(measured.latencies_ms) < planned:
        tracker.set_tags({names.PARTIAL: f"{len(measured.latencies_ms)} of {planned} measured updates"})
    return spread
