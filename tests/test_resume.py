"""Resume: which earlier runs a sweep's job reuses, in a real sqlite store with composed configs."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf, open_dict

from axoexp import metadata, names
from axoexp.errors import ConfigError
from axoexp.plan import plan_experiment
from axoexp.sweep import Resume, note_remeasured_job, print_reuse, result_key, resume_job, sweep_definition
from axoexp.sweep_plan import plan_jobs
from axoexp.tracking import config_digest, experiment_id


def _finished(
    client: MlflowClient,
    experiment: str,
    config,
    parent: str | None = None,
    status: str = "FINISHED",
    **tags: str,
) -> str:
    tags = {
        names.CONFIG_HASH: config_digest(OmegaConf.to_container(config, resolve=True)),
        names.RESULT_KEY: result_key(config),
        names.TIMING_CONTENTION: "none",
        names.TIMING_NOISE: "low",
        **{key.replace("_", "."): value for key, value in tags.items()},
    }
    if parent:
        tags[names.PARENT_RUN_ID] = parent
    run_id = client.create_run(experiment, tags=tags).info.run_id
    client.log_param(run_id, names.SWEEP_REPEAT_PARAM, str(config.sweep.repeat))
    client.set_terminated(run_id, status=status)
    return run_id


def _resume(config, job: int) -> Resume:
    """What resume decided for job ``job``, recorded on its parent as for a job planning accepted."""
    resume = resume_job(config, job)
    if resume.run is None:
        note_remeasured_job(config, job, resume.remeasure_reason)
    return resume


def _reused(config, job: int):
    return _resume(config, job).run


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
    assert _reused(make_config("population.neurons=2", f"sweep.parent_run_id={current}"), 0) is None

    earlier = _sweep(client, experiment, "population.neurons=2,3", "sweep.resume=false", "tracking.uri=x")
    _finished(client, experiment, job, parent=earlier, status="FAILED")
    measured = _finished(client, experiment, job, parent=earlier)
    _finished(client, experiment, make_config("population.neurons=3"), parent=earlier)
    reused = _reused(make_config("population.neurons=2", f"sweep.parent_run_id={current}"), 4)
    assert reused is not None and reused.info.run_id == measured
    assert client.get_run(current).data.tags[f"{names.REUSED_PREFIX}job4"] == measured

    print_reuse(client, client.get_run(current), children=1)
    assert capsys.readouterr().out == (
        "measured 1 new job (no earlier run to reuse; "
        "sweep.resume=any also reuses other sweeps' runs and single runs)\n"
        f"reused 1 of 2 jobs from 'sweep population.neurons=2,3 sweep.resume=false "
        f"tracking.uri=x' ({earlier}) (sweep.resume=false re-measures)\n"
    )
    assert (
        _reused(make_config("population.neurons=2", f"sweep.parent_run_id={current}", "sweep.resume=false"), 4) is None
    )
    assert _reused(make_config("population.neurons=2"), 4) is None, "a single run always runs"


def test_resume_any_reuses_a_single_run_too(make_config, client: MlflowClient) -> None:
    experiment = experiment_id(client, "axoexp")
    single = _finished(client, experiment, make_config("population.neurons=2"))
    current = _sweep(client, experiment, "population.neurons=2,3", "sweep.resume=any")
    reused = _reused(make_config("population.neurons=2", f"sweep.parent_run_id={current}", "sweep.resume=any"), 0)
    assert reused is not None and reused.info.run_id == single


def test_an_unknown_resume_mode_is_refused_naming_the_choices(make_config) -> None:
    with pytest.raises(ConfigError, match="sweep.resume='maybe': choose one of same_sweep, any, false"):
        plan_experiment(make_config("sweep.resume=maybe"))


def test_resume_measures_again_where_the_earlier_run_was_contended_and_says_why(make_config, client) -> None:
    """Contended, noisy, or of an older store that never recorded its load: no quiet timing to reuse."""
    experiment = experiment_id(client, "axoexp")
    earlier = _sweep(client, experiment, "population.neurons=2,3,4")
    job = make_config("population.neurons=2")
    contended = _finished(client, experiment, job, parent=earlier, timing_contention="cpu", timing_noise="high")
    _finished(client, experiment, make_config("population.neurons=3"), parent=earlier, timing_noise="high")
    unlabelled = _finished(client, experiment, make_config("population.neurons=4"), parent=earlier)
    for label in (names.TIMING_CONTENTION, names.TIMING_NOISE):
        client.delete_tag(unlabelled, label)
    current = _sweep(client, experiment, "population.neurons=2,3,4")

    resume = _resume(make_config("population.neurons=2", f"sweep.parent_run_id={current}"), 0)
    assert resume.run is None
    assert resume.remeasure_reason == (
        f"contended: the earlier run {contended} is no quiet timing (contended (cpu), noisy; "
        "sweep.resume_contended=true reuses it)"
    )
    assert client.get_run(current).data.tags[f"{names.REMEASURED_PREFIX}job0"] == resume.remeasure_reason
    noisy_resume = _resume(make_config("population.neurons=3", f"sweep.parent_run_id={current}"), 1)
    assert noisy_resume.run is None and "(noisy;" in noisy_resume.remeasure_reason
    unlabelled_resume = _resume(make_config("population.neurons=4", f"sweep.parent_run_id={current}"), 2)
    assert unlabelled_resume.run is None and unlabelled_resume.remeasure_reason.startswith("load not recorded: ")

    allowed = make_config("population.neurons=2", f"sweep.parent_run_id={current}", "sweep.resume_contended=true")
    assert _reused(allowed, 0).info.run_id == contended


def test_resume_names_the_unfinished_run_and_the_changed_code_file(make_config, client) -> None:
    experiment = experiment_id(client, "axoexp")
    earlier = _sweep(client, experiment, "population.neurons=2,3")
    failed = _finished(client, experiment, make_config("population.neurons=2"), parent=earlier, status="FAILED")
    job3 = make_config("population.neurons=3")
    files = metadata.code_state()[names.CODE_FILES].replace("sweep.py=", "sweep.py=0", 1)
    old_code = client.create_run(
        experiment,
        tags={
            names.CONFIG_HASH: config_digest(OmegaConf.to_container(job3, resolve=True)),
            names.RESULT_KEY: "an older key",
            names.PARENT_RUN_ID: earlier,
            names.CODE_FILES: files,
        },
    ).info.run_id
    client.log_param(old_code, names.SWEEP_REPEAT_PARAM, "0")
    client.set_terminated(old_code)
    current = _sweep(client, experiment, "population.neurons=2,3")

    reason = _resume(make_config("population.neurons=2", f"sweep.parent_run_id={current}"), 0).remeasure_reason
    assert reason == f"not finished: the earlier run {failed} ended FAILED"
    reason = _resume(make_config("population.neurons=3", f"sweep.parent_run_id={current}"), 1).remeasure_reason
    assert reason == f"code changed: sweep.py since the earlier run {old_code}"


def test_a_job_without_an_earlier_run_is_new_and_counted_apart_from_changed_ones(
    make_config, client: MlflowClient, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _sweep(client, "0", "population.neurons=2,3")  # experiment 0, the store's Default: nothing in axoexp
    reason = _resume(make_config("population.neurons=2", f"sweep.parent_run_id={first}"), 0).remeasure_reason
    assert reason == "new: no earlier run (experiment 'axoexp' is new)"

    experiment = experiment_id(client, "axoexp")
    earlier = _sweep(client, experiment, "population.neurons=2,3,4")
    contended = _finished(client, experiment, make_config("population.neurons=2"), parent=earlier, timing_noise="high")
    current = _sweep(client, experiment, "population.neurons=2,3,4")
    for job, neurons in enumerate((2, 3, 4)):
        _resume(make_config(f"population.neurons={neurons}", f"sweep.parent_run_id={current}"), job)
    tags = client.get_run(current).data.tags
    assert tags[f"{names.REMEASURED_PREFIX}job1"] == (
        "new: no earlier run of this resolved config in an earlier sweep of the same jobs"
    )
    assert tags[f"{names.REMEASURED_PREFIX}job0"].startswith(f"contended: the earlier run {contended}")
    print_reuse(client, client.get_run(current), children=3)
    assert capsys.readouterr().out == (
        "measured 2 new jobs (no earlier run to reuse; "
        "sweep.resume=any also reuses other sweeps' runs and single runs); "
        "re-measured 1 job: 1 contended (each job's line says which run or file)\n"
    )
    print_reuse(client, client.get_run(current), children=3, stopped=True)  # a signal stopped the sweep
    assert capsys.readouterr().out.startswith("began measuring 2 new jobs (no earlier run to reuse; ")


def _sweep_config(*overrides: str, task: tuple[str, ...] = ()):
    """The sweep's own config (Hydra's node included), as the sweep callback sees it."""
    with initialize_config_module(config_module="axoexp.conf", version_base="1.3"):
        config = compose("config", overrides=list(overrides), return_hydra_config=True)
        with open_dict(config.hydra.overrides):
            config.hydra.overrides.task = [*overrides, *task]
        refused, job_configs = plan_jobs(config)
    return refused, job_configs, list(config.hydra.overrides.task)


@pytest.mark.slow  # plans each of the preset's 8 jobs twice: 3 s
def test_a_preset_and_its_overrides_spelled_out_are_one_sweep(loaded_registry) -> None:
    """Jobs match on their resolved configs, not on how the overrides spelled them."""
    refused, preset_jobs, preset_overrides = _sweep_config("+experiment=sweep_cpu")
    _, spelled_jobs, spelled_overrides = _sweep_config(
        task=("gradient_transform=none,clip_norm", "population.time_steps=12,64", "population.neurons=3,64")
    )
    assert refused == {} and len(preset_jobs) == len(set(preset_jobs)) == 8
    assert sorted(preset_jobs) == sorted(spelled_jobs)
    assert sweep_definition(preset_overrides, preset_jobs) == sweep_definition(spelled_overrides, spelled_jobs)
    _, other_jobs, other_overrides = _sweep_config(task=("population.neurons=3,65",))
    assert sweep_definition(other_overrides, other_jobs) != sweep_definition(preset_overrides, preset_jobs)
