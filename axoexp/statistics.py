"""How much to trust a latency: spread (relative IQR, also within length buckets), a noise verdict,
and a bootstrap interval for the ratio of two medians (a speedup).

Adaptive measuring (``run.min_time_s``) stops as torch.utils.benchmark's adaptive autorange
does, once IQR / median falls below 0.1. The noise verdict is looser, calibrated on measured
runs (docs/timing.md): an idle machine's default runs spread up to about 0.44, disturbed ones
(a thread pool sharing its CPUs with a busy process) 0.54 and more.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from axoexp import names

STABLE_THRESHOLD = 0.10
"""IQR / median (:func:`noise_spread`) at or below this ends adaptive measuring (torch.utils.benchmark's
adaptive-autorange threshold)."""
NOISE_THRESHOLD = 0.50
"""IQR / median (:func:`noise_spread`) above this is ``high`` noise. Calibrated on 150 default and 64x64x8 runs on an
idle 16-CPU host, on all 16 CPUs and on 2 of them: every idle run stayed at or below 0.44 (0 of
75 high), while 12 of 18 runs whose thread pool shared all its CPUs with one busy process were
above (the 6 others were slowed uniformly, which a spread cannot show).
benchmarks/results/noise-threads_*_2026-12-03_*.json keep every latency."""
LOW, HIGH = "low", "high"
NOT_RECORDED = "not recorded"  # a timing label a run lacks: logged before axoexp recorded its load
MIN_RUNS = 2
"""Runs per side that a ratio's bootstrap interval (and a verdict from it) needs: the interval
resamples runs, so with one run it holds only that run's own spread, not the run-to-run spread
(up to 1.8x between two runs of one config on a shared 2-core machine)."""
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


MIN_BUCKET_UPDATES = 4
"""Updates of one length bucket whose median an update's time is judged against (:func:`noise_spread`);
a smaller bucket's updates are judged against the line through every update's time and length."""


def noise_spread(samples: Sequence[float], lengths: Sequence[int] | None = None) -> float:
    """The spread :func:`noise_verdict` and adaptive measuring judge: the IQR of each sample's time over
    the time expected of its length (``lengths[i]``: sample ``i``'s, its update's length bucket), so that
    updates of different lengths taking different times is no noise. The expected time is the median of
    its bucket's samples where the bucket has :data:`MIN_BUCKET_UPDATES` or more, else the least-squares
    line of time against length through every sample (a bucket of one sample would be its own median,
    and a run whose every update had its own length would never look noisy). With one length (or
    ``None``) this is :func:`rel_iqr`, IQR / median."""
    if lengths is None or len(set(lengths)) < 2:
        return rel_iqr(samples)
    values, steps = np.asarray(samples, dtype=np.float64), np.asarray(lengths, dtype=np.float64)
    slope, intercept = np.polyfit(steps, values, 1)
    expected = intercept + slope * steps
    for length in set(lengths):
        members = steps == length
        if members.sum() >= MIN_BUCKET_UPDATES:
            expected[members] = np.median(values[members])
    if (expected <= 0).any():
        return float("inf")
    p25, p75 = np.percentile(values / expected, [25, 75])
    return float(p75 - p25)


def spread_name(by_length: bool) -> str:
    """How :func:`noise_spread` is named where it is printed: ``IQR/median``, or, over updates of several
    lengths, ``IQR/median within length buckets``."""
    return "IQR/median within length buckets" if by_length else "IQR/median"


def noise_verdict(spread: float) -> str:
    """``low`` when the spread (:func:`noise_spread`) is at most :data:`NOISE_THRESHOLD`, else ``high``."""
    return LOW if spread <= NOISE_THRESHOLD else HIGH


def timing_labels(runs_tags: Sequence[Mapping[str, str]]) -> tuple[str, str]:
    """Runs' ``timing.contention`` (``none``, or every kind seen) and ``timing.noise`` (``high``
    where any run's was, else ``low``), from their tags; :data:`NOT_RECORDED` where a run lacks the
    tag, one logged before axoexp recorded them (the contention then lists it among the kinds)."""
    contentions = [tags.get(names.TIMING_CONTENTION) for tags in runs_tags]
    kinds = sorted({kind for value in contentions if value for kind in value.split(",") if kind and kind != "none"})
    contention = ",".join(kinds + ([NOT_RECORDED] if None in contentions else [])) or "none"
    noises = {tags.get(names.TIMING_NOISE) for tags in runs_tags}
    return contention, HIGH if HIGH in noises else NOT_RECORDED if None in noises else LOW


def timing_doubts(contention: str, noise: str) -> str:
    """Why timings with these labels (:func:`timing_labels`) are no quiet timings: ``contended
    (cpu)``, ``noisy``, ``load not recorded`` (a timing whose load is unknown cannot claim to be
    quiet), several of them, or ``""``. The one rule of the report, compare and resume."""
    kinds = [kind for kind in contention.split(",") if kind and kind not in ("none", NOT_RECORDED)]
    reasons = [f"contended ({', '.join(kinds)})"] if kinds else []
    if noise == HIGH:
        reasons.append("noisy")
    if NOT_RECORDED in (noise, *contention.split(",")):
        reasons.append("load not recorded")
    return ", ".join(reasons)


def doubts(runs_tags: Sequence[Mapping[str, str]]) -> str:
    """:func:`timing_doubts` of runs, from their tags."""
    return timing_doubts(*timing_labels(runs_tags))


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
