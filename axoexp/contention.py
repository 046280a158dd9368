"""The contention guard: was anything else competing for the machine while a window was timed?

:class:`ContentionGuard` is an :class:`~axoexp.measure.Observer`. It samples at the start and
end of each timed window (``prepare``, ``warmup``, ``measured``) and never inside one:

- ``cpu``: CPU time that other processes used on the CPUs this process may run on (busy
  time of those CPUs from ``/proc/stat`` through psutil, minus this process's and its
  children's own CPU time). Seen when it exceeds :data:`CPU_OTHER_THRESHOLD` of those CPUs'
  capacity over the window, plus :data:`TICKS_PER_CPU` clock ticks per CPU (the counters'
  resolution, at either end of the window).
- ``gpu-shared`` (CUDA): another process used the run's GPU during the window (NVML's
  per-process utilization samples). Where the driver keeps no such samples, another compute
  process present on the GPU at either end of the window counts, busy or idle.
- ``gpu-throttled`` (CUDA): a clock-reducing reason (power cap, thermal or hardware slowdown)
  at either end of the window; idle and application-clock settings are not reasons.

The SM clock, temperature and the figures above are logged as metrics per window, and the
same boundary samples give MLflow-style system metrics (``system/...``, step = window index),
so nothing samples while an update is timed.
"""

from __future__ import annotations

import logging
import os
import resource
import time
from dataclasses import dataclass, field
from typing import Any

import psutil
import torch

from axoexp import names
from axoexp.errors import ContentionError
from axoexp.interfaces import RunLog
from axoexp.nvml import GpuSample, gpu_probe
from axoexp.runtime import allowed_cpus
from axoexp.windows import MEASURED, PREPARE, WARMUP, WINDOWS, Observer

GUARDED = (PREPARE, WARMUP, MEASURED)
CPU_OTHER_THRESHOLD = 0.10
"""Other processes' share of the allowed CPUs' capacity above which a window counts as contended."""
TICK_S = 1 / os.sysconf("SC_CLK_TCK")
TICKS_PER_CPU = 2
"""The error of a window's busy time per CPU, in clock ticks: /proc/stat counts whole ticks, and a
tickless kernel adds them late, so each end of a window can be a tick off. With one tick, windows
of a few ms on a busy host said other processes used 411% of 2 CPUs (0.04 CPU-s in 0.005 s)."""
CPU, GPU_SHARED, GPU_THROTTLED = "cpu", "gpu-shared", "gpu-throttled"
NONE = "none"
THROTTLE_REASONS = {  # NVML clocks-event reasons that slow a kernel; idle (0x1), app clocks (0x2),
    0x4: "sw-power-cap",
    0x8: "hw-slowdown",  # sync boost (0x10) and display clocks (0x100) do not
    0x20: "sw-thermal",
    0x40: "hw-thermal",
    0x80: "hw-power-brake",
}

log = logging.getLogger(__name__)


def _busy_seconds(times: Any) -> float:
    """Busy time of one CPU as psutil's cpu_percent counts it: all but idle and iowait
    (guest time is already inside user time on Linux)."""
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return total - times.idle - getattr(times, "iowait", 0.0)


def own_cpu_seconds() -> float:
    """CPU time of this process, its reaped children and its live descendants (e.g. compile workers)."""
    seconds = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        seconds += usage.ru_utime + usage.ru_stime
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:
            continue
        seconds += times.user + times.system
    return seconds


@dataclass(frozen=True)
class CpuSample:
    wall_s: float
    allowed_busy_s: float  # summed over the CPUs this process may use
    all_busy_s: float  # summed over every CPU (for system/cpu_utilization_percentage)
    own_s: float

    @classmethod
    def take(cls, cpus: list[int]) -> CpuSample:
        per_cpu = psutil.cpu_times(percpu=True)
        busy = [_busy_seconds(times) for times in per_cpu]
        allowed = sum(busy[cpu] for cpu in cpus if cpu < len(busy))
        return cls(time.monotonic(), allowed, sum(busy), own_cpu_seconds())


@dataclass
class WindowContention:
    """What one window saw."""

    window: str
    kinds: list[str]
    detail: str
    metrics: dict[str, float]
    system: dict[str, float]


@dataclass
class ContentionGuard(Observer):
    """Samples CPU and GPU at the boundaries of the prepare, warm-up and measured windows, and judges each."""

    device: torch.device
    cpus: list[int] = field(default_factory=allowed_cpus)
    windows: list[WindowContention] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.gpu = gpu_probe(self.device)
        self._start: dict[str, tuple[CpuSample, GpuSample | None, int]] = {}  # and when it began, in µs

    def window_started(self, window: str, planned_updates: int) -> None:
        if window not in GUARDED:
            return
        self._start[window] = (CpuSample.take(self.cpus), self.gpu.take() if self.gpu else None, time.time_ns() // 1000)

    def window_finished(self, window: str, completed_updates: int) -> None:
        if window not in GUARDED:
            return
        start_cpu, start_gpu, since_us = self._start.pop(window)
        end_cpu, end_gpu = CpuSample.take(self.cpus), self.gpu.take(since_us) if self.gpu else None
        self.windows.append(self._judge(window, start_cpu, end_cpu, start_gpu, end_gpu))

    def _judge(
        self, window: str, start: CpuSample, end: CpuSample, start_gpu: GpuSample | None, end_gpu: GpuSample | None
    ) -> WindowContention:
        wall = max(end.wall_s - start.wall_s, 1e-9)
        capacity = wall * len(self.cpus)
        other = max((end.allowed_busy_s - start.allowed_busy_s) - (end.own_s - start.own_s), 0.0)
        kinds, details = [], []
        if other > CPU_OTHER_THRESHOLD * capacity + TICKS_PER_CPU * TICK_S * len(self.cpus):
            kinds.append(CPU)
            details.append(  # at most all of them: the ticks' rounding can pass 100%
                f"other processes used {min(other / capacity, 1.0):.0%} of the {len(self.cpus)} allowed CPUs "
                f"({other:.2f} CPU-s in {wall:.2f} s)"
            )
        metrics = {"cpu_other": other / capacity, "wall_s": wall}
        all_busy = (end.all_busy_s - start.all_busy_s) / (wall * (psutil.cpu_count() or 1))
        system = {"cpu_utilization_percentage": min(all_busy, 1.0) * 100}  # tick rounding can pass 100
        memory = psutil.virtual_memory()
        system.update(system_memory_usage_megabytes=memory.used / 1e6, system_memory_usage_percentage=memory.percent)
        if start_gpu is not None and end_gpu is not None:
            present = max(start_gpu.other_processes, end_gpu.other_processes)
            busy = end_gpu.busy_other_processes
            sharing = present if busy is None else busy
            reasons = start_gpu.throttle_reasons | end_gpu.throttle_reasons
            slowing = [label for bit, label in THROTTLE_REASONS.items() if reasons & bit]
            if sharing:
                kinds.append(GPU_SHARED)
                details.append(
                    f"{sharing} other compute process(es) on the GPU"
                    if busy is None
                    else f"{sharing} other process(es) used the GPU"
                )
            if slowing:
                kinds.append(GPU_THROTTLED)
                details.append(f"GPU clocks reduced ({', '.join(slowing)})")
            metrics.update(
                gpu_other_processes=float(present),
                gpu_busy_other_processes=float(sharing),
                gpu_sm_clock_mhz=end_gpu.sm_clock_mhz,
                gpu_temperature_c=end_gpu.temperature_c,
                gpu_throttle_reasons=float(reasons),
            )
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            system.update(
                {
                    f"gpu_{index}_memory_usage_megabytes": end_gpu.memory_used_mb,
                    f"gpu_{index}_memory_usage_percentage": end_gpu.memory_percent,
                    f"gpu_{index}_utilization_percentage": end_gpu.utilization_percent,
                    f"gpu_{index}_power_usage_watts": end_gpu.power_w,
                }
            )
        return WindowContention(window, kinds, f"{window}: {'; '.join(details)}" if details else "", metrics, system)

    @property
    def kinds(self) -> list[str]:
        """What was seen in any guarded window, in a fixed order."""
        seen = {kind for seen in self.windows for kind in seen.kinds}
        return [kind for kind in (CPU, GPU_SHARED, GPU_THROTTLED) if kind in seen]

    def verdict(self) -> str:
        """``none`` or a comma list, the value of tag ``timing.contention``."""
        return ",".join(self.kinds) or NONE

    def detail(self) -> str:
        return " | ".join(seen.detail for seen in self.windows if seen.detail) or "nothing seen"

    def log_to(self, tracker: RunLog) -> None:
        """Tags, per-window metrics and system metrics (step = window index), and a console warning."""
        tracker.set_tags({names.TIMING_CONTENTION: self.verdict(), names.TIMING_CONTENTION_DETAIL: self.detail()})
        tracker.log_metrics(
            {
                names.contention_metric(seen.window, figure): value
                for seen in self.windows
                for figure, value in seen.metrics.items()
            }
        )
        for seen in self.windows:
            tracker.log_metrics(
                {names.system_metric(figure): value for figure, value in seen.system.items()},
                step=WINDOWS.index(seen.window),
            )
        if self.kinds:
            log.warning(
                "timing.contention=%s: the timings of this run were disturbed (%s)", self.verdict(), self.detail()
            )

    def raise_if_contended(self) -> None:
        if self.kinds:
            raise ContentionError(
                f"timing.contention={self.verdict()} and run.require_quiet=true: {self.detail()}; "
                "what was measured is logged; rerun on a quiet machine or set run.require_quiet=false"
            )
