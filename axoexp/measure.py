"""The timed loop: updates timed one by one on the host clock (and, on CUDA, by CUDA events
around the same update), with the observers of :mod:`axoexp.windows` told between updates."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Sequence
from contextlib import suppress

import numpy as np
import torch

from axoexp import names, signals
from axoexp.executors.capture import state_preserved
from axoexp.interfaces import Batch, Executor, RunLog, length_range
from axoexp.lengths import bucket_of, by_bucket, padding_overhead
from axoexp.progress import log as run_log
from axoexp.runtime import CALIBRATION_ROUNDS, CALIBRATION_TOLERANCE, CALIBRATION_UPDATES, choose_threads
from axoexp.statistics import STABLE_THRESHOLD, LatencySummary, noise_spread, spread_name
from axoexp.timing import device_events, elapsed_ms, synchronizer
from axoexp.tracking import MILLISECOND_DIGITS
from axoexp.windows import MEASURED, WARMUP, Observer, UpdateTrace, log_traces, window


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
    read back, and the trace and the observers given it with the update's length bucket, after
    the clock stops. On CUDA two pre-created events are recorded around ``executor.step`` inside
    the same clock, and read after the last update.
    """
    device = batches[0][0].device
    sync = synchronizer(device)
    groups = length_groups(batches, first, count, executor.buckets())
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
            latency_ms = round((time.perf_counter_ns() - start) / 1e6, MILLISECOND_DIGITS)  # as logged
            loss_value = float(loss)
            bucket = None if groups is None else groups[completed]
            with signals.deferred():  # in the trace (MLflow's series) and the journal both, or neither
                completed += 1
                trace.latencies_ms.append(latency_ms)
                trace.losses.append(loss_value)
                if bucket is not None:
                    trace.buckets.append(bucket)
                for observer in observers:
                    observer.update_finished(window_name, index, latency_ms, loss_value, bucket)
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
    add up to ``min_time_s`` and their spread (IQR / median, within length buckets where the batches'
    lengths differ: :func:`~axoexp.statistics.noise_spread`) is at most the stable threshold, or until
    ``max_time_s`` have passed since the window began. Says which happened."""
    named = spread_name(length_range(batches) is not None)
    while True:
        measured_s = sum(trace.latencies_ms) / 1e3
        spread = noise_spread(trace.latencies_ms, trace.buckets)
        if measured_s >= min_time_s and spread <= STABLE_THRESHOLD:
            return (
                f"stable after {len(trace.latencies_ms)} updates ({measured_s:.2f} s measured, "
                f"{named} {spread:.3f} <= {STABLE_THRESHOLD})"
            )
        remaining_s = max_time_s - (time.monotonic() - started)
        if remaining_s <= 0:
            return (
                f"stopped at run.max_time_s={max_time_s:g} after {len(trace.latencies_ms)} updates "
                f"({measured_s:.2f} s measured, {named} {spread:.3f})"
            )
        median_s = float(np.median(trace.latencies_ms)) / 1e3
        count = max(1, min(block, math.ceil(remaining_s / median_s) if median_s > 0 else block))
        run_updates(executor, batches, count, first + len(trace.latencies_ms), trace, observers, MEASURED)


def calibrate_threads(
    executor: Executor, batches: list[Batch], first: int, candidates: Sequence[int], tracker: RunLog
) -> int:
    """Time the updates with each candidate thread count, in two rounds (ascending, then
    descending, so drift hits all alike), keep :func:`axoexp.runtime.choose_threads`'s choice and
    log it: tag ``runtime.threads`` with every candidate's mean, and
    metrics ``threads_calibration/<n>_threads_mean_ms``. Not part of the per-update series, and
    consumes no update: the module and the optimizer are restored as they were after warm-up."""
    scored: dict[int, list[float]] = {count: [] for count in candidates}
    index = first
    updates = CALIBRATION_ROUNDS * (1 + CALIBRATION_UPDATES)
    run_log.info("threads: calibrating %s, %d updates each (not measured)", ", ".join(map(str, candidates)), updates)
    started = time.perf_counter()
    with state_preserved(executor.module, executor.optimizer):
        for order in (list(candidates), list(reversed(candidates)))[:CALIBRATION_ROUNDS]:
            for count in order:
                torch.set_num_threads(count)
                trace = UpdateTrace()
                run_updates(executor, batches, 1 + CALIBRATION_UPDATES, index, trace)
                index += 1 + CALIBRATION_UPDATES
                scored[count] += trace.latencies_ms[1:]  # the first pays for the pool's change
    means = {count: float(np.mean(values)) for count, values in scored.items()}
    chosen = choose_threads(means)
    torch.set_num_threads(chosen)
    timed = ", ".join(f"{count}: {mean:.3f} ms" for count, mean in means.items())
    run_log.info("threads: %d chosen in %.2f s (mean update %s)", chosen, time.perf_counter() - started, timed)
    tracker.log_metrics({names.threads_calibration_metric(count): mean for count, mean in means.items()})
    tracker.set_tags(
        {
            names.RUNTIME_THREADS: f"{chosen} (calibrated after warm-up: the fewest threads within "
            f"{CALIBRATION_TOLERANCE:g}x of the fastest mean update; {timed})"
        }
    )
    return chosen


def measure_updates(
    executor: Executor,
    batches: list[Batch],
    warmup_count: int,
    measured_count: int,
    tracker: RunLog,
    observers: Sequence[Observer] = (),
    min_time_s: float = 0.0,
    max_time_s: float = math.inf,
    thread_candidates: Sequence[int] = (),
) -> tuple[UpdateTrace, UpdateTrace, float]:
    """Warm-up, the thread calibration where there are ``thread_candidates``
    (:func:`calibrate_threads`), then measured updates (more with ``min_time_s``, see
    :func:`measure_until_stable`); whatever completed is logged, also on failure. Returns the
    traces and the measured updates' noise spread, as logged (:func:`~axoexp.windows.log_traces`)."""
    warmup, measured = UpdateTrace(), UpdateTrace()
    try:
        with window(observers, WARMUP, warmup_count, warmup):
            run_updates(executor, batches, warmup_count, 0, warmup, observers, WARMUP)
        if thread_candidates:
            calibrate_threads(executor, batches, warmup_count, thread_candidates, tracker)
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
        spread = log_traces(tracker, warmup, measured, measured_count)
    assert spread is not None  # run.measured_updates is at least 1, and every one completed
    return warmup, measured, spread


def update_lengths(batches: list[Batch], first: int, count: int) -> list[int]:
    """The time steps of updates ``first``, ``first`` + 1, ..., ``count`` of them (batches cycled)."""
    return [int(batches[(first + index) % len(batches)][0].shape[-2]) for index in range(count)]


def length_groups(batches: list[Batch], first: int, count: int, buckets: tuple[int, ...] | None) -> list[int] | None:
    """The length bucket of each of ``count`` updates from ``first`` (``buckets`` ``None``: its exact
    length), which its noise is judged within (:func:`~axoexp.statistics.noise_spread`); ``None`` where
    every batch has one length."""
    if length_range(batches) is None:
        return None
    lengths = update_lengths(batches, first, count)
    return lengths if buckets is None else [bucket_of(length, buckets) for length in lengths]


def length_tags(buckets: tuple[int, ...] | None, batches: list[Batch]) -> dict[str, str]:
    """Tag :data:`~axoexp.names.LENGTH_BUCKETS` where the batches' lengths differ: the executor's buckets, or
    ``exact`` where it runs each batch at its own length; none where every batch has one length."""
    if length_range(batches) is None:
        return {}
    return {names.LENGTH_BUCKETS: ",".join(map(str, buckets)) if buckets else names.LENGTH_BUCKETS_EXACT}


def length_metrics(
    latencies_ms: list[float], batches: list[Batch], first: int, buckets: tuple[int, ...] | None
) -> dict[str, float]:
    """Per-bucket order statistics and the padding overhead of updates ``first``, ``first`` + 1, ...
    (batches cycled; ``buckets`` ``None``: each length its own bucket, unpadded); empty when every
    batch has one length."""
    lengths = update_lengths(batches, first, len(latencies_ms))
    if length_range(batches) is None or not lengths:
        return {}
    buckets = buckets or tuple(sorted(set(lengths)))
    metrics = {names.PADDING_OVERHEAD: padding_overhead(lengths, buckets)}
    for bucket, samples in by_bucket(latencies_ms, lengths, buckets).items():
        summary = LatencySummary.of(samples)
        metrics.update(summary.as_metrics(functools.partial(names.bucket_update_metric, bucket)))
    return metrics
