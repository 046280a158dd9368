"""Built-in components on real AxoSim-Lite populations."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from axosim.checkpoint import save_checkpoint

from axoexp.components.gradient_transforms import clip_norm, clip_value
from axoexp.components.losses import causal_mse, huber, mse
from axoexp.components.population import lite, make_lite_model, sha256_of
from axoexp.errors import CheckpointError, ConfigError, IncompatibleComponentsError
from axoexp.plan import plan_experiment

CPU = torch.device("cpu")


def build(**overrides: object):
    return lite(device=CPU, dtype=torch.float32, seed=0, **overrides)


def test_causal_mse_ignores_exactly_the_four_warmup_steps() -> None:
    target = torch.randn(3, 12, 2)
    prediction = target.clone()
    prediction[:, :4] += 100.0
    assert causal_mse()(prediction, target).item() == 0.0
    assert mse()(prediction, target).item() > 0.0
    prediction[:, 4] += 1.0
    assert causal_mse()(prediction, target).item() == pytest.approx(3 * 2 / (3 * 8 * 2))


def test_causal_loss_on_too_few_steps_says_what_to_change() -> None:
    with pytest.raises(
        IncompatibleComponentsError,
        match=r"needs more than 4 time steps, and the population's predictions have 4; give the population more",
    ):
        causal_mse()(torch.zeros(3, 4, 2), torch.zeros(3, 4, 2))


def test_huber_is_quadratic_inside_delta_and_linear_outside() -> None:
    target = torch.zeros(1, 1, 1)
    assert huber(delta=1.0)(torch.full((1, 1, 1), 0.5), target).item() == pytest.approx(0.125)
    assert huber(delta=1.0)(torch.full((1, 1, 1), 3.0), target).item() == pytest.approx(2.5)


def test_clip_norm_bounds_the_total_norm_and_clip_value_each_element() -> None:
    parameters = [torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(3))]
    parameters[0].grad = torch.full((4,), 3.0)
    parameters[1].grad = torch.full((3,), -4.0)
    clip_norm(parameters=parameters, max_norm=2.0)()
    total = torch.cat([p.grad for p in parameters]).norm()
    assert total.item() == pytest.approx(2.0, rel=1e-5)
    parameters[0].grad = torch.tensor([5.0, -5.0, 0.1, 0.0])
    clip_value(parameters=parameters[:1], clip_value=0.5)()
    assert parameters[0].grad.tolist() == pytest.approx([0.5, -0.5, 0.1, 0.0])


def test_lite_population_has_the_seed_example_shape_and_reachable_targets() -> None:
    setup = build()
    inputs, targets = setup.batches[0]
    assert inputs.shape == (3, 12, 4) and targets.shape == (3, 12, 2)
    assert len(setup.batches) == 4
    assert set(inputs.unique().tolist()) <= {0.0, 1.0}
    with torch.no_grad():
        start = causal_mse()(setup.module(inputs), targets).item()
    assert start > 1e-6, "targets come from a perturbed teacher, so the student starts off them"
    assert torch.count_nonzero(targets[:, :4]) == 0, "Lite's first four outputs are warm-up zeros"


def test_lite_population_is_reproducible_from_its_seed() -> None:
    first, second = build(), build()
    for (a_in, a_out), (b_in, b_out) in zip(first.batches, second.batches, strict=True):
        assert torch.equal(a_in, b_in) and torch.equal(a_out, b_out)
    for a, b in zip(first.module.state_dict().values(), second.module.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    other = lite(device=CPU, dtype=torch.float32, seed=1)
    assert not torch.equal(first.batches[0][1], other.batches[0][1])


def test_lite_population_trains_only_the_chosen_banks() -> None:
    module = build(train_morphology=False).module
    trainable = {name for name, p in module.named_parameters() if p.requires_grad}
    assert trainable == {"behavior_adapter", "synaptic_log_efficacy"}
    with pytest.raises(ConfigError, match="trains no adaptation bank"):
        build(train_behavior=False, train_morphology=False, train_synaptic=False)


NO_BANK = ("population.train_behavior=false", "population.train_morphology=false", "population.train_synaptic=false")


@pytest.mark.parametrize(
    "overrides, problem",
    [
        (
            ("population.time_steps=4",),
            "population.time_steps=4: AxoSim-Lite's first 4 outputs are warm-up, with no gradient to adapt on, "
            "so an update needs more than 4 time steps; use population.time_steps=5 or more",
        ),
        (
            ("loss=huber", "loss.warmup_steps=12"),
            "population.time_steps=12 with loss.warmup_steps=12: loss=huber leaves out the first 12 outputs, so "
            "an update needs more than 12 time steps; use population.time_steps=13 or more, or loss.warmup_steps=11 "
            "or less",
        ),
        (NO_BANK, "population trains no adaptation bank: set at least one of population.train_behavior"),
    ],
)
def test_planning_refuses_what_a_factory_cannot_build(make_config, overrides: tuple[str, ...], problem: str) -> None:
    with pytest.raises(ConfigError, match=f"^invalid experiment config: {re.escape(problem)}"):
        plan_experiment(make_config(*overrides))


def test_planning_lets_through_what_the_factories_can_build(make_config) -> None:
    plan_experiment(make_config("population.time_steps=5", "loss=mse"))
    plan_experiment(make_config("population.time_steps=5"))
    plan_experiment(make_config(*NO_BANK[1:]))


def test_lite_population_declares_its_shape_bounds(registry) -> None:
    problems = registry.get("population", "lite").value_problems({"neurons": 0, "time_steps": 12, "input_rate": 2.0})
    assert problems == ["population.neurons=0: must be at least 1", "population.input_rate=2.0: must lie in [0, 1]"]


def test_lite_population_casts_to_the_requested_dtype() -> None:
    setup = lite(device=CPU, dtype=torch.float64, seed=0)
    assert setup.batches[0][0].dtype == torch.float64
    assert all(p.dtype == torch.float64 for p in setup.module.parameters())


def _saved_model(tmp_path: Path) -> Path:
    model = make_lite_model(
        branches=8,
        route_features=5,
        token_dim=6,
        state_dim=3,
        morphologies=3,
        generator=torch.Generator().manual_seed(7),
    )
    path = tmp_path / "lite.pt"
    save_checkpoint(model, path)
    return path


def test_checkpoint_is_loaded_with_its_dimensions_and_pin(tmp_path: Path) -> None:
    path = _saved_model(tmp_path)
    setup = build(checkpoint=str(path), checkpoint_sha256=sha256_of(path).upper())
    assert setup.description["branches"] == 8 and setup.description["morphologies"] == 3
    assert setup.description["checkpoint_sha256"] == sha256_of(path)


def test_an_unpinned_checkpoint_loads_weights_only(tmp_path: Path) -> None:
    setup = build(checkpoint=str(_saved_model(tmp_path)))
    assert setup.description["branches"] == 8 and setup.description["token_dim"] == 6


def test_checkpoint_with_a_wrong_pin_is_refused_before_unpickling(tmp_path: Path) -> None:
    path = _saved_model(tmp_path)
    with pytest.raises(
        CheckpointError, match=f"has SHA-256 {sha256_of(path)}, but population.checkpoint_sha256 pins 00ff"
    ):
        build(checkpoint=str(path), checkpoint_sha256="00ff")


def test_missing_or_foreign_checkpoint_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="is not a file"):
        build(checkpoint=str(tmp_path / "absent.pt"))
    from axosim.model import BranchELM, BranchELMConfig

    foreign = tmp_path / "elm.pt"
    save_checkpoint(BranchELM(BranchELMConfig()), foreign)
    with pytest.raises(CheckpointError, match="holds model_kind 'baseline', not an AxoSim-Lite model"):
        build(checkpoint=str(foreign))


def test_compile_workers_fork_unless_the_environment_or_a_daemon_decides() -> None:
    from axoexp.executors.compiler_startup import WORKER_START_ENV, worker_start_method

    assert worker_start_method({}, daemonic=False) == "fork"
    assert worker_start_method({WORKER_START_ENV: "subprocess"}, daemonic=False) is None
    assert worker_start_method({}, daemonic=True) is None  # a daemon may not fork a pool
