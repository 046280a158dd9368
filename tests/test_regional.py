"""Regional compilation on the CPU: the regions compute axosim's forward and gradients."""

from __future__ import annotations

import copy
import os

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


@pytest.fixture(autouse=True)
def inductor_cache_of_the_session(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under pytest-xdist, one inductor cache for both workers, in pytest's folder of the session
    (inductor's default is in each worker's own $TMPDIR), shared as a sweep's jobs share
    regional_cudagraph's ``cache_dir``: the C++ ISA checks inductor runs once a cache (about 7 s
    here) and each graph that two tests compile alike are then compiled once a session, whichever
    worker runs the tests (this module shares no fixture, so --dist loadgroup spreads its tests over
    both). The precompiled header stays in each worker's folder: inductor fixes that folder when
    imported."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.getbasetemp().parent / "torchinductor"))


def decompositions() -> int:
    """Matmuls inductor's decompose_mm_pass has rewritten in this process so far."""
    return sum(counters["inductor"][f"decompose_{op}"] for op in ("mm", "addmm", "bmm"))


@pytest.mark.parametrize(
    "time_steps, tokens_per_region, compile_edges, decompose_matmuls, graphs",
    [(38, 3, True, True, 2), (38, 3, False, True, 1), (16, 3, False, False, 2), (16, 4, True, True, 1)],
)
def test_regions_compute_the_eager_forward_and_gradients(
    time_steps: int, tokens_per_region: int, compile_edges: bool, decompose_matmuls: bool, graphs: int
) -> None:
    """38 steps: 9 blocks in regions of 3, 2 steps past the last block; 16 steps: regions of 3
    and 1 block, then all 4 blocks in one region (the whole forward compiled as one graph).
    Decomposed matmuls sum in another order than the eager ones: equal to rounding. With
    the edges uncompiled, only the regions can have decomposed the matmuls counted.
    Graphs: one a region's length (the 3 regions of 3 share one) and one for compiled edges;
    blocks that fit one region, the whole forward as one (no region, no prologue, no graph break).
    A second population of the same shape then compiles nothing new: what lets verify.enabled=true
    (a fresh copy of the population) skip a second compile."""
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
    reference, pristine = copy.deepcopy(setup.module), copy.deepcopy(setup.module)
    decomposed = decompositions()
    before = counters["stats"]["unique_graphs"]
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
    assert counters["stats"]["unique_graphs"] - before == graphs
    RegionalLiteForward(pristine, tokens_per_region, compile_edges, decompose_matmuls)(inputs).sum().backward()
    assert counters["stats"]["unique_graphs"] - before == graphs, "the second population compiled again"


def test_a_torch_without_the_pass_thresholds_is_refused_not_silently_left_undecomposed(monkeypatch) -> None:
    from torch._inductor.fx_passes import decompose_mem_bound_mm

    from axoexp.executors import matmul_decomposition

    monkeypatch.delattr(decompose_mem_bound_mm, "max_other_dimension_decomposition")
    with pytest.raises(RuntimeError, match="lacks the decompose_mm_pass thresholds.*max_other_dimension_decomposition"):
        matmul_decomposition.widen_thresholds()
