"""NVML readings of a CUDA GPU: who else uses it, its clocks, temperature, throttling and free memory.

Found by UUID, so ``CUDA_VISIBLE_DEVICES`` cannot mislead; used by the contention guard at window
boundaries and by planning, which reads free memory without creating a CUDA context.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuSample:
    other_processes: int  # present: holding a context on the GPU, busy or idle
    busy_other_processes: int | None  # that used it since the window began; None: no samples kept here
    sm_clock_mhz: float
    temperature_c: float
    throttle_reasons: int
    memory_used_mb: float
    memory_percent: float
    utilization_percent: float
    power_w: float


def _others(pids: set[int]) -> int:
    """How many of ``pids`` are other processes than this one. In a container NVML may list
    host PIDs, so when our PID is absent one listed process is taken to be this one."""
    ours = os.getpid()
    return len(pids - {ours}) if ours in pids else max(len(pids) - 1, 0)


def _visible_handle(nvml: Any, index: int) -> Any:
    """NVML's handle of CUDA device ``index`` as this process sees it, found without initialising
    CUDA: a process that initialised CUDA cannot fork a child that uses it (a sweep forks every
    job). ``CUDA_VISIBLE_DEVICES`` maps the index (NVML counts in PCI bus order, as CUDA does
    with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; on one GPU the two agree)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return nvml.nvmlDeviceGetHandleByIndex(index)
    entry = visible.split(",")[index].strip()
    if entry.isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(entry))
    return nvml.nvmlDeviceGetHandleByUUID(entry.encode())


def cuda_present() -> bool:
    """Whether this process sees a CUDA GPU, asked without poisoning fork: ``torch.cuda.is_available()``
    initialises the CUDA driver (``cudaGetDeviceCount``), and no process forked after that (a sweep's
    job) can use CUDA; ``torch.cuda.device_count()`` asks NVML first while CUDA is uninitialised."""
    return torch.cuda.device_count() > 0


class GpuProbe:
    """NVML readings of the run's GPU (found by UUID, so CUDA_VISIBLE_DEVICES cannot mislead)."""

    def __init__(self, device: torch.device) -> None:
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        if not torch.cuda.is_initialized():  # e.g. planning in a sweep's process, which forks its jobs
            self.handle = _visible_handle(pynvml, device.index or 0)
        else:
            index = device.index if device.index is not None else torch.cuda.current_device()
            uuid = str(torch.cuda.get_device_properties(index).uuid)
            try:
                self.handle = pynvml.nvmlDeviceGetHandleByUUID(
                    (uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}").encode()
                )
            except (pynvml.NVMLError, TypeError):
                self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.reasons = (
            getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        )

    def _read(self, call: Callable[[], Any], default: Any) -> Any:
        try:
            return call()
        except self.nvml.NVMLError:
            return default

    def other_processes(self) -> int:
        """Compute processes on the GPU other than this one (counted as ``_others`` counts)."""
        return _others(
            {
                process.pid
                for process in self._read(lambda: self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle), [])
            }
        )

    def free_bytes(self) -> int | None:
        """The GPU's free memory, read without creating a CUDA context."""
        memory = self._read(lambda: self.nvml.nvmlDeviceGetMemoryInfo(self.handle), None)
        return None if memory is None else int(memory.free)

    def busy_other_processes(self, since_us: int) -> int | None:
        """Processes other than this one with SM or memory activity in NVML's per-process
        samples newer than ``since_us`` (µs since the epoch); None where NVML keeps none."""
        try:
            samples = self.nvml.nvmlDeviceGetProcessUtilization(self.handle, since_us)
        except self.nvml.NVMLError as error:
            if isinstance(error, getattr(self.nvml, "NVMLError_NotFound", ())):
                return 0  # no process had a sample in the window
            return None
        return _others({sample.pid for sample in samples if sample.smUtil or sample.memUtil})

    def take(self, since_us: int | None = None) -> GpuSample:
        """Readings now; with ``since_us`` also which processes used the GPU since then."""
        nvml, handle = self.nvml, self.handle
        memory = self._read(lambda: nvml.nvmlDeviceGetMemoryInfo(handle), None)
        utilization = self._read(lambda: nvml.nvmlDeviceGetUtilizationRates(handle), None)
        return GpuSample(
            other_processes=self.other_processes(),
            busy_other_processes=None if since_us is None else self.busy_other_processes(since_us),
            sm_clock_mhz=float(self._read(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM), "nan")),
            temperature_c=float(
                self._read(lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU), "nan")
            ),
            throttle_reasons=int(self._read(lambda: self.reasons(handle), 0)),
            memory_used_mb=memory.used / 1e6 if memory else float("nan"),
            memory_percent=memory.used / memory.total * 100 if memory else float("nan"),
            utilization_percent=float(utilization.gpu) if utilization else float("nan"),
            power_w=float(self._read(lambda: nvml.nvmlDeviceGetPowerUsage(handle), "nan")) / 1000,
        )


def gpu_probe(device: torch.device) -> GpuProbe | None:
    """A probe of ``device`` where it is a CUDA GPU and NVML works; else ``None`` (with a warning on CUDA)."""
    if device.type != "cuda":
        return None
    try:
        return GpuProbe(device)
    except Exception as error:
        log.warning("contention guard: no NVML readings of %s (%s); only CPU contention is checked", device, error)
        return None
