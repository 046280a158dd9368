"""How much to trust a latency: spread (relative IQR), a noise verdict, and a bootstrap
interval for the ratio of two medians (a speedup).

The noise threshold is torch.utils.benchmark's: its adaptive autorange stops measuring once
IQR / median falls below 0.1, and so do axoexp's (``run.min_time_s``) and its verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

NOISE_THRESHOLD = 0.10
"""IQR / median above this is ``high`` noise (torch.utils.benchmark's adaptive-autorange threshold)."""
LOW, HIGH = "low", "high"
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95
_CHUNK_VALUES = 2_000_000  # resampled values held in memory at once


def rel_iqr(samples: Sequence[float]) -> float:
    """(p75 - p25) / median: the spread of a latency relative to its typical value."""
    values = np.asarray(samples, dtype=np.float64)
    if values.size == 0:
        raise ValueError("no samples")
    p25, median, p75 = np.percentile(values, [25, 50, 75])
    return float((p75 - p25) / median) if median > 0 else float("inf")


def noise_verdict(relative_iqr: float) -> str:
    """``low`` when IQR / median is at most :data:`NOISE_THRESHOLD`, else ``high``."""
    return LOW if relative_iqr <= NOISE_THRESHOLD else HIGH


@dataclass(frozen=True)
class Interval:
    """A point estimate and its two-sided percentile-bootstrap interval."""

    estimate: float
    low: float
    high: float


def median_ratio_interval(
    numerator: Sequence[Sequence[float]],
    denominator: Sequence[Sequence[float]],
    *,
    confidence: float = CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> Interval:
    """median(numerator) / median(denominator) with a percentile-bootstrap interval.

    Each side is a list of runs (repeats), each run a list of per-update latencies. The
    estimate pools each side's updates. Each of ``resamples`` bootstrap replicates
    resamples, independently for each side, the runs with replacement and then each chosen
    run's updates with replacement (a two-level bootstrap, so the spread between repeats
    counts, not only the spread within one run), and takes the ratio of the pooled
    medians; the interval is the (1 - confidence)/2 and (1 + confidence)/2 percentiles of
    those ratios. Seeded: the same series give the same interval.
    """
    rng = np.random.default_rng(seed)
    top = [np.asarray(run, dtype=np.float64) for run in numerator if len(run)]
    bottom = [np.asarray(run, dtype=np.float64) for run in denominator if len(run)]
    if not top or not bottom:
        raise ValueError("each side needs at least one non-empty series")
    estimate = float(np.median(np.concatenate(top)) / np.median(np.concatenate(bottom)))
    ratios = _bootstrap_medians(top, resamples, rng) / _bootstrap_medians(bottom, resamples, rng)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return Interval(estimate, float(low), float(high))


def _bootstrap_medians(runs: list[np.ndarray], resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Medians of ``resamples`` two-level resamples (runs, then updates within each run)."""
    sizes = np.array([run.size for run in runs])
    flat = np.concatenate(runs)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    count = len(runs)
    medians = np.empty(resamples)
    if np.all(sizes == sizes[0]):  # equal lengths: whole replicates at once, in chunks
        size = int(sizes[0])
        per_chunk = max(1, _CHUNK_VALUES // (count * size))
        for start in range(0, resamples, per_chunk):
            chunk = min(per_chunk, resamples - start)
            chosen = rng.integers(0, count, size=(chunk, count, 1))
            within = rng.integers(0, size, size=(chunk, count, size))
            medians[start : start + chunk] = np.median(flat[offsets[chosen] + within].reshape(chunk, -1), axis=1)
        return medians
    for index in range(resamples):  # unequal lengths (adaptive runs): one replicate at a time
        chosen = rng.integers(0, count, size=count)
        medians[index] = np.median(
            np.concatenate([flat[offsets[run] + rng.integers(0, sizes[run], size=sizes[run])] for run in chosen])
        )
    return medians


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
    rel_iqr: float  # (p75 - p25) / median

    @classmethod
    def of(cls, samples_ms: list[float]) -> LatencySummary:
        if not samples_ms:
            raise ValueError("no latency samples to summarise")
        values = np.asarray(samples_ms, dtype=np.float64)
        p10, median, p90 = np.percentile(values, [10, 50, 90])
        return cls(
            count=len(values),
            median=float(median),
            p10=float(p10),
            p90=float(p90),
            mean=float(values.mean()),
            min=float(values.min()),
            max=float(values.max()),
            rel_iqr=rel_iqr(samples_ms),
        )

    def as_metrics(self, metric_name: Callable[[str], str]) -> dict[str, float]:
        """Each statistic under ``metric_name(statistic)``, e.g. :func:`axoexp.names.update_metric`."""
        return {metric_name(key): float(value) for key, value in asdict(self).items()}
