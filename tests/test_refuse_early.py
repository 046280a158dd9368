"""Refused while planning, for real: a memory estimate that counts everything a population holds,
checked against the peak memory a real build and update reach; updates too short for the loss."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from axoexp.errors import ConfigError
from axoexp.plan import plan_experiment

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


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["population.time_steps=3", "loss=causal_mse"],
            "loss=causal_mse: a causal loss skips the first 4 warm-up steps, so it needs more than 4 time steps, "
            "and the population's predictions have 3",
        ),
        (
            ["population.time_steps=1", "loss=mse"],
            "population.time_steps=1: AxoSim-Lite's first 4 outputs are warm-up, with no gradient to adapt on; "
            "use at least 4 (more than that for a causal loss)",
        ),
        (["population.time_steps=3", "loss=huber"], "population.time_steps=3: AxoSim-Lite's first 4 outputs"),
        (
            ["population.time_steps=8", "loss=causal_mse", "loss.warmup_steps=8"],
            "loss=causal_mse: a causal loss skips the first 8 warm-up steps",
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
    plan_experiment(make_config("population.time_steps=4", "loss=mse"))
