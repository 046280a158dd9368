"""A plugin population written the way AxoSim's documentation builds one: an AxoSim-Lite neuron
(``AxoSimLite(SupportP4Config(...), route_features)``) inside ``AxoSimPopulation(...,
morphology_indices=..., contact_branch_indices=...)``, adaptation banks enabled. It declares
nothing but what it builds: its parameters are named ``size``, ``steps`` and ``inputs``, and
``streams`` > 1 gives batched streams (B, size, steps, inputs). ``train_neuron`` also trains the
neuron's own weights (which the fused kernel cannot), ``subclass`` wraps it in a subclass of
AxoSimPopulation (which neither the fused kernel nor the compiled regions reproduce). Two more
batches of the same teacher are held out (``eval_batches``): the run evaluates on them."""

from __future__ import annotations

import copy

import torch
from axosim import AxoSimLite, AxoSimPopulation
from axosim.support_surrogate import SupportP4Config

from axoexp import component
from axoexp.interfaces import PopulationSetup


class TracedPopulation(AxoSimPopulation):
    """A population whose forward may differ from axosim's (here it does not)."""


@component("population", "doc_lite")
def doc_lite(
    *,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
    size: int = 6,
    steps: int = 16,
    inputs: int = 5,
    streams: int = 1,
    train_neuron: bool = False,
    subclass: bool = False,
) -> PopulationSetup:
    """Six neurons of two morphologies, 16 ms of Bernoulli(0.3) contact spikes, teacher targets."""
    torch.manual_seed(seed)
    config = SupportP4Config(
        input_dim=8,
        route_feature_dim=4,
        token_dim=8,
        state_dim=4,
        morphology_ids=("pyramidal", "basket"),
    )
    route_features = torch.randn(len(config.morphology_ids), config.input_dim, config.route_feature_dim) / 8**0.5
    population = (TracedPopulation if subclass else AxoSimPopulation)(
        AxoSimLite(config, route_features),
        morphology_indices=torch.arange(size) % len(config.morphology_ids),
        contact_branch_indices=torch.randint(0, config.input_dim, (size, inputs)),
    )
    population.enable_adaptation_training(behavior=True, morphology=True, synaptic=True)
    if train_neuron:
        population.enable_full_training()
    teacher = copy.deepcopy(population)
    with torch.no_grad():
        for bank in teacher.adaptation_parameters():
            bank.add_(0.1 * torch.randn(bank.shape))
    population.to(device=device, dtype=dtype)
    teacher.to(device=device, dtype=dtype)
    batches = []
    with torch.no_grad():
        for _ in range(3 + 2):  # 3 to adapt on, then 2 held out
            shape = (streams, size, steps, inputs) if streams > 1 else (size, steps, inputs)
            spikes = (torch.rand(shape) < 0.3).to(device=device, dtype=dtype)
            targets = teacher.forward_batch(spikes) if streams > 1 else teacher(spikes)
            batches.append((spikes, targets))
    return PopulationSetup(module=population, batches=batches[:3], eval_batches=batches[3:])
