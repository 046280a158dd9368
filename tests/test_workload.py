"""Your population, your workload: eligibility from what a population builds, the shape it says,
and batched streams (issue 25, parts 1-3). The plugins are this folder's ``plugins/``: a
population written the AxoSim documentation's way, and a CPU executor with the fused kernel's
preconditions."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch
from helpers import PLUGINS, REPO, run_cli, start_cli
from mlflow.tracking import MlflowClient

from axoexp import names
from axoexp.components.losses import causal_mse
from axoexp.components.population import lite
from axoexp.errors import ConfigError
from axoexp.executors.base import batch_loss
from axoexp.experiment import run_experiment
from axoexp.interfaces import PopulationSetup
from axoexp.plan import plan_experiment

EVERY_EXECUTOR = [
    "compiled_cudagraph",
    "cudagraph",
    "eager",
    "fused_cudagraph",
    "fused_eager",
    "reduce_overhead",
    "regional_cudagraph",
]


# --- 1. eligibility from what the population builds --------------------------------------------------


def test_a_documented_plugin_population_meets_every_executors_preconditions(make_config, plugin_registry) -> None:
    plan = plan_experiment(make_config("population=doc_lite"), plugin_registry)
    assert plan.probe is not None and plan.probe.module.behavior_adapter.device.type == "meta", "built on meta"
    refusals = {
        name: plugin_registry.get("executor", name).factory.refusal(module=plan.probe.module, dtype=torch.float32)
        for name in plugin_registry.names("executor")
    }
    assert refusals == dict.fromkeys(EVERY_EXECUTOR)


@pytest.mark.parametrize(
    ("overrides", "executor", "reason", "able"),
    [
        (
            ["population.train_neuron=true"],
            "fused_eager",
            "the fused kernel trains only adaptation banks, but neuron weights require grad: ",
            "eager (with device=cuda: compiled_cudagraph, cudagraph, reduce_overhead, regional_cudagraph)",
        ),
        (
            ["population.subclass=true"],
            "fused_eager",
            "the fused kernel runs an axosim.AxoSimPopulation, and the population is a TracedPopulation",
            "eager (with device=cuda: compiled_cudagraph, cudagraph, reduce_overhead)",
        ),
        (
            ["dtype=float64"],
            "fused_eager",
            "the fused kernel runs float32, not dtype=float64",
            "eager (with device=cuda: compiled_cudagraph, cudagraph, reduce_overhead, regional_cudagraph)",
        ),
    ],
)
def test_an_executor_that_cannot_run_the_population_is_refused_before_any_run(
    make_config, client, plugin_registry, overrides, executor, reason, able
) -> None:
    with pytest.raises(ConfigError) as refused:
        run_experiment(make_config("population=doc_lite", f"executor={executor}", *overrides), registry=plugin_registry)
    assert str(refused.value).startswith(
        f"invalid experiment config: executor={executor} cannot run this experiment: {reason}"
    )
    assert str(refused.value).endswith(f"; executors that can: {able}") and "\n" not in str(refused.value)
    assert client.get_experiment_by_name("axoexp") is None, "no MLflow run"


def test_the_regions_refuse_a_population_subclass(make_config, plugin_registry) -> None:
    plan = plan_experiment(make_config("population=doc_lite", "population.subclass=true"), plugin_registry)
    regional = plugin_registry.get("executor", "regional_cudagraph").factory
    assert regional.refusal(module=plan.probe.module, dtype=torch.float32) == (
        "its regions are AxoSim-Lite's step_token calls: it runs an axosim.AxoSimPopulation, "
        "and the population is a TracedPopulation"
    )


@pytest.mark.slow
def test_the_cli_refuses_in_one_line_and_runs_the_plugin_through_the_fused_kernel(tmp_path: Path) -> None:
    env = {"AXOEXP_PLUGINS_DIR": str(PLUGINS), "TRITON_INTERPRET": "1"}
    refused_in, ran_in = tmp_path / "refused", tmp_path / "ran"
    refused_in.mkdir()
    ran_in.mkdir()
    refusing = start_cli(  # side by side with the run below, in a folder of its own
        "population=doc_lite", "population.train_neuron=true", "executor=fused_eager", cwd=refused_in, env=env
    )
    ran = run_cli(
        "population=doc_lite",
        "executor=fused_eager",
        "verify.enabled=true",
        "run.measured_updates=2",
        cwd=ran_in,
        env=env,
    )
    _, refused = refusing.communicate(timeout=300)
    assert refusing.returncode == 2
    assert (
        refused.strip().count("\n") == 0
        and "executors that can: eager (with device=cuda: compiled_cudagraph," in refused
    )
    assert not (refused_in / "mlflow.db").exists() or not _runs(refused_in), "no MLflow run"

    assert ran.returncode == 0, ran.stderr
    assert re.search(r"verify\s+passed", ran.stdout)
    (run,) = _runs(ran_in)
    assert run.data.tags[names.SHAPE] == "6x16x5" and run.data.metrics["verify_passed"] == 1.0


def _runs(cwd: Path) -> list:
    client = MlflowClient(f"sqlite:///{cwd / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("axoexp")
    return client.search_runs([experiment.experiment_id]) if experiment else []


# --- 2. the population says its own shape ----------------------------------------------------------


def test_a_plugin_population_is_named_and_tagged_with_its_own_shape(make_config, client, plugin_registry) -> None:
    config = make_config("population=doc_lite", "population.size=7", "population.steps=12", "run.measured_updates=2")
    result = run_experiment(config, registry=plugin_registry)
    run = client.get_run(result.run_id)
    assert re.fullmatch(r"\d\d-\d\d \d\d:\d\d:\d\d eager 7x12x5 cpu", run.info.run_name)
    assert run.data.tags[names.SHAPE] == "7x12x5" and run.data.tags[names.STREAMS] == "1"
    assert run.inputs.dataset_inputs[0].dataset.name == "doc_lite-7x12x5"


@pytest.mark.parametrize("seed", [0, 7])
def test_the_held_out_batches_are_no_replay_of_the_generator_that_built_the_model(seed: int) -> None:
    """The held-out batches' generator was seeded ``seed + 2**32``, which torch's CPU generator takes
    as ``seed``: their spikes were the very numbers the model and the teacher were built from."""
    setup = lite(device=torch.device("cpu"), dtype=torch.float32, seed=seed)
    (inputs, _), *_ = setup.eval_batches
    replayed = torch.rand(inputs.shape, generator=torch.Generator().manual_seed(seed)) < 0.2
    assert not torch.equal(inputs.bool(), replayed)
    again = lite(device=torch.device("cpu"), dtype=torch.float32, seed=seed, batches=3)
    pairs = zip(setup.eval_batches, again.eval_batches, strict=True)
    assert all(torch.equal(a, b) for pair in pairs for a, b in zip(*pair, strict=True)), "whatever batches is"


def test_no_generic_module_names_the_builtin_populations_parameters() -> None:
    """Only the built-in population (and the AxoSim-Lite kernels and executors, whose rows are
    neurons) may name ``neurons``, ``time_steps`` or ``contacts``."""
    lite_specific = {"components/population.py", "executors/fused.py", "executors/regional.py"}
    package = REPO / "axoexp"
    offenders = [
        f"{path.relative_to(package)}:{number}: {line.strip()}"
        for path in sorted(package.rglob("*.py"))
        if str(path.relative_to(package)) not in lite_specific and path.parent.name != "kernels"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\b(neurons|time_steps|contacts)\b", line)
    ]
    assert not offenders, "\n".join(offenders)


# --- 3. batched streams ----------------------------------------------------------------------------


def _old_update_losses(seed: int, updates: int) -> list[float]:
    """The update before batched streams existed: ``loss_fn(module(inputs), targets)``."""
    setup = lite(device=torch.device("cpu"), dtype=torch.float32, seed=seed)
    optimizer = torch.optim.Adam(list(setup.module.trainable_adaptation_parameters()), lr=1e-3)
    loss_fn = causal_mse()
    losses = []
    for index in range(updates):
        inputs, targets = setup.batches[index % len(setup.batches)]
        optimizer.zero_grad(set_to_none=False)
        loss = loss_fn(setup.module(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_one_stream_gives_exactly_the_numbers_of_the_update_before_batching(make_config) -> None:
    # run.threads fixed: with run.threads=null the thread calibration changes the losses after the first update
    # (seen at main cbfa51b; reported, not fixed here)
    config = make_config(
        "seed=5", "population.batch_size=1", "run.threads=1", "run.warmup_updates=1", "run.measured_updates=4"
    )
    result = run_experiment(config)
    assert result.streams == 1
    assert result.losses == _old_update_losses(5, 5)


def test_a_batched_update_is_the_mean_of_its_streams_losses() -> None:
    """The definition: the mean over the B streams of each stream's loss, one set of banks."""
    setup = lite(device=torch.device("cpu"), dtype=torch.float32, seed=3, batch_size=4, neurons=5, time_steps=16)
    inputs, targets = setup.batches[0]
    assert inputs.shape == (4, 5, 16, 4) and setup.streams == 4 and setup.shape == (5, 16, 4)
    loss_fn = causal_mse()
    batched = copy.deepcopy(setup.module)
    loss = batch_loss(batched, loss_fn, inputs, targets)
    loss.backward()
    separate = copy.deepcopy(setup.module)
    each = [loss_fn(separate(inputs[stream]), targets[stream]) for stream in range(4)]
    mean = torch.stack(each).mean()
    mean.backward()
    torch.testing.assert_close(loss, mean, rtol=1e-6, atol=0)
    for got, expected in zip(
        batched.trainable_adaptation_parameters(), separate.trainable_adaptation_parameters(), strict=True
    ):
        torch.testing.assert_close(got.grad, expected.grad, rtol=1e-5, atol=1e-9)
    assert all(loss_fn(separate(inputs[s]), targets[s]) != each[0] for s in (1, 2, 3)), "the streams differ"


def test_a_batched_run_logs_its_streams_and_streams_per_second(make_config, client) -> None:
    result = run_experiment(make_config("population.batch_size=3", "run.measured_updates=3"))
    run = client.get_run(result.run_id)
    assert result.streams == 3 and run.data.tags[names.STREAMS] == "3"
    assert run.data.tags[names.SHAPE] == "3x12x4" and run.data.tags[names.SHAPE_INPUTS] == "(3, 3, 12, 4)"
    assert " 3x12x4 B=3 cpu" in run.info.run_name
    median = run.data.metrics[names.UPDATE_MEDIAN]
    assert run.data.metrics[names.STREAMS_PER_S] == pytest.approx(3 * 1000 / median)


def _reads_values(*, device: torch.device, dtype: torch.dtype, seed: int, scale: float = 1.0) -> PopulationSetup:
    """A population whose factory reads a tensor's value, which no meta tensor has."""
    setup = lite(device=device, dtype=dtype, seed=seed)
    if float(setup.batches[0][0].sum()) < 0:  # data-dependent: fails on the meta device
        raise AssertionError("unreachable")
    return setup


def test_planning_builds_a_small_population_on_the_cpu_and_a_large_one_on_meta(registry) -> None:
    """Whatever device the run is for (the probe's device depends on the estimate alone)."""
    from axoexp.plan import CPU_PROBE_BYTES, META, memory_estimate, probe_device

    lite_entry = registry.get("population", "lite")
    large = {"neurons": CPU_PROBE_BYTES // 1000}  # an estimate above the bound, whatever the model's size
    assert probe_device(memory_estimate(lite_entry, {}, torch.float32)) == torch.device("cpu")
    assert memory_estimate(lite_entry, large, torch.float32) > CPU_PROBE_BYTES
    assert probe_device(memory_estimate(lite_entry, large, torch.float32)) == META
    assert probe_device(None) == META, "without an estimate"


def test_a_population_that_cannot_be_built_on_meta_is_judged_when_built(
    make_config, client, registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planning builds a population whose estimate says it is small on the CPU, where it reads its
    values; any other on the meta device, where it cannot."""
    from hydra.core.config_store import ConfigStore

    from axoexp import plan as planning
    from axoexp.config import node_class

    registry.register("population", "reads_values", _reads_values, source="tests/test_workload.py")
    ConfigStore.instance().store(
        group="population", name="reads_values", node=node_class(registry.get("population", "reads_values"))
    )
    plan = plan_experiment(make_config("population=reads_values"), registry)
    assert plan.probe is None, "without a memory estimate it is built on the meta device"
    asked = []  # a plugin's hook may be slow: it was asked twice per planning
    monkeypatch.setattr(
        _reads_values, "memory_estimate", lambda params, dtype: asked.append(params) or 1, raising=False
    )
    plan = plan_experiment(make_config("population=reads_values"), registry)
    assert plan.probe is not None and plan.shape == "3x12x4", "small: built on the CPU"
    assert len(asked) == 1, "the estimate is asked once"
    assert plan.probe.batches[0][0].device == planning.META, "kept on the meta device once checked"
    monkeypatch.setattr(planning, "probe_device", lambda *_: planning.META)
    plan = plan_experiment(make_config("population=reads_values"), registry)
    assert plan.probe is None and plan.shape == "?"
    result = run_experiment(make_config("population=reads_values", "run.measured_updates=2"), registry=registry)
    run = client.get_run(result.run_id)
    assert " eager ? cpu" in run.info.run_name and run.data.tags[names.SHAPE] == "3x12x4", "tagged as built"
