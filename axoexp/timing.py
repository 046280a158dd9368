"""Host-clock timing around device synchronisation and the CUDA-event device clock."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

CLOCK = "time.perf_counter_ns on the host; the device is synchronised before the clock starts and before it stops"
DEVICE_CLOCK = (
    "CUDA events recorded on the current stream right before and right after executor.step, inside the host clock: "
    "the GPU time from the first to the last work the update queued on that stream (for a CUDA graph replay, the "
    "whole graph), including gaps in which the GPU waited for the host to queue more; read after the window"
)
EventPair = tuple[torch.cuda.Event, torch.cuda.Event]


def synchronizer(device: torch.device) -> Callable[[], None]:
    """A no-argument call that waits for all queued work on ``device``."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def device_events(device: torch.device, count: int) -> list[EventPair] | None:
    """``count`` pairs of timing events on ``device`` (``None`` off CUDA), each recorded once and
    synchronised here, so that no CUDA event is created inside a timed update."""
    if device.type != "cuda":
        return None
    stream = torch.cuda.current_stream(device)
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(count)]
    for begin, end in pairs:
        begin.record(stream)
        end.record(stream)
    torch.cuda.synchronize(device)
    return pairs


def elapsed_ms(pairs: list[EventPair] | None, count: int) -> list[float]:
    """Device time (ms) between each of the first ``count`` pairs' events, once they have completed."""
    return [begin.elapsed_time(end) for begin, end in (pairs or [])[:count]]


@contextmanager
def stopwatch(sync: Callable[[], None], into: dict[str, float], name: str) -> Iterator[None]:
    """Time a phase in milliseconds into ``into[name]``, synchronising at both ends."""
    sync()
    start = time.perf_counter_ns()
    yield
    sync()
    into[name] = (time.perf_counter_ns() - start) / 1e6


def gpu_activities(run: Callable[[], object], device: torch.device) -> Counter[str]:
    """The GPU activities ``run`` causes on ``device`` (kernels, memory copies, memsets), counted by
    name, as torch.profiler (CUPTI) records them; a CUDA graph replay's are listed one by one.
    Copies are named ``Memcpy ...`` and memsets ``Memset ...`` (:func:`activity_kinds`)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        run()
        torch.cuda.synchronize(device)
    return Counter(event.name for event in profiler.events() if event.device_type == DeviceType.CUDA)


def activity_kinds(activities: Counter[str]) -> dict[str, int]:
    """``{"kernel": N, "memcpy": N, "memset": N}`` of :func:`gpu_activities`' counts."""
    kinds = dict.fromkeys(("kernel", "memcpy", "memset"), 0)
    for name, count in activities.items():
        kind = "memcpy" if name.startswith("Memcpy") else "memset" if name.startswith("Memset") else "kernel"
        kinds[kind] += count
    return kinds
