"""What a run prints for the person who started it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from axoexp import names
from axoexp.statistics import HIGH, NOISE_THRESHOLD, noise_verdict, spread_name
from axoexp.stdout import plural

if TYPE_CHECKING:  # annotations only: importing experiment here would load torch and mlflow early
    from axoexp.experiment import ExperimentResult


def format_result(result: ExperimentResult) -> str:
    """The human-readable summary printed at the end of a run."""
    from axoexp.tracking import metric_value  # MLflow is loaded by now: a run has logged to it

    update = result.update
    lines = [f"{phase:<14}{milliseconds:10.3f} ms" for phase, milliseconds in result.prepare_ms.items()]
    if result.warmup_ms:
        lines.append(f"{'first update':<14}{result.warmup_ms[0]:10.3f} ms  (cold, warm-up)")
    median, p10, p90, mean = (  # as MLflow has them, so the report shows the same digits
        metric_value(names.update_metric(stat), getattr(update, stat)) for stat in ("median", "p10", "p90", "mean")
    )
    lines.append(
        f"{'update':<14}{median:10.3f} ms  median of {update.count}  (p10 {p10:.3f}, p90 {p90:.3f}, mean {mean:.3f})"
    )
    if result.streams > 1:
        lines.append(
            f"{'streams':<14}{result.streams:10d}     per update: {result.streams_per_s:.1f} streams x updates/s"
        )
    if result.lengths is not None:
        summary = lengths_summary(result.lengths, result.buckets, result.padding_overhead, result.recaptures)
        lines.append(f"{'lengths':<14}{summary}")
    if result.device_update is not None and result.host_overhead_ms is not None:
        lines.append(
            f"{'device clock':<14}{result.device_update.median:10.3f} ms  median (CUDA events), "
            f"host overhead {result.host_overhead_ms:.3f} ms"
        )
    noise = noise_label(result.noise_spread, result.lengths is not None)
    lines.append(f"{'timing':<14}{noise}, contention {result.contention}, {plural(result.threads, 'thread')}")
    lines.append(f"{'loss':<14}{result.losses[0]:10.4g} -> {result.losses[-1]:.4g}")
    if result.eval_loss_before is not None and result.eval_loss_after is not None:
        lines.append(
            f"{'eval loss':<14}{result.eval_loss_before:10.4g} -> {result.eval_loss_after:.4g}  "
            f"(held-out, {result.eval_batches} batches never adapted on)"
        )
    if result.banks is not None:
        run = result.run_id if result.in_mlflow else "RUN_ID"
        run += ", once synced," if result.tracking_lost else ""  # an unended or unmade run is refused until then
        lines.append(
            f"{'banks':<14}{result.banks.artifact}  sha256 {result.banks.sha256[:16]}...  "
            f"(population.init_from={run} starts from them)"
        )
    if result.verification is not None:
        check = result.verification
        lines.append(
            f"{'verify':<14}{'passed' if check.passed else 'FAILED'}: {check.updates} updates vs eager, "
            f"max |loss diff| {check.max_abs_loss_diff:.2e}, max |param diff| {check.max_abs_param_diff:.2e}"
        )
    if result.process_ms:
        lines.append(f"{'process':<14}{process_summary(result.process_ms)}")
    if result.output_loss:
        lines.append(
            f"{'outputs':<14}not all kept ({result.output_loss}); MLflow has the run (tag {names.JOURNAL_LOST})"
        )
    store = result.tracking_uri  # printed by print_out, which hides a password
    lost = f"{store} could not be written ({result.tracking_lost})"
    kept = (
        f"and {result.output_loss}: this summary alone has it all" if result.output_loss else "its journal has it all"
    )
    if result.tracking_lost and result.in_mlflow:
        lines.append(
            f"{'mlflow run':<14}{result.run_id}  not ended: {lost}; {kept} (python -m axoexp.sync completes it)"
        )
    elif result.tracking_lost:
        lines.append(f"{'mlflow run':<14}none: {lost}; {kept}")
    else:
        lines.append(f"{'mlflow run':<14}{result.run_id}  (experiment {result.experiment!r} at {store})")
    return "\n".join(lines)


def lengths_summary(
    lengths: tuple[int, int], buckets: tuple[int, ...] | None, padding_overhead: float | None, recaptures: int | None
) -> str:
    """Batches of different lengths: their range, the buckets they were padded to, the padding overhead and
    the graphs captured after prepare, e.g. ``16..40 steps in buckets 24,32,40: padding 1.12x, 0 recaptures
    after prepare``."""
    steps = f"{lengths[0]}..{lengths[1]} steps"
    if not buckets:
        return f"{steps}, each batch at its own length (no padding)"
    padding = "" if padding_overhead is None else f": padding {padding_overhead:.2f}x"
    captured = "" if recaptures is None else f", {recaptures} recaptures after prepare"
    return f"{steps} in buckets {','.join(map(str, buckets))}{padding}{captured}"


def process_summary(process_ms: dict[str, float], biggest: int = 3) -> str:
    """The run's wall time from its process's start and its biggest phases, e.g.
    ``9.84 s from start: imports 5.21 s, store 2.10 s, measure 1.02 s``."""
    phases = {key: ms for key, ms in process_ms.items() if key != names.PROCESS_TOTAL}
    largest = sorted(phases.items(), key=lambda item: item[1], reverse=True)[:biggest]
    parts = ", ".join(f"{key.removeprefix('process_').removesuffix('_ms')} {ms / 1000:.2f} s" for key, ms in largest)
    return f"{process_ms[names.PROCESS_TOTAL] / 1000:10.2f} s from start: {parts} (exit not included)"


def noise_label(spread: float, by_length: bool) -> str:
    """The noise verdict with the spread (:func:`~axoexp.statistics.noise_spread`; ``by_length``: judged
    within length buckets) and the threshold it was judged against, e.g. ``noise low (IQR/median 0.398 <= 0.5)``."""
    verdict = noise_verdict(spread)
    judged = ">" if verdict == HIGH else "<="
    return f"noise {verdict} ({spread_name(by_length)} {spread:.3f} {judged} {NOISE_THRESHOLD:g})"
