"""Resume: which earlier runs a sweep's job reuses, in a real sqlite store with composed configs."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from axoexp import names
from axoexp.errors import ConfigError
from axoexp.plan import plan_experiment
from axoexp.sweep import print_reuse, result_key, reused_run, sweep_definition
from axoexp.tracking import config_digest, experiment_id


def _finished(
    client: MlflowClient, experiment: str, config, parent: str | None = None, status: str = "FINISHED"
) -> str:
    tags = {
        names.CONFIG_HASH: config_digest(OmegaConf.to_container(config, resolve=True)),
        names.RESULT_KEY: result_key(config),
    }
    if parent:
        tags[names.PARENT_RUN_ID] = parent
    run_id = client.create_run(experiment, tags=tags).info.run_id
    client.log_param(run_id, names.SWEEP_REPEAT_PARAM, str(config.sweep.repeat))
    client.set_terminated(run_id, status=status)
    return run_id


def _sweep(client: MlflowClient, experiment: str, *overrides: str) -> str:
    return client.create_run(
        experiment,
        run_name="sweep " + " ".join(overrides),
        tags={names.SWEEP_ROLE: "parent", names.SWEEP_DEFINITION: sweep_definition(list(overrides))},
    ).info.run_id


def test_a_job_reuses_only_finished_jobs_of_earlier_sweeps_with_the_same_definition(
    make_config, client: MlflowClient, capsys: pytest.CaptureFixture[str]
) -> None:
    experiment = experiment_id(client, "axoexp")
    job = make_config("population.neurons=2")
    _finished(client, experiment, job)  # a single run with the same config
    _finished(client, experiment, job, parent=_sweep(client, experiment, "population.neurons=2,5"))
    current = _sweep(client, experiment, "population.neurons=2,3")
    assert reused_run(make_config("population.neurons=2", f"sweep.parent_run_id={current}"), 0) is None

    earlier = _sweep(client, experiment, "population.neurons=2,3", "sweep.resume=false", "tracking.uri=x")
    _finished(client, experiment, job, parent=earlier, status="FAILED")
    measured = _finished(client, experiment, job, parent=earlier)
    _finished(client, experiment, make_config("population.neurons=3"), parent=earlier)
    reused = reused_run(make_config("population.neurons=2", f"sweep.parent_run_id={current}"), 4)
    assert reused is not None and reused.info.run_id == measured
    assert client.get_run(current).data.tags[f"{names.REUSED_PREFIX}job4"] == measured

    print_reuse(client, client.get_run(current), children=1)
    assert capsys.readouterr().out == (
        f"reused 1 of 2 jobs from 'sweep population.neurons=2,3 sweep.resume=false "
        f"tracking.uri=x' ({earlier}) (sweep.resume=false re-measures)\n"
    )
    assert (
        reused_run(make_config("population.neurons=2", f"sweep.parent_run_id={current}", "sweep.resume=false"), 4)
        is None
    )
    assert reused_run(make_config("population.neurons=2"), 4) is None, "a single run always runs"


def test_resume_any_reuses_a_single_run_too(make_config, client: MlflowClient) -> None:
    experiment = experiment_id(client, "axoexp")
    single = _finished(client, experiment, make_config("population.neurons=2"))
    current = _sweep(client, experiment, "population.neurons=2,3", "sweep.resume=any")
    reused = reused_run(make_config("population.neurons=2", f"sweep.parent_run_id={current}", "sweep.resume=any"), 0)
    assert reused is not None and reused.info.run_id == single


def test_an_unknown_resume_mode_is_refused_naming_the_choices(make_config) -> None:
    with pytest.raises(ConfigError, match="sweep.resume='maybe': choose one of same_sweep, any, false"):
        plan_experiment(make_config("sweep.resume=maybe"))
