"""Regional compilation on the CPU: the regions compute axosim's forward and gradients."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.utils import counters

from axoexp.components.population import lite
from axoexp.executors.regional import RegionalLiteForward

pytestmark = pytest.mark.slow  # inductor compiles on the CPU


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def decompositions() -> int:
    """Matmuls inductor's decompose_mm_pass has rewritten in this process so far."""
    return sum(counters["inductor"][f"decompose_{op}"] for op in ("mm", "addmm", "bmm"))


@pytest.mark.parametrize(
    "time_steps, tokens_per_region, compile_edges, decompose_matmuls",
    [(38, 3, True, True), (38, 3, False, True), (16, 3, False, False), (16, 4, True, True)],
)
def test_regions_compute_the_eager_forward_and_gradients(
    time_steps: int, tokens_per_region: int, compile_edges: bool, decompose_matmuls: bool
) -> None:
    """38 steps: 9 blocks in regions of 3, 2 steps past the last block; 16 steps: regions of 3
    and 1 block, then all 4 blocks in one region (the whole forward compiled as one graph).
    Decomposed matmuls sum in another order than the eager ones: equal to rounding. With
    the edges uncompiled, only the regions can have decomposed the matmuls counted."""
    setup = lite(
        device=torch.device("cpu"),
        dtype=torch.float32,
        seed=3,
        neurons=5,
        time_steps=time_steps,
        contacts=4,
        train_morphology=False,
    )
    inputs, _ = setup.batches[0]
    reference = copy.deepcopy(setup.module)
    decomposed = decompositions()
    output = RegionalLiteForward(setup.module, tokens_per_region, compile_edges, decompose_matmuls)(inputs)
    expected = reference(inputs)
    torch.testing.assert_close(output, expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(setup.module.neuron.base_soma_prediction, reference.neuron.base_soma_prediction)
    (output * torch.linspace(-1, 1, output.numel()).view_as(output)).sum().backward()
    (expected * torch.linspace(-1, 1, expected.numel()).view_as(expected)).sum().backward()
    trained = [(name, parameter) for name, parameter in setup.module.named_parameters() if parameter.requires_grad]
    assert {name for name, _ in trained} == {"behavior_adapter", "synaptic_log_efficacy"}
    for (name, parameter), twin in zip(trained, [p for p in reference.parameters() if p.requires_grad], strict=True):
        torch.testing.assert_close(parameter.grad, twin.grad, atol=1e-6, rtol=1e-5, msg=name)
    assert (decompositions() > decomposed) == decompose_matmuls


def test_blocks_that_fit_one_region_compile_the_whole_forward_as_one_graph() -> None:
    setup = lite(device=torch.device("cpu"), dtype=torch.float32, seed=0, neurons=3, time_steps=12, contacts=4)
    graphs = counters["stats"]["unique_graphs"]
    RegionalLiteForward(setup.module, 3, True, True)(setup.batches[0][0]).sum().backward()
    assert counters["stats"]["unique_graphs"] - graphs == 1  # no region, no prologue, no graph break


def test_a_second_population_of_the_same_shape_compiles_nothing_new() -> None:
    """What lets verify.enabled=true (a fresh copy of the population) skip a second compile."""
    setup = lite(device=torch.device("cpu"), dtype=torch.float32, seed=0, neurons=3, time_steps=16, contacts=4)
    pristine = copy.deepcopy(setup.module)
    inputs, _ = setup.batches[0]
    RegionalLiteForward(setup.module, 2, True, True)(inputs).sum().backward()
    graphs = counters["stats"]["unique_graphs"]
    RegionalLiteForward(pristine, 2, True, True)(inputs).sum().backward()
    assert counters["stats"]["unique_graphs"] == graphs


def test_a_torch_without_the_pass_thresholds_is_refused_not_silently_left_undecomposed(monkeypatch) -> None:
    from torch._inductor.fx_passes import decompose_mem_bound_mm

    from axoexp.executors import matmul_decomposition

    monkeypatch.delattr(decompose_mem_bound_mm, "max_other_dimension_decomposition")
    with pytest.raises(RuntimeError, match="lacks the decompose_mm_pass thresholds.*max_other_dimension_decomposition"):
        matmul_decomposition.widen_thresholds()
