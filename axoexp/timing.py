"""Host-clock timing around device synchronisation, and latency summaries."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import numpy as np
import torch

CLOCK = "time.perf_counter_ns on the host; the device is synchronised before the clock starts and before it stops"


def synchronizer(device: torch.device) -> Callable[[], None]:
    """A no-argument call that waits for all queued work on ``device``."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


@contextmanager
def stopwatch(sync: Callable[[], None], into: dict[str, float], name: str) -> Iterator[None]:
    """Time a phase in milliseconds into ``into[name]``, synchronising at both ends."""
    sync()
    start = time.perf_counter_ns()
    yield
    sync()
    into[name] = (time.perf_counter_ns() - start) / 1e6


@dataclass(frozen=True)
class LatencySummary:
    """Order statistics of per-update latencies, in milliseconds."""

    count: int
    median: float
    p10: float
    p90: float
    mean: float
    min: float
    max: float

    @classmethod
    def of(cls, samples_ms: list[float]) -> LatencySummary:
        if not samples_ms:
            raise ValueError("no latency samples to summarise")
        values = np.asarray(samples_ms, dtype=np.float64)
        p10, median, p90 = np.percentile(values, [10, 50, 90])
        return cls(
            count=len(values), median=float(median), p10=float(p10), p90=float(p90),
            mean=float(values.mean()), min=float(values.min()), max=float(values.max()),
        )

    def as_metrics(self, metric_name: Callable[[str], str]) -> dict[str, float]:
        """Each statistic under ``metric_name(statistic)``, e.g. :func:`axoexp.names.update_metric`."""
        return {metric_name(key): float(value) for key, value in asdict(self).items()}
