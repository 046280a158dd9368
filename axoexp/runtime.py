"""Process-wide torch settings, applied once before any device work."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from axoexp import names

MAX_AUTO_THREADS = 16
"""``run.threads=null`` tries (on the CPU) or uses (on a GPU) at most this many threads: the
updates axoexp times are small, and past 16 threads intra-op parallelism mostly adds synchronisation."""
CALIBRATION_TOLERANCE = 1.05
"""Calibration keeps the fewest threads whose mean update is within this factor of the fastest
candidate's: fewer threads are as fast and far less fragile when another process wants the CPUs."""
CALIBRATION_UPDATES = 5
"""Scored updates per thread count and round of the calibration (after one unscored one)."""
CALIBRATION_ROUNDS = 2
"""Rounds of the calibration: ascending, then descending thread counts, so drift hits all alike."""


def calibration_updates(candidates: tuple[int, ...]) -> int:
    """Updates a calibration among ``candidates`` runs (not measured, and consuming none)."""
    return CALIBRATION_ROUNDS * len(candidates) * (1 + CALIBRATION_UPDATES)


def configure_determinism(determinism: DictConfig) -> None:
    """Apply the run's determinism settings (``determinism.*``)."""
    if determinism.deterministic_algorithms:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    wanted = bool(determinism.deterministic_algorithms)
    if wanted or torch.are_deterministic_algorithms_enabled():
        # torch.use_deterministic_algorithms also sets inductor's flag, importing dynamo and inductor
        # (seconds); off is both flags' default, so a run that keeps it off skips that import
        torch.use_deterministic_algorithms(wanted)
    torch.backends.cudnn.benchmark = bool(determinism.cudnn_benchmark)
    torch.set_float32_matmul_precision(str(determinism.float32_matmul_precision))


def allowed_cpus() -> list[int]:
    """The CPUs in this process's affinity mask (all online CPUs where there is no mask)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def cpu_list(cpus: list[int]) -> str:
    """``[0, 1, 2, 3, 8]`` as ``0-3,8``."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][-1] + 1:
            runs[-1].append(cpu)
        else:
            runs.append([cpu])
    return ",".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


@dataclass(frozen=True)
class Threads:
    """The intra-op thread count a run uses, and why."""

    count: int
    cpus: list[int]
    how: str
    candidates: tuple[int, ...] = ()  # run.threads=null on the CPU: the counts calibrated after warm-up

    def tags(self) -> dict[str, str]:
        return {names.RUNTIME_THREADS: f"{self.count} ({self.how})", names.RUNTIME_CPU_AFFINITY: cpu_list(self.cpus)}


def thread_candidates(cpus: int) -> tuple[int, ...]:
    """The thread counts calibration tries on ``cpus`` CPUs: 1, 2, 4, 8, ... and the largest
    allowed, at most :data:`MAX_AUTO_THREADS`."""
    top = min(cpus, MAX_AUTO_THREADS)
    return tuple(sorted({1, top, *(2**power for power in range(1, 5) if 2**power < top)}))


def choose_threads(mean_ms: Mapping[int, float]) -> int:
    """The fewest threads whose mean update is within :data:`CALIBRATION_TOLERANCE` of the fastest.

    The mean, not the median: a thread pool oversubscribed by another process mostly stalls
    now and then (on 2 CPUs beside one busy loop: median 1.39 ms, mean 7.25 ms with 2 threads;
    1.28 and 1.30 ms with 1), which a median hides."""
    fastest = min(mean_ms.values())
    return min(count for count, mean in mean_ms.items() if mean <= fastest * CALIBRATION_TOLERANCE)


def configure_threads(threads: int | None, device_type: str = "cpu", measured_updates: int | None = None) -> Threads:
    """``torch.set_num_threads``: ``threads``; or with ``None`` on the CPU, 1 until the
    calibration after warm-up (:func:`axoexp.measure.calibrate_threads`) chooses among
    :func:`thread_candidates`, unless the run measures fewer updates than the calibration would
    take (``measured_updates``; it then keeps 1, the count that holds under load); or with
    ``None`` on a GPU, one per allowed CPU, at most
    :data:`MAX_AUTO_THREADS`, so torch's pool never oversubscribes the CPUs the process may use.

    Inter-op threads are left alone: the updates use no inter-op parallelism, and torch
    refuses to change them once a process has used them (a sweep runs many jobs in one).
    """
    cpus = allowed_cpus()
    candidates: tuple[int, ...] = ()
    if threads is not None:
        count, how = int(threads), "run.threads"
    elif device_type == "cpu" and len(cpus) > 1:
        candidates = thread_candidates(len(cpus))
        count, how = 1, f"calibrating among {', '.join(map(str, candidates))} after warm-up"
        cost = calibration_updates(candidates)
        if measured_updates is not None and measured_updates < cost:
            candidates = ()
            how = (
                f"not calibrated: run.measured_updates={measured_updates} is fewer than the {cost} updates "
                "calibration takes; 1 thread, the count that holds under load"
            )
    else:
        count, how = min(len(cpus), MAX_AUTO_THREADS), f"auto: {len(cpus)} CPUs allowed, at most {MAX_AUTO_THREADS}"
    torch.set_num_threads(count)
    return Threads(count, cpus, how, candidates)
