"""hydra/sweeper=optuna: the search space, what Optuna is told, a study that resumes, and its Pareto front."""

from __future__ import annotations

import json
import math
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from helpers import run_cli, run_clis
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from test_faults import LONG_RUN, start_cli, wait_for_updates

from axoexp import names
from axoexp.errors import ConfigError
from axoexp.report.__main__ import main as report_main
from axoexp.report.pareto import pareto_front
from axoexp.search import (
    Outcome,
    Search,
    check_objectives,
    check_settings,
    make_sampler,
    search_space,
    study_name,
    study_storage,
    trial_outcome,
)
from axoexp.tracking import runs_view


def test_search_space_from_overrides_and_params() -> None:
    space = search_space(
        ["run.measured_updates=5", "gradient_transform=none,clip_norm", "sweep.parent_run_id=abc"],
        {
            "optimizer.lr": "tag(log, interval(1e-4, 1e-1))",
            "population.neurons": "range(2, 9, 2)",
            "run.warmup_updates": "tag(int, interval(1, 4))",
            "population.input_rate": "interval(0.1, 0.5)",
        },
    )
    assert space.fixed == ["run.measured_updates=5", "sweep.parent_run_id=abc"]
    assert space.distributions == {
        "gradient_transform": CategoricalDistribution(["none", "clip_norm"]),
        "optimizer.lr": FloatDistribution(1e-4, 1e-1, log=True),
        "population.neurons": IntDistribution(2, 8, step=2),
        "run.warmup_updates": IntDistribution(1, 4),
        "population.input_rate": FloatDistribution(0.1, 0.5),
    }


def test_a_range_counting_down_and_an_int_interval_keep_inside_their_bounds() -> None:
    space = search_space(
        ["population.neurons=range(8,2,-2)", "run.warmup_updates=tag(int,interval(1.5,3.7))"],
        {"population.input_rate": "range(0.5, 0.1, -0.1)"},
    )
    assert space.distributions["population.neurons"] == IntDistribution(4, 8, step=2), "8, 6, 4 as Hydra's range"
    assert space.distributions["run.warmup_updates"] == IntDistribution(2, 3), "rounded inward"
    rates = space.distributions["population.input_rate"]
    assert isinstance(rates, FloatDistribution) and rates.step == pytest.approx(0.1)
    assert (rates.low, rates.high) == pytest.approx((0.2, 0.5))


@pytest.mark.parametrize(
    ("arguments", "params", "message"),
    [
        (["run.measured_updates=5"], {}, "hydra.sweeper.params: nothing to search"),
        ([], {"optimizer.lr": "tag(log, interval(0, 1))"}, "optimizer.lr=interval(0.0, 1.0): need start < end"),
        (["sweep.repeat=0,1"], {}, "sweep.repeats: repeats are not supported"),
        (["population.neurons=range(2,10,0)"], {}, "population.neurons=range(2, 10, 0): the step must not be 0"),
        (["population.neurons=range(8,2,2)"], {}, "population.neurons=range(8, 2, 2): an empty range"),
        (["run.warmup_updates=tag(int,interval(1.2,1.8))"], {}, "interval(1.2, 1.8): no integer lies inside it"),
    ],
)
def test_search_space_refuses_what_it_cannot_search(arguments: list[str], params: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        search_space(arguments, params)


def test_settings_errors_name_key_value_and_choices() -> None:
    with pytest.raises(ConfigError) as error:
        check_settings({"loss_final": "lowest"}, "cmaes", "ignore", 0, 1)
    assert str(error.value) == (
        "hydra.sweeper.objectives.loss_final=lowest: valid directions: minimize, maximize; "
        "hydra.sweeper.sampler=cmaes: valid samplers: tpe, nsga2, random; "
        "hydra.sweeper.contended=ignore: valid: fail, keep; hydra.sweeper.n_trials=0: must be at least 1"
    )


def test_objectives_no_run_can_log_are_refused_with_a_did_you_mean() -> None:
    check_objectives(["update_ms_p90", "eval_loss_after", "capture_bucket_64_ms", "contention_measured_cpu_other"], [])
    with pytest.raises(ConfigError) as error:
        check_objectives(["eval_los_after", "update_ms_p99"], [])
    first, second = str(error.value).split("; hydra.sweeper.objectives.")
    assert first.startswith(
        "hydra.sweeper.objectives.eval_los_after: no run logs such a metric (did you mean eval_loss_after?); "
        "valid: update_ms_count, "
    )
    assert second.startswith("update_ms_p99: no run logs such a metric (did you mean update_ms_p90?)")
    check_objectives(["eval_los_after"], ["gauged"])  # a plugin's executor may log metrics of any name


def test_the_study_lives_beside_the_store_under_a_name_of_what_it_measures(tmp_path: Path) -> None:
    assert study_storage(None, f"sqlite:///{tmp_path}/mlflow.db") == f"sqlite:///{tmp_path}/optuna.db"
    assert study_storage("sqlite:///elsewhere.db", "http://host:5000") == "sqlite:///elsewhere.db"
    objectives = {"loss_final": "minimize"}
    name = study_name(None, search_space(["a=1", "b=1,2", "sweep.parent_run_id=x"], {}), objectives)
    assert name == study_name(None, search_space(["b=1,2", "a=1", "tracking.uri=y"], {}), objectives)
    assert name != study_name(None, search_space(["a=2", "b=1,2"], {}), objectives)
    assert name != study_name(None, search_space(["a=1", "b=1,2"], {}), {"update_ms_median": "minimize"})


def test_samplers_are_seeded() -> None:
    def first_draws(sampler: str) -> list[float]:
        study = optuna.create_study(sampler=make_sampler(sampler, 7), directions=["minimize", "minimize"])
        return [study.ask({"x": FloatDistribution(0, 1)}).params["x"] for _ in range(3)]

    for sampler in ("tpe", "nsga2", "random"):
        assert first_draws(sampler) == first_draws(sampler)


def _trial_run(client: MlflowClient, experiment: str, status: str = "FINISHED", **tags: str):
    run_id = client.create_run(experiment, tags={names.TIMING_CONTENTION: "none", **tags}).info.run_id
    client.log_metric(run_id, "loss_final", 0.25)
    client.log_metric(run_id, names.UPDATE_MEDIAN, 3.0)
    client.set_terminated(run_id, status)
    return client.get_run(run_id)


def test_failed_killed_and_contended_trials_are_told_as_failures(client: MlflowClient) -> None:
    experiment = client.create_experiment("axoexp")
    objectives = {"loss_final": "minimize", names.UPDATE_MEDIAN: "minimize"}
    assert trial_outcome(_trial_run(client, experiment), objectives, "fail") == Outcome([0.25, 3.0])
    failed = _trial_run(client, experiment, "FAILED", **{names.FAILURE: "boom"})
    assert trial_outcome(failed, objectives, "fail") == Outcome(None, "its run ended FAILED: boom")
    assert trial_outcome(_trial_run(client, experiment, "KILLED"), objectives, "fail").values is None
    contended = _trial_run(client, experiment, **{names.TIMING_CONTENTION: "cpu"})
    outcome = trial_outcome(contended, objectives, "fail")
    assert outcome.values is None and outcome.disturbed and outcome.reason.startswith("timing.contention=cpu")
    assert trial_outcome(contended, objectives, "keep") == Outcome([0.25, 3.0])
    outcome = trial_outcome(_trial_run(client, experiment), {"eval_loss_after": "minimize"}, "fail")
    assert outcome.values is None and not outcome.disturbed
    assert outcome.reason.startswith("no finite eval_loss_after in its run; valid metrics: loss_final")
    assert trial_outcome(None, objectives, "fail").values is None


def test_trials_that_reused_one_run_count_as_trials_and_the_run_as_one_row(
    client: MlflowClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A resumed categorical search: trials 0 and 1 measured neurons=3 and 4, trials 2-5 of the next
    invocation reused those two runs (tags axoexp.reused.job2..5 on its parent)."""
    experiment = client.create_experiment("axoexp", artifact_location=str(tmp_path / "artifacts"))
    study = {names.STUDY: "axoexp-s", names.STUDY_STORAGE: "sqlite:///optuna.db", names.SWEEP_ROLE: "parent"}
    study[names.STUDY_OBJECTIVES] = f"{names.UPDATE_MEDIAN}:minimize"
    first, second = (client.create_run(experiment, tags=study).info.run_id for _ in range(2))
    measured = []
    for trial, neurons in enumerate("34"):
        tags = {names.PARENT_RUN_ID: first, names.TRIAL: str(trial), names.TRIAL_STATE: "COMPLETE"}
        run = _trial_run(client, experiment, **tags, **{names.component_tag("executor"): "eager"})
        client.log_param(run.info.run_id, "population.neurons", neurons)
        measured.append(run.info.run_id)
    for job in range(2, 6):
        client.set_tag(second, f"{names.REUSED_PREFIX}job{job}", measured[job % 2])
    single = _trial_run(client, experiment, **{names.component_tag("executor"): "eager"})  # no trial: sweep.resume=any
    client.log_param(single.info.run_id, "population.neurons", "5")
    client.set_tag(second, f"{names.REUSED_PREFIX}job6", single.info.run_id)

    report_main(["--tracking-uri", client.tracking_uri, "--parent", second, "--format", "json", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    rows = sorted((row["run_id"], row["repeats"]) for row in json.loads(out))
    assert rows == sorted((run, 1) for run in [*measured, single.info.run_id])
    assert err.splitlines()[0].endswith(": 2 of 7 complete trials (7 in all)"), "equal latencies: both on the front"
    assert "5 trials reused an earlier run (sweep.resume)" in err and "told FAIL" not in err


def test_a_study_name_reused_with_other_objectives_is_refused(tracking_uri: str, tmp_path: Path) -> None:
    def search(objectives: dict[str, str], trials: int = 1) -> Search:
        settings = {"objectives": objectives, "params": {}, "sampler": "random", "contended": "fail", "seed": 0}
        settings |= {
            "n_trials": trials,
            "n_jobs": 1,
            "storage": f"sqlite:///{tmp_path / 'optuna.db'}",
            "study_name": "s",
        }
        tracking = {"uri": tracking_uri, "http_max_retries": 0, "http_timeout_s": 1, "http_backoff_factor": 0}

        def launch(batch: list[list[str]], initial_job_idx: int) -> list:
            raise RuntimeError("no job runs in this test")

        return Search(OmegaConf.create(settings), OmegaConf.create({"tracking": tracking}), launch)

    with pytest.raises(RuntimeError, match="no job runs"):
        search({"loss_final": "minimize"}).run(["population.neurons=2,3"])
    with pytest.raises(ConfigError, match="study_name=s: the stored study's objectives are loss_final, not update_ms_"):
        search({names.UPDATE_MEDIAN: "minimize"}).run(["population.neurons=2,3"])
    with pytest.raises(RuntimeError, match="no job runs"):  # the same objectives resume it: a second trial
        search({"loss_final": "minimize"}, trials=2).run(["population.neurons=2,3"])


def test_the_runs_view_shows_trial_numbers() -> None:
    assert f"tags.`{names.TRIAL}`" in json.loads(runs_view())["selectedColumns"]


SEARCH = (
    "-m",
    "hydra/sweeper=optuna",
    "run.measured_updates=4",
    "run.warmup_updates=1",
    "optimizer.lr=tag(log,interval(1e-3,3e-1))",
    "gradient_transform=none,clip_norm",
    "+hydra.sweeper.objectives.loss_final=minimize",  # after the default update_ms_median: minimize
    "hydra.sweeper.seed=3",
    # this 2-core machine is shared, so nearly every timing here is contended: keep their values
    "hydra.sweeper.contended=keep",
)


@pytest.mark.slow
@pytest.mark.usefixtures("migrated_store")
def test_a_multi_objective_study_resumes_and_the_report_names_its_pareto_front(tmp_path: Path) -> None:
    env = {"AXOEXP_LEASE_DIR": str(tmp_path / "leases")}
    first = run_cli(*SEARCH, "hydra.sweeper.n_trials=3", cwd=tmp_path, env=env, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    assert (tmp_path / "optuna.db").is_file(), "the study lives beside the MLflow store"
    second = run_cli(*SEARCH, "hydra.sweeper.n_trials=5", cwd=tmp_path, env=env, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "3 of 5 trials done" in second.stdout + second.stderr

    (summary,) = optuna.get_all_study_summaries(f"sqlite:///{tmp_path / 'optuna.db'}")
    study = optuna.load_study(study_name=summary.study_name, storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    assert [trial.number for trial in study.trials] == list(range(5))
    assert all(trial.state == optuna.trial.TrialState.COMPLETE for trial in study.trials)

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("axoexp").experiment_id])
    parents = sorted(
        (run for run in runs if run.data.tags.get(names.SWEEP_ROLE) == "parent"), key=lambda r: r.info.start_time
    )
    assert [parent.data.tags[names.STUDY] for parent in parents] == [study.study_name] * 2
    for parent, numbers in zip(parents, (range(3), range(3, 5)), strict=True):
        children = [run for run in runs if run.data.tags.get(names.PARENT_RUN_ID) == parent.info.run_id]
        assert sorted(int(run.data.tags[names.TRIAL]) for run in children) == list(numbers)
    trials = {int(run.data.tags[names.TRIAL]): run for run in runs if names.TRIAL in run.data.tags}
    for trial in study.trials:  # each trial's run holds what Optuna was told and the sampled values
        run = trials[trial.number]
        assert run.data.params["optimizer.lr"] == run.data.tags[names.trial_param_tag("optimizer.lr")]
        assert float(run.data.params["optimizer.lr"]) == trial.params["optimizer.lr"]
        assert trial.values == [run.data.metrics[names.UPDATE_MEDIAN], run.data.metrics["loss_final"]]

    # the newest sweep (the resumed one) and the front over the whole study
    report = subprocess.run([sys.executable, "-m", "axoexp.report"], cwd=tmp_path, capture_output=True, text=True)
    assert report.returncode == 0, report.stderr
    front = pareto_front(list(trials.values()), [(names.UPDATE_MEDIAN, "minimize"), ("loss_final", "minimize")])
    assert {trial.number for trial in study.best_trials} == {int(run.data.tags[names.TRIAL]) for run in front}
    listed = re.findall(r"^  trial +(\d+) .* run (\w+)$", report.stdout, re.MULTILINE)
    assert sorted(listed) == sorted((run.data.tags[names.TRIAL], run.info.run_id) for run in front)
    assert f"{len(front)} of 5 complete trials (5 in all)" in report.stdout
    assert (Path(parents[1].data.tags[names.SWEEP_DIR]) / "pareto.png").is_file()
    assert not any(math.isnan(run.data.metrics["loss_final"]) for run in front)


GAUGED_EXECUTOR = '''
from axoexp import component
from axoexp.executors.eager import EagerExecutor

@component("executor", "gauged")
class Gauged(EagerExecutor):
    """Eager, logging a metric of its own: kernel_bytes."""

    def prepare(self, example_inputs, example_targets):
        self.prepared_metrics["kernel_bytes"] = 1024.0
        return super().prepare(example_inputs, example_targets)
'''
REFUSED_SEARCHES = {
    "no_trials": (
        ("hydra.sweeper.n_trials=0", "optimizer.lr=interval(1e-3,1e-1)"),
        "axoexp: hydra.sweeper.n_trials=0: must be at least 1",
    ),
    "misspelt_direction": (
        ("optimizer.lr=interval(1e-3,1e-1)", "+hydra.sweeper.objectives.eval_loss_after=minimise"),
        "axoexp: hydra.sweeper.objectives.eval_loss_after=minimise (did you mean minimize?): "
        "valid directions: minimize, maximize",
    ),
    "misspelt_metric": (
        ("optimizer.lr=interval(1e-3,1e-1)", "+hydra.sweeper.objectives.eval_los_after=minimize"),
        "axoexp: hydra.sweeper.objectives.eval_los_after: no run logs such a metric (did you mean eval_loss_after?); ",
    ),
    "an_objective_set_without_a_plus": (  # it named update_ms_median as if it were the only one allowed
        ("optimizer.lr=interval(1e-3,1e-1)", "hydra.sweeper.objectives.eval_loss_after=minimize"),
        "axoexp: hydra.sweeper.objectives.eval_loss_after: not an objective of this search yet (it has "
        "update_ms_median); add one with +hydra.sweeper.objectives.eval_loss_after=minimize (or maximize), and "
        "drop one with ~hydra.sweeper.objectives.NAME",
    ),
    "a_bound_planning_refuses": (
        ("optimizer.lr=interval(-1,1)", "gradient_transform=none,clip_norm"),
        "axoexp: the search space holds configs planning refuses, where its trials would fail: "
        "optimizer.lr=-1.0 gradient_transform=none: invalid experiment config: optimizer.lr=-1.0: "
        "must be greater than 0; narrow the ranges or drop those choices",
    ),
}


@pytest.mark.slow
def test_a_search_that_cannot_work_creates_no_run_and_says_why_in_one_line(tmp_path: Path, empty_store: Path) -> None:
    """Bad settings, an objective no run logs, a range whose end planning refuses: exit 2 before any
    run exists; and a metric a plugin's executor logs is an objective like any other. Side by side."""
    calls = []
    for name, (overrides, _) in [*REFUSED_SEARCHES.items(), ("plugin_metric", ((), ""))]:
        (tmp_path / name / "plugins").mkdir(parents=True)
        shutil.copyfile(empty_store, tmp_path / name / "mlflow.db")
        env = {"AXOEXP_LEASE_DIR": str(tmp_path / name / "leases")}
        calls.append((("-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=1", *overrides), tmp_path / name, env))
    (tmp_path / "plugin_metric" / "plugins" / "gauged.py").write_text(GAUGED_EXECUTOR)
    calls[-1] = (
        (
            *calls[-1][0],
            "executor=gauged",
            "run.measured_updates=2",
            "run.warmup_updates=1",
            "optimizer.lr=interval(1e-3,1e-1)",
            "+hydra.sweeper.objectives.kernel_bytes=minimize",
            "hydra.sweeper.contended=keep",
        ),
        *calls[-1][1:],
    )
    *refused, plugin_metric = run_clis(calls)
    for (name, (_, message)), result in zip(REFUSED_SEARCHES.items(), refused, strict=True):
        client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / name / 'mlflow.db'}")
        runs = client.search_runs([experiment.experiment_id for experiment in client.search_experiments()])
        assert (result.returncode, result.stdout, len(runs)) == (2, "", 0), (name, result.stderr)
        assert result.stderr.startswith(message) and result.stderr.count("\n") == 1, (name, result.stderr)
        assert not (tmp_path / name / "outputs").exists(), name

    assert plugin_metric.returncode == 0, plugin_metric.stderr[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'plugin_metric' / 'mlflow.db'}")
    (trial,) = (
        run
        for run in client.search_runs([client.get_experiment_by_name("axoexp").experiment_id])
        if names.TRIAL in run.data.tags
    )
    assert trial.data.tags[names.TRIAL_STATE] == "COMPLETE"
    assert trial.data.metrics["kernel_bytes"] == 1024.0
    unknown = [metric for metric in trial.data.metrics if not names.may_be_logged(metric)]
    assert unknown == ["kernel_bytes"], "every metric of axoexp's own is one an objective may name"


FLAKY_EXECUTOR = '''
from axoexp import component
from axoexp.executors.eager import EagerExecutor

@component("executor", "flaky")
class Flaky(EagerExecutor):
    """Fails on its second update: a run that starts, measures a little, then fails."""
    calls = 0

    def step(self, inputs, targets):
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("flaky executor failed on purpose")
        return super().step(inputs, targets)
'''


@pytest.mark.slow
@pytest.mark.usefixtures("migrated_store")
def test_failed_trials_are_told_fail_and_n_jobs_trials_run_side_by_side(tmp_path: Path) -> None:
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "flaky.py").write_text(FLAKY_EXECUTOR)
    result = run_cli(
        "-m",
        "hydra/sweeper=optuna",
        "hydra/launcher=parallel",
        "run.lease_cpus=1",
        "hydra.launcher.n_jobs=2",
        "hydra.sweeper.n_jobs=2",
        "hydra.sweeper.n_trials=2",
        "executor=flaky",
        "run.measured_updates=3",
        "optimizer.lr=tag(log,interval(1e-3,1e-1))",
        cwd=tmp_path,
        env={"AXOEXP_LEASE_DIR": str(tmp_path / "leases")},
    )
    assert result.returncode == 1, "a search in which trials failed exits 1"
    assert "is launching 2 jobs" in result.stdout + result.stderr, "both trials in one batch of the parallel launcher"
    assert "axoexp: 2 trials failed (trials 0, 1), told to Optuna as FAIL" in result.stderr
    assert re.search(r"^study \S+: 2 trials, 0 complete, 2 failed$", result.stdout, re.MULTILINE), result.stdout
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    assert [trial.state for trial in study.trials] == [optuna.trial.TrialState.FAIL] * 2
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("axoexp").experiment_id])
    trials = sorted((run for run in runs if names.TRIAL in run.data.tags), key=lambda run: run.data.tags[names.TRIAL])
    assert [(run.info.status, run.data.tags[names.TRIAL_STATE]) for run in trials] == [("FAILED", "FAIL")] * 2
    assert all(run.data.tags[names.TRIAL_FAILURE].startswith("its run ended FAILED") for run in trials)


@pytest.mark.slow
@pytest.mark.usefixtures("migrated_store")
def test_a_stopped_search_tells_its_trial_fail_and_ends_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AXOEXP_LEASE_DIR", str(tmp_path / "leases"))
    search = ("-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2", "optimizer.lr=tag(log,interval(1e-3,1e-1))")
    process = start_cli(*search, *LONG_RUN, cwd=tmp_path)
    try:
        wait_for_updates(tmp_path / "outputs", 5, process)
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    assert [trial.state for trial in study.trials] == [optuna.trial.TrialState.FAIL], "the second trial never started"
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("axoexp").experiment_id])
    (parent,) = [run for run in runs if run.data.tags.get(names.SWEEP_ROLE) == "parent"]
    (trial,) = [run for run in runs if run is not parent]
    assert parent.info.status == "KILLED" and trial.info.status == "KILLED"
    assert trial.data.tags[names.TRIAL] == "0" and trial.data.tags[names.TRIAL_STATE] == "FAIL"
    assert trial.data.tags[names.TRIAL_FAILURE] == "the search was stopped: SIGTERM"
