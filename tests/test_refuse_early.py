"""Refused while planning, for real: a memory estimate that counts everything a population holds,
checked against the peak memory a real build and update reach; updates too short for the loss."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

from axoexp.components.population import lite
from axoexp.errors import ConfigError, IncompatibleComponentsError
from axoexp.interfaces import LossFn, adaptation_parameters
from axoexp.plan import plan_experiment

CPU = torch.device("cpu")

# A fresh process builds the lite population with PARAMS, holds it and runs two eager updates
# (what a run holds at its peak: every batch and held-out batch, the teacher's targets, the
# activations and gradients of an update); it prints the growth of its peak RSS (VmHWM, reset
# first through /proc/self/clear_refs) over the RSS before, after a small build and update first,
# so torch's one-off allocations are not counted.
PEAK_PROBE = """
import json, re, sys
import torch
from axoexp.components.losses import causal_mse
from axoexp.components.population import lite
from axoexp.executors.base import eager_update

torch.set_num_threads(1)

def kib(field):
    return int(re.search(field + r":\\s+(\\d+) kB", open("/proc/self/status").read()).group(1))

def build_and_update(params):
    setup = lite(device=torch.device("cpu"), dtype=torch.float32, seed=0, **params)
    optimizer = torch.optim.Adam(list(setup.module.trainable_adaptation_parameters()), lr=1e-3)
    for index in range(2):
        eager_update(setup.module, optimizer, causal_mse(), None, *setup.batches[index % len(setup.batches)])
    return setup

build_and_update({})
with open("/proc/self/clear_refs", "w") as peak:
    peak.write("5")  # the peak (VmHWM) starts again from the RSS now
before = kib("VmRSS")
held = build_and_update(json.loads(sys.argv[1]))
print((kib("VmHWM") - before) * 1024)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "params",
    [
        {"neurons": 1000, "time_steps": 32, "contacts": 32, "batches": 1},
        {"neurons": 1000, "time_steps": 32, "contacts": 32, "batches": 16},
        {"neurons": 1000, "time_steps": 32, "contacts": 32, "batches": 64},
        {"neurons": 200, "time_steps": 12, "contacts": 4, "batches": 2000},  # many small batches (issue 24)
    ],
    ids=lambda params: f"{params['neurons']}x{params['time_steps']}x{params['contacts']}-batches{params['batches']}",
)
def test_the_memory_estimate_covers_the_measured_peak_within_one_and_a_half_times(params, loaded_registry) -> None:
    grown = int(
        subprocess.run(
            [sys.executable, "-c", PEAK_PROBE, json.dumps(params)], capture_output=True, text=True, check=True
        ).stdout
    )
    population = loaded_registry.get("population", "lite")
    estimate = population.factory.memory_estimate({**population.defaults(), **params}, torch.float32)
    assert grown <= estimate <= 1.5 * grown, f"estimate {estimate / 2**20:.1f} MiB, measured {grown / 2**20:.1f} MiB"


WARM_UP = "AxoSim-Lite's first 4 outputs are warm-up, with no gradient to adapt on"


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["population.time_steps=3", "loss=causal_mse"],
            f"population.time_steps=3: {WARM_UP}, so an update needs more than 4 time steps; "
            "use population.time_steps=5 or more",
        ),
        (["population.time_steps=1", "loss=mse"], f"population.time_steps=1: {WARM_UP}"),
        (["population.time_steps=4", "loss=mse"], f"population.time_steps=4: {WARM_UP}"),
        (["population.time_steps=3", "loss=huber"], f"population.time_steps=3: {WARM_UP}"),
        (["population.time_steps=3", "loss=huber", "loss.warmup_steps=2"], f"population.time_steps=3: {WARM_UP}"),
        (["population.time_steps=3", "loss.warmup_steps=1"], f"population.time_steps=3: {WARM_UP}"),
        (
            ["population.time_steps=8", "loss=causal_mse", "loss.warmup_steps=8"],
            "population.time_steps=8 with loss.warmup_steps=8: loss=causal_mse leaves out the first 8 outputs, so an "
            "update needs more than 8 time steps; use population.time_steps=9 or more, or loss.warmup_steps=7 or less",
        ),
        (
            ["population.time_steps=4", "loss=huber", "loss.warmup_steps=6"],
            "population.time_steps=4 with loss.warmup_steps=6: loss=huber leaves out the first 6 outputs, so an "
            "update needs more than 6 time steps; use population.time_steps=7 or more",
        ),
        (
            ["population.lengths=uniform:4:40", "loss=mse"],
            f"population.lengths='uniform:4:40': a batch may have 4 steps, but {WARM_UP}, so every batch needs "
            "more than 4 time steps; use lengths of 5 or more",
        ),
        (["population.lengths=[4]", "loss=mse"], "population.lengths=[4]: a batch may have 4 steps, but"),
        (
            ["population.lengths=[6,12]", "loss.warmup_steps=8"],
            "population.lengths=[6, 12] with loss.warmup_steps=8: a batch may have 6 steps, but loss=causal_mse "
            "leaves out the first 8 outputs, so every batch needs more than 8 time steps; use lengths of 9 or more, "
            "or loss.warmup_steps=5 or less",
        ),
    ],
)
def test_updates_too_short_for_the_loss_are_refused_while_planning_in_one_line(make_config, overrides, message) -> None:
    with pytest.raises(ConfigError) as refused:
        plan_experiment(make_config(*overrides))
    text = str(refused.value)
    assert text.startswith(f"invalid experiment config: {message}"), text
    assert "\n" not in text, "one line"


def test_a_loss_whose_warm_up_leaves_steps_is_planned(make_config) -> None:
    plan_experiment(make_config("population.time_steps=9", "loss=causal_mse", "loss.warmup_steps=8"))
    plan_experiment(make_config("population.time_steps=5", "loss=mse"))
    plan_experiment(make_config("population.lengths=uniform:5:40", "loss=mse"))
    plan_experiment(make_config("population.lengths=[9,12]", "loss=huber", "loss.warmup_steps=8"))


def adapts(time_steps: int, loss: LossFn) -> bool:
    """Whether an Adam update of a real lite population on a batch of ``time_steps`` steps changes
    its loss on that batch."""
    setup = lite(device=CPU, dtype=torch.float32, seed=0, time_steps=time_steps)
    inputs, targets = setup.batches[0]
    optimizer = torch.optim.Adam(adaptation_parameters(setup.module), lr=1e-2)
    try:
        before = loss(setup.module(inputs), targets)
    except IncompatibleComponentsError:  # a causal loss with no step left after its warm-up
        return False
    if not before.requires_grad:  # no output the banks reach: backward would raise
        return False
    before.backward()
    optimizer.step()
    with torch.no_grad():
        return loss(setup.module(inputs), targets).item() != before.item()


@pytest.mark.parametrize(
    "overrides",
    [("loss=mse",), ("loss=huber", "loss.warmup_steps=2"), ("loss=causal_mse",), ("loss=huber", "loss.warmup_steps=6")],
    ids=" ".join,
)
def test_planning_accepts_exactly_the_time_steps_whose_updates_adapt(make_config, loaded_registry, overrides) -> None:
    """Found on real populations, not assumed: each time step count from 1 to 8 is planned exactly
    when an update on it changes the loss (the smallest accepted adapts, the largest refused does not)."""
    verdicts = {}
    for time_steps in range(1, 9):
        config = make_config(*overrides, f"population.time_steps={time_steps}")
        params = OmegaConf.to_container(config.loss)
        loss = loaded_registry.get("loss", params.pop("name")).build(params)
        try:
            plan_experiment(config)
        except ConfigError:
            planned = False
        else:
            planned = True
        verdicts[time_steps] = planned, adapts(time_steps, loss)
    assert all(planned == adapted for planned, adapted in verdicts.values()), f"(planned, adapts): {verdicts}"
    assert {planned for planned, _ in verdicts.values()} == {True, False}, "the boundary lies inside the range"
