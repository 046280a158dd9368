"""An Optuna search's Pareto front (``hydra/sweeper=optuna``): its non-dominated trial runs, named and drawn.

Read from MLflow alone (no Optuna import): the search tags its parent run with the study's
name, storage and objectives (``axoexp.study*``) and each trial's run with its number and what
Optuna was told (``axoexp.trial*``). The front is taken over every COMPLETE trial of the study,
the trials of earlier invocations (resumes) included; FAIL trials (failed, contended) are not
candidates.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from axoexp import names
from axoexp.tracking import child_runs

PARETO_FIGURE = "pareto.png"
COMPLETE = "COMPLETE"


def study_objectives(parent: Run) -> list[tuple[str, str]]:
    """``[(metric, minimize|maximize), ...]`` of the search whose parent this is; ``[]`` for other sweeps."""
    text = parent.data.tags.get(names.STUDY_OBJECTIVES, "")
    return [tuple(item.split(":", 1)) for item in text.split(",") if ":" in item]  # type: ignore[misc]


def _study_parents(client: MlflowClient, parent: Run) -> list[Run]:
    """The parent runs of every invocation of the parent's study (same study name and storage)."""
    same_study = " and ".join(f"tags.`{tag}` = '{parent.data.tags[tag]}'" for tag in (names.STUDY, names.STUDY_STORAGE))
    return client.search_runs([parent.info.experiment_id], filter_string=same_study)


def study_runs(client: MlflowClient, parent: Run) -> list[Run]:
    """The trial runs of every invocation of the parent's study, by trial number."""
    trials = [
        run
        for sweep in _study_parents(client, parent)
        for run in child_runs(client, sweep)
        if names.TRIAL in run.data.tags
    ]
    return sorted(trials, key=lambda run: int(run.data.tags[names.TRIAL]))


def reused_trials(client: MlflowClient, parent: Run) -> list[Run]:
    """Per trial of the study whose job reused an earlier run (``sweep.resume``; tag
    ``axoexp.reused.job<trial>`` on its invocation's parent), that run: one run as often as trials reused it."""
    run_ids = [
        run_id
        for sweep in _study_parents(client, parent)
        for key, run_id in sweep.data.tags.items()
        if key.startswith(names.REUSED_PREFIX)
    ]
    runs = {run_id: client.get_run(run_id) for run_id in set(run_ids)}
    return [runs[run_id] for run_id in run_ids]


def _costs(run: Run, objectives: list[tuple[str, str]]) -> tuple[float, ...]:
    """The objectives as values to minimise."""
    return tuple(
        run.data.metrics.get(metric, math.nan) * (1 if direction == "minimize" else -1)
        for metric, direction in objectives
    )


def pareto_front(runs: list[Run], objectives: list[tuple[str, str]]) -> list[Run]:
    """The COMPLETE trial runs no other COMPLETE one dominates (at least as good in every objective, better in one)."""
    complete = [run for run in runs if run.data.tags.get(names.TRIAL_STATE) == COMPLETE]
    costs = {run.info.run_id: _costs(run, objectives) for run in complete}

    def dominates(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
        return all(x <= y for x, y in zip(a, b, strict=True)) and a != b

    return [
        run
        for run in complete
        if not any(dominates(costs[other.info.run_id], costs[run.info.run_id]) for other in complete)
    ]


def _sampled(run: Run) -> str:
    prefix = names.TRIAL_PARAM_PREFIX
    return " ".join(
        f"{key.removeprefix(prefix)}={value}" for key, value in run.data.tags.items() if key.startswith(prefix)
    )


def format_front(
    parent: Run, runs: list[Run], front: list[Run], objectives: list[tuple[str, str]], reused: Sequence[Run] = ()
) -> str:
    """Lines naming the study and each Pareto-optimal run: trial, objective values, sampled values, run id.
    The trials that ``reused`` an earlier run count as that run's trial did (its tag ``axoexp.trial.state``),
    and as complete where that run was no trial (a grid sweep's job or a single run: resume reuses only FINISHED
    runs with every metric finite)."""
    trials = [*runs, *reused]
    complete = sum(run.data.tags.get(names.TRIAL_STATE) == COMPLETE for run in runs) + sum(
        run.data.tags.get(names.TRIAL_STATE, COMPLETE) == COMPLETE for run in reused
    )
    goals = ", ".join(f"{direction} {metric}" for metric, direction in objectives)
    lines = [
        f"Pareto front of study {parent.data.tags[names.STUDY]} ({goals}): "
        f"{len(front)} of {complete} complete trials ({len(trials)} in all)"
    ]
    if reused:
        lines.append(f"  {len(reused)} trials reused an earlier run (sweep.resume): counted as its trial, drawn once")
    failed = len(trials) - complete
    if failed:
        lines.append(f"  {failed} trials were told FAIL; tag {names.TRIAL_FAILURE} on their runs says why")
    for run in front:
        values = "  ".join(f"{metric}={run.data.metrics[metric]:.4g}" for metric, _ in objectives)
        lines.append(f"  trial {run.data.tags[names.TRIAL]:>3}  {values}  {_sampled(run)}  run {run.info.run_id}")
    return "\n".join(lines)


def front_axes(objectives: list[tuple[str, str]]) -> tuple[str, str]:
    """(x, y): a latency objective (:func:`~axoexp.names.is_milliseconds`) along x where there is one."""
    metrics = [metric for metric, _ in objectives]
    latency = next((metric for metric in metrics if names.is_milliseconds(metric)), metrics[0])
    return latency, next((metric for metric in metrics if metric != latency), latency)


def plot_front(runs: list[Run], front: list[Run], objectives: list[tuple[str, str]], heading: str, path: Path) -> None:
    """Every COMPLETE trial as a dot, the Pareto-optimal ones joined and labelled by trial number."""
    x_metric, y_metric = front_axes(objectives)
    complete = [run for run in runs if run.data.tags.get(names.TRIAL_STATE) == COMPLETE]
    figure, axes = plt.subplots(figsize=(6.4, 4.8))
    axes.scatter(
        [run.data.metrics[x_metric] for run in complete],
        [run.data.metrics[y_metric] for run in complete],
        color="lightgrey",
        edgecolor="grey",
        label="complete trials",
    )
    ordered = sorted(front, key=lambda run: run.data.metrics[x_metric])
    xs = [run.data.metrics[x_metric] for run in ordered]
    ys = [run.data.metrics[y_metric] for run in ordered]
    axes.plot(xs, ys, color="tab:red", marker="o", label="Pareto front")
    for run, x, y in zip(ordered, xs, ys, strict=True):
        axes.annotate(run.data.tags[names.TRIAL], (x, y), xytext=(4, 4), textcoords="offset points", fontsize=8)
    axes.set_xlabel(x_metric)
    axes.set_ylabel(y_metric)
    axes.set_title("\n".join(textwrap.fill(line, 90) for line in heading.splitlines()), fontsize=8, loc="left")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
