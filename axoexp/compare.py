"""python -m axoexp.compare BASE NEW: did a change make it slower? A regression gate for CI.

BASE and NEW are MLflow run ids: a sweep's parent (its children and the runs it reused) or
one run; --latest 2 takes the two newest top-level runs of the experiment (BASE the older).
Rows are the report's (axoexp/report/rows.py: one per config and executor, sweep.repeats
pooled), matched across the sides by their resolved config (every param but tracking.*,
sweep.* and run.progress; code identity lives in tags, so it never splits a match). Per
matched row: the median latency NEW/BASE with a seeded 95% bootstrap interval over both
sides' runs and their per-update series (axoexp.statistics.median_ratio_interval), and a
verdict: slower when the whole interval lies above 1 + threshold, faster when it lies below
1 - threshold, no change when it lies within [1 - threshold, 1 + threshold], else unclear (it
reaches beyond the threshold without lying wholly beyond it: too wide to tell). Only slower can be
a regression. A row is not compared where a side did not finish (base FAILED), a run lacks its
per-update series (no per-update series (metric per_update/latency_ms) in new run ID) or the sides
share a run (the same 2 runs on both sides: a sweep's rerun reused them; sweep.resume=false measures
anew): the timing column says which.

Configs measured on one side only are counted (1 row matched; 2 configs only in BASE, 1 only in
NEW). Where no config is on both sides, the line names the keys that set the closest pair of
configs apart (they differ in population.init_from (None vs ID)).

A row with fewer than 2 runs on a side gets "no verdict" and no interval: the bootstrap
resamples runs, so with one run the interval would hold only that run's own spread, not the
run-to-run spread of a shared machine. Measure both sides with sweep.repeats=2 or more.

A row whose runs were contended (timing.contention not none), noisy (timing.noise high) or
logged without those tags (an older store's: load not recorded, so it cannot claim to be quiet) on
either side is marked and never counted as a regression; such runs form rows of their own, apart
from a config's quiet repeats, unless --include-contended pools them (the report's rule and flag:
axoexp.statistics.timing_doubts). Quiet rows are matched with quiet rows, contended with contended
(else with the config's other row).

A row whose sides were timed on other hardware is marked (other hardware: NVIDIA H200 -> NVIDIA
A100) and never counted as a regression, nor is one where a side pools runs of several kinds
(mixed hardware: ...): the ratio may be the hardware's doing. Hardware is the GPU model (tag gpu.name) of
a CUDA run and the CPU model (tag cpu) of any run, as the CPU times a CUDA run's host side too; not
the GPU's UUID nor the host's name (two H200s are one hardware), nor the GPU driver or the versions
of CUDA, torch, axosim and python: a change of those can be the regression, as a change of the code
can. The header shows each side's code, hardware and those versions, and says so in a line where
the sides ran on different hardware.

Exit 1 when any row is a regression, 0 otherwise, 2 with one line on bad input or a store that
cannot be read: damaged, a file store, locked by another process, a server that does not answer
(where the report exits 1 for the last two, compare keeps 1 for its verdict); 130 with one line on
Ctrl-C. A reader that stops early (| head) is no fault: the exit status is still the verdict's, so a
CI shell with pipefail fails on a regression and only then.
"""

from __future__ import annotations

if __name__ == "__main__":  # python -m: run_command imports this module anew, Ctrl-C in its imports one line
    from axoexp.signals import run_command

    run_command("axoexp.compare")

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from itertools import product

from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from axoexp import names
from axoexp.errors import ComparisonError
from axoexp.readers import StoreReader, add_store_option, reading
from axoexp.report.rows import (
    EXECUTOR_KEY,
    ReportRow,
    build_rows,
    config_key,
    key_order,
    measured_series,
    setting_label,
    sweep_runs,
    swept_keys,
)
from axoexp.report.table import FORMATS, csv_text, grid
from axoexp.statistics import CONFIDENCE, MIN_RUNS, doubts, median_ratio_interval
from axoexp.stdout import plural, print_out
from axoexp.tracking import TRACKING_URI_OPTION, run_or_none
from axoexp.versions import VersionAction

DEFAULT_THRESHOLD = "5%"
SLOWER, FASTER, NO_CHANGE, UNCLEAR = "slower", "faster", "no change", "unclear"
NOT_COMPARED = "not compared"
NO_VERDICT = "no verdict"
CODE_TAGS = (names.GIT_COMMIT, names.GIT_DIRTY, names.CODE_HASH, names.PLUGINS_HASH)
HARDWARE_TAGS = (names.GPU_NAME, names.CPU_MODEL)  # what a timing was measured on (hardware())
ENVIRONMENT_TAGS = (
    names.GPU_DRIVER,
    names.version_tag("cuda_runtime"),
    names.version_tag("torch"),
    names.version_tag("axosim"),
    names.version_tag("python"),
)
NO_GPU = "no GPU"  # a CPU run's GPU
NOT_LOGGED = "not logged"  # a param one run has and another lacks
NAMED_KEYS = 3  # most keys a line names where configs differ
LATEST_SCAN = 1000  # newest runs looked at for --latest
REGRESSION, FAULT = 1, 2  # exit statuses: a regression found; bad input or a store that cannot be read


@dataclass(frozen=True)
class Comparison:
    """One config and executor measured on both sides."""

    shape: str
    executor: str
    settings: str  # the settings that vary between the compared rows
    base_median_ms: float
    new_median_ms: float
    ratio: float  # new / base median; NaN where the sides share a run
    ratio_low: float | None  # 95% bootstrap interval of ratio, where both sides have their series
    ratio_high: float | None
    verdict: str  # slower | faster | no change | unclear | no verdict | not compared
    caution: str  # why the verdict does not decide: "contended (cpu)", "noisy", "load not recorded",
    # "new FAILED", "the same run on both sides", "one run per side...",
    # "other hardware: NVIDIA H200 -> NVIDIA A100", ""
    regression: bool  # slower, with no caution
    base_runs: int
    new_runs: int
    base_run_ids: tuple[str, ...]  # every run pooled on the side
    new_run_ids: tuple[str, ...]


def hardware(run: Run) -> dict[str, str]:
    """What the run was timed on, its :data:`HARDWARE_TAGS`: the GPU model (:data:`NO_GPU` for a CPU run)
    and the host's CPU model, which times a CUDA run's host side (launches, eager's Python) too; ``?``
    where a tag is missing (a CUDA run without its GPU's name). Not the GPU's UUID nor the host's
    name: two H200s are one hardware to a regression gate; nor the driver or versions, which are the
    environment (shown, as the code is)."""
    tags = run.data.tags
    on_cuda = tags.get(names.DEVICE, "").startswith("cuda")
    gpu = tags.get(names.GPU_NAME, "?" if on_cuda else NO_GPU)
    return {names.GPU_NAME: gpu, names.CPU_MODEL: tags.get(names.CPU_MODEL, "?")}


def _joined(values: set[str]) -> str:
    return ",".join(sorted(values)) or "?"


@dataclass(frozen=True)
class Side:
    """BASE or NEW: its name, runs, and the code, hardware and environment they ran on."""

    label: str
    runs: list[Run]
    rows: list[ReportRow]
    sweep: bool = True  # a sweep parent's runs; else the one run its id names

    def described(self) -> str:
        """``a sweep of 4 runs``, or ``a single run: cudagraph 3x12x4``, as a line names the side."""
        if self.sweep:
            return f"a sweep of {plural(len(self.runs), 'run')}"
        tags = self.runs[0].data.tags
        return f"a single run: {tags.get(names.component_tag('executor'), '?')} {tags.get(names.SHAPE, '?')}"

    def configs(self) -> set[tuple[tuple[str, str], ...]]:
        """The resolved configs its runs measured (:func:`~axoexp.report.rows.config_key`)."""
        return {config_key(run) for run in self.runs}

    def unmatched(self, other: Side) -> int:
        """How many of its configs ``other`` did not measure: no row of theirs is compared."""
        return len(self.configs() - other.configs())

    def code(self) -> dict[str, str]:
        """Commit, dirty, code and plugin hashes; several values of one joined by ``,``."""
        return {tag: _joined({run.data.tags.get(tag, "?") for run in self.runs}) for tag in CODE_TAGS}

    def hardware(self) -> dict[str, str]:
        """GPU and CPU model (:func:`hardware`); several values of one joined by ``,``."""
        return {tag: _joined({hardware(run)[tag] for run in self.runs}) for tag in HARDWARE_TAGS}

    def environment(self) -> dict[str, str]:
        """GPU driver and versions, of those the runs logged; several values of one joined by ``,``."""
        logged = [tag for tag in ENVIRONMENT_TAGS if any(tag in run.data.tags for run in self.runs)]
        return {tag: _joined({run.data.tags.get(tag, "?") for run in self.runs}) for tag in logged}


def parse_threshold(text: str) -> float:
    """``5%`` or ``0.05`` as a fraction; one line naming the value otherwise."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < 1:
        raise ComparisonError(f"--threshold={text}: not a fraction in [0, 1) or a percentage, e.g. 5% or 0.05")
    return value


def verdict(low: float | None, high: float | None, threshold: float) -> str:
    """``slower`` / ``faster`` when the interval of NEW/BASE lies wholly beyond ``1 ± threshold``,
    ``no change`` when it lies within ``[1 - threshold, 1 + threshold]``, else ``unclear``: it reaches
    beyond the threshold, so a change that counts is not ruled out, nor shown."""
    if low is None or high is None:
        return NOT_COMPARED
    if low > 1 + threshold:
        return SLOWER
    if high < 1 - threshold:
        return FASTER
    return NO_CHANGE if 1 - threshold <= low and high <= 1 + threshold else UNCLEAR


def too_few_runs(
    base_runs: int, new_runs: int, set_apart: int = 0, kinds: tuple[str, str] = ("quiet", "quiet"), apart: str = ""
) -> str:
    """Why a row gets no verdict for lack of repeats, e.g. ``one run per side: ...``; ``""`` when both
    sides have :data:`~axoexp.statistics.MIN_RUNS` runs or more. ``set_apart``: the config's ``apart``
    runs (contended, or quiet), in a row of their own, that would have made up the repeats; ``kinds``:
    BASE's and NEW's runs in this row, quiet or contended."""
    sides = zip(("BASE", "NEW"), (base_runs, new_runs), kinds, strict=True)
    short = [(side, kind) for side, runs, kind in sides if runs < MIN_RUNS]
    if not short:
        return ""
    where = "per side" if len(short) == 2 else f"on {short[0][0]}"
    if set_apart:
        kind = f"{short[0][1]} " if len({kind for _, kind in short}) == 1 else ""
        return (
            f"one {kind}run {where}: run-to-run spread unknown; {plural(set_apart, f'{apart} run')} of it set apart "
            "(--include-contended pools them)"
        )
    return f"one run {where}: run-to-run spread unknown; measure with sweep.repeats={MIN_RUNS} or more"


def without_series(base: dict[str, list[float]], new: dict[str, list[float]]) -> str:
    """``no per-update series (metric per_update/latency_ms) in base run X and new run Y``, naming each
    run whose measured updates (by run id) are empty, or ``""``: why a row is not compared."""
    missing = [
        f"{side} run {run_id}"
        for side, series in (("base", base), ("new", new))
        for run_id, got in series.items()
        if not got
    ]
    return f"no per-update series (metric {names.UPDATE_SERIES}) in {' and '.join(missing)}" if missing else ""


def same_runs(base: Sequence[str], new: Sequence[str]) -> str:
    """``the same run on both sides`` (``the same 2 runs ...``) where a row's sides share runs (a sweep
    resumed from the other reused them), or ``""``: a run against itself is no comparison."""
    shared = len(set(base) & set(new))
    return f"the same {'run' if shared == 1 else f'{shared} runs'} on both sides" if shared else ""


def only_on_one_side(base: Side, new: Side) -> str:
    """``2 configs only in BASE, 1 only in NEW`` (:meth:`Side.unmatched`), or ``""``."""
    counts = [(count, side.label) for side, other in ((base, new), (new, base)) if (count := side.unmatched(other))]
    return ", ".join(
        f"{plural(count, 'config') if index == 0 else count} only in {label}"
        for index, (count, label) in enumerate(counts)
    )


def _differing(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The keys whose values differ between two configs (a key one lacks included), in :func:`key_order`."""
    return sorted((key for key in before.keys() | after.keys() if before.get(key) != after.get(key)), key=key_order)


def closest_difference(base: Side, new: Side) -> str:
    """Where no config was measured on both sides, what sets the closest pair of configs (the fewest
    keys apart) apart: ``they differ in population.init_from (None vs f32f...)``, or ``the closest
    configs differ in ...`` where a side has several, naming at most :data:`NAMED_KEYS` keys.
    Bookkeeping keys (``tracking.*``, ``sweep.*``, ``run.progress``) are no part of a config, so never named."""
    pairs = product(map(dict, sorted(base.configs())), map(dict, sorted(new.configs())))
    before, after = min(pairs, key=lambda pair: len(_differing(*pair)))
    keys = _differing(before, after)
    named = ", ".join(
        f"{key} ({before.get(key, NOT_LOGGED)} vs {after.get(key, NOT_LOGGED)})" for key in keys[:NAMED_KEYS]
    )
    more = f" and {plural(len(keys) - NAMED_KEYS, 'more key')}" if len(keys) > NAMED_KEYS else ""
    several = len(base.configs()) > 1 or len(new.configs()) > 1
    return f"{'the closest configs' if several else 'they'} differ in {named}{more}"


def other_hardware(base: Sequence[Run], new: Sequence[Run]) -> str:
    """``other hardware: NVIDIA H200 -> NVIDIA A100`` (each part of :func:`hardware` that differs; a side
    that pools several kinds names them all), ``mixed hardware: ...`` where both sides pool the same
    kinds, or ``""``: why a ratio may be the hardware's doing, not the code's."""
    changed, mixed = [], []
    for tag in HARDWARE_TAGS:
        before, after = (sorted({hardware(run)[tag] for run in runs}) for runs in (base, new))
        if before != after:
            changed.append(f"{' and '.join(before)} -> {' and '.join(after)}")
        elif len(before) > 1:
            mixed.append(" and ".join(before))
    reasons = [f"other hardware: {'; '.join(changed)}"] if changed else []
    return ", ".join(reasons + ([f"mixed hardware: {'; '.join(mixed)}"] if mixed else []))


def hardware_note(base: Side, new: Side) -> str:
    """A line where not every run was timed on one hardware: what differs between the sides, or what
    they mix; ``""`` otherwise."""
    if len({tuple(hardware(run).values()) for run in [*base.runs, *new.runs]}) < 2:
        return ""
    before, after = base.hardware(), new.hardware()
    changed = [f"{tag} {before[tag]} -> {after[tag]}" for tag in HARDWARE_TAGS if before[tag] != after[tag]]
    what = "ran on different hardware" if changed else "each mix hardware"
    listed = "; ".join(changed) or ", ".join(f"{tag} {value}" for tag, value in before.items())
    return (
        f"{base.label} and {new.label} {what} ({listed}): rows on other or mixed hardware are marked "
        "and never counted as regressions"
    )


def load_side(client: MlflowClient, run_id: str, label: str, include_contended: bool = False) -> Side:
    """A sweep parent's runs (children and reused) or the one run ``run_id`` names."""
    run = run_or_none(client, run_id)
    if run is None:
        raise ComparisonError(f"{label}={run_id}: no such run in this store; give a run id or a sweep's parent run id")
    sweep = run.data.tags.get(names.SWEEP_ROLE) == "parent"
    runs = sweep_runs(client, run) if sweep else [run]
    if not runs:
        raise ComparisonError(f"{label}={run_id}: the sweep has no runs to compare")
    return Side(label, runs, build_rows(runs, client, include_contended=include_contended), sweep)


def latest_two(client: MlflowClient, experiment: str) -> tuple[str, str]:
    """The two newest runs of ``experiment`` that are not a sweep's children: (older, newer)."""
    found = client.get_experiment_by_name(experiment)
    runs = (
        client.search_runs([found.experiment_id], order_by=["attributes.start_time DESC"], max_results=LATEST_SCAN)
        if found
        else []
    )
    top = [run.info.run_id for run in runs if names.PARENT_RUN_ID not in run.data.tags][:2]
    if len(top) < 2:
        raise ComparisonError(f"--latest 2: experiment {experiment!r} has {len(top)} sweeps or single runs, not 2")
    return top[1], top[0]


def compare(client: MlflowClient, base: Side, new: Side, threshold: float) -> list[Comparison]:
    """Every config both sides ran, matched by config and executor: quiet rows with quiet rows and
    contended with contended, a side without that kind lending its other row, so a config's contended
    runs are compared apart and never stand in for its quiet repeats, and neither side's quiet runs
    go unshown (NEW's rows first, then those only BASE has a kind of)."""
    by_id = {run.info.run_id: run for run in [*base.runs, *new.runs]}
    swept = [key for key in swept_keys([*base.runs, *new.runs]) if key != EXECUTOR_KEY]
    before_rows, new_rows = _by_config(base.rows, by_id), _by_config(new.rows, by_id)
    comparisons, paired = [], set()
    fetched: dict[str, list[float]] = {}

    def series(run_id: str) -> list[float]:  # a row lent to two pairs is fetched once
        if run_id not in fetched:
            fetched[run_id] = measured_series(client, by_id[run_id])
        return fetched[run_id]

    for config, contended in dict.fromkeys([*new_rows, *before_rows]):
        row = new_rows.get((config, contended)) or new_rows.get((config, not contended))
        before = before_rows.get((config, contended)) or before_rows.get((config, not contended))
        if row is None or before is None or (id(before), id(row)) in paired:
            continue
        paired.add((id(before), id(row)))
        low = high = None
        shared = same_runs(before.run_ids, row.run_ids)
        ratio = math.nan if shared else row.median_ms / before.median_ms
        unfinished = [f"{side} {r.status}" for side, r in (("base", before), ("new", row)) if r.status != "FINISHED"]
        base_series = {} if shared else {run_id: series(run_id) for run_id in before.run_ids}
        new_series = {} if shared else {run_id: series(run_id) for run_id in row.run_ids}
        unmeasured = without_series(base_series, new_series)
        comparable = not shared and not unfinished and not unmeasured
        others = [rows.get((config, not contended)) for rows in (before_rows, new_rows)]
        set_apart = sum(
            other.repeats
            for other in others
            if other is not None and other is not before and other is not row and other.status == "FINISHED"
        )
        kinds = ("contended" if before.contended else "quiet", "contended" if row.contended else "quiet")
        apart = "quiet" if contended else "contended"
        few = too_few_runs(before.repeats, row.repeats, set_apart, kinds, apart) if comparable else ""
        if comparable and not few:
            interval = median_ratio_interval(list(new_series.values()), list(base_series.values()))
            ratio, low, high = interval.estimate, interval.low, interval.high
        base_runs, new_runs = [by_id[run_id] for run_id in before.run_ids], [by_id[run_id] for run_id in row.run_ids]
        timing = doubts([run.data.tags for run in (*base_runs, *new_runs) if run.info.status == "FINISHED"])
        elsewhere = other_hardware(base_runs, new_runs)
        caution = ", ".join(filter(None, [shared, *unfinished, unmeasured, few, timing, elsewhere]))
        outcome = NO_VERDICT if few else verdict(low, high, threshold)
        first = by_id[row.run_id]
        comparisons.append(
            Comparison(
                shape=row.shape,
                executor=row.executor,
                settings=" ".join(f"{setting_label(name)}={first.data.params.get(name, '')}" for name in swept),
                base_median_ms=before.median_ms,
                new_median_ms=row.median_ms,
                ratio=ratio,
                ratio_low=low,
                ratio_high=high,
                verdict=outcome,
                caution=caution,
                regression=outcome == SLOWER and not caution,
                base_runs=before.repeats,
                new_runs=row.repeats,
                base_run_ids=before.run_ids,
                new_run_ids=row.run_ids,
            )
        )
    return comparisons


def _by_config(
    rows: list[ReportRow], by_id: dict[str, Run]
) -> dict[tuple[tuple[tuple[str, str], ...], bool], ReportRow]:
    """Each config's quiet row and its contended one, by (config, contended): the pooled FINISHED
    runs where there are any, else the first other run."""
    chosen: dict[tuple[tuple[tuple[str, str], ...], bool], ReportRow] = {}
    for row in sorted(rows, key=lambda row: row.status != "FINISHED", reverse=True):
        chosen[(config_key(by_id[row.run_id]), row.contended)] = row
    return chosen


COLUMNS = (
    "shape",
    "executor",
    "settings",
    "base ms",
    "new ms",
    "new/base",
    "95% interval",
    "verdict",
    "timing",
    "runs",
)
NUMERIC_COLUMNS = range(3, 7)


def _number(value: float | None, digits: int) -> str:
    return "" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _cells(comparison: Comparison) -> tuple[str, ...]:
    interval = (
        ""
        if comparison.ratio_low is None or comparison.ratio_high is None
        else f"[{comparison.ratio_low:.3f}, {comparison.ratio_high:.3f}]"
    )
    verdict_text = comparison.verdict.upper() if comparison.regression else comparison.verdict
    return (
        comparison.shape,
        comparison.executor,
        comparison.settings,
        _number(comparison.base_median_ms, 3),
        _number(comparison.new_median_ms, 3),
        _number(comparison.ratio, 3),
        interval,
        verdict_text,
        comparison.caution,
        f"{comparison.base_runs}/{comparison.new_runs}",
    )


def _record(comparison: Comparison) -> dict[str, object]:
    return {
        key: None if isinstance(value, float) and math.isnan(value) else value
        for key, value in asdict(comparison).items()
    }


def format_comparison(comparisons: list[Comparison], base: Side, new: Side, style: str, threshold: float) -> str:
    """The comparison as ``text``, ``markdown``, ``csv`` (rows only) or ``json`` (sides' code and rows)."""
    if style == "json":
        sides = {
            side.label.lower(): {
                "run_ids": [run.info.run_id for run in side.runs],
                "code": side.code(),
                "hardware": side.hardware(),
                "environment": side.environment(),
                "unmatched_configs": side.unmatched(other),
            }
            for side, other in ((base, new), (new, base))
        }
        return json.dumps({**sides, "threshold": threshold, "rows": [_record(c) for c in comparisons]}, indent=2)
    if style == "csv":
        return csv_text([field.name for field in fields(Comparison)], [list(_record(c).values()) for c in comparisons])
    lines = [
        f"{side.label}: {plural(len(side.runs), 'run')}; "
        + "; ".join(
            ", ".join(f"{tag} {value[:12] if tag.endswith('sha256') else value}" for tag, value in identity.items())
            for identity in (side.code(), side.hardware(), side.environment())
            if identity
        )
        for side in (base, new)
    ]
    lines.append(
        "; ".join(filter(None, [f"{plural(len(comparisons), 'row')} matched", only_on_one_side(base, new)]))
        + f"; verdict from the {CONFIDENCE:.0%} interval of new/base "
        f"against 1 ± {threshold * 100:.3g}%, given {MIN_RUNS} or more runs per side; regressions in capitals"
    )
    lines += filter(None, [hardware_note(base, new)])
    table = grid([COLUMNS, *(_cells(c) for c in comparisons)], NUMERIC_COLUMNS, markdown=style == "markdown")
    if style == "markdown":
        return "\n".join(f"- {line}" for line in lines) + "\n\n" + table
    return "\n".join(lines) + "\n" + table


def main(argv: list[str] | None = None) -> None:
    """Compare; exit 1 on a regression, 0 otherwise, 2 with one line on bad input or a store that cannot be read."""
    with reading("axoexp.compare", fault_status=FAULT) as store:
        regressions = run_compare(store, argv)
    sys.exit(REGRESSION if regressions else 0)


def run_compare(store: StoreReader, argv: list[str] | None = None) -> int:
    """Print the comparison; return the number of regressions."""
    parser = argparse.ArgumentParser(
        prog="python -m axoexp.compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action=VersionAction)
    parser.add_argument("runs", nargs="*", metavar="BASE NEW", help="run ids or sweep parent run ids")
    parser.add_argument("--latest", type=int, default=None, metavar="2", help="the experiment's two newest runs")
    add_store_option(parser)
    parser.add_argument("--experiment", default="axoexp")
    parser.add_argument("--threshold", default=DEFAULT_THRESHOLD, help="smallest change that counts (default 5%%)")
    parser.add_argument("--format", choices=FORMATS, default="text")
    parser.add_argument(
        "--include-contended",
        action="store_true",
        help="pool runs measured under contention, with high noise or without their load recorded with a "
        "config's other runs (still marked)",
    )
    args = parser.parse_args(argv)
    threshold = parse_threshold(args.threshold)
    if args.latest is not None and args.latest != 2:
        raise ComparisonError(f"--latest={args.latest}: only --latest 2 (BASE the older, NEW the newer) is supported")
    if (args.latest is None) == (len(args.runs) != 2) or (args.latest is not None and args.runs):
        given = f"runs={' '.join(args.runs)}" if args.runs else "nothing to compare"
        raise ComparisonError(f"{given}: give BASE NEW (two run ids) or --latest 2")
    if len(args.runs) == 2 and args.runs[0] == args.runs[1]:
        raise ComparisonError(f"runs={' '.join(args.runs)}: BASE and NEW are one run; give two run ids")
    client = store.open(args.tracking_uri, f"give {TRACKING_URI_OPTION} or run something first")
    base_id, new_id = latest_two(client, args.experiment) if args.latest else args.runs
    base = load_side(client, base_id, "BASE", args.include_contended)
    new = load_side(client, new_id, "NEW", args.include_contended)
    comparisons = compare(client, base, new, threshold)
    if not comparisons:
        raise ComparisonError(
            f"BASE={base_id} ({base.described()}) NEW={new_id} ({new.described()}): no config and executor was "
            f"measured on both sides; {closest_difference(base, new)}"
        )
    print_out(format_comparison(comparisons, base, new, args.format, threshold))  # a reader gone: the verdict stands
    return sum(c.regression for c in comparisons)
