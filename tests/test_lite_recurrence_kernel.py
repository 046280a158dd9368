"""The fused AxoSim-Lite kernels against autograd through axosim's own forward.

Without a GPU the kernels run on the CPU in Triton's interpreter. Triton fixes that mode
when it is imported (its own library functions are decorated then), so conftest sets
``TRITON_INTERPRET=1`` for the whole process before anything imports triton; on a machine
with CUDA it is left alone (interpreting would break the compiled Triton kernels of the GPU
tests in the same session) and the same checks run the compiled kernels on the GPU.
"""

from __future__ import annotations

import copy

import pytest
import torch

ON_GPU = torch.cuda.is_available()  # without CUDA, conftest has set TRITON_INTERPRET=1
pytest.importorskip("triton", reason="the fused AxoSim-Lite kernels need Triton")

from axoexp.components.losses import MeanOverSteps, causal_mse, huber, mse  # noqa: E402
from axoexp.components.population import lite  # noqa: E402
from axoexp.executors.base import batch_loss, pad_steps  # noqa: E402
from axoexp.executors.fused import FusedLiteForward, kernel_loss  # noqa: E402
from axoexp.kernels import fused_population_forward, lite_recurrence, unsupported_reason  # noqa: E402
from axoexp.kernels.lite_population import (  # noqa: E402
    fused_population_loss,
    fused_population_loss_and_gradients,
)
from axoexp.kernels.loss import KernelLoss  # noqa: E402

if not ON_GPU and not lite_recurrence.INTERPRETED:
    pytest.skip("triton was imported before TRITON_INTERPRET=1 could be set in this process", allow_module_level=True)

DEVICE = torch.device("cuda" if ON_GPU else "cpu")
BANKS = ("behavior", "morphology", "synaptic")


def _population(
    *, neurons: int, time_steps: int, contacts: int, seed: int, trained: tuple[str, ...] = BANKS, **dims: int
):
    setup = lite(
        device=DEVICE,
        dtype=torch.float32,
        seed=seed,
        neurons=neurons,
        time_steps=time_steps,
        contacts=contacts,
        batches=1,
        **{f"train_{bank}": bank in trained for bank in BANKS},
        **dims,
    )
    return setup.module, setup.batches[0][0]


def _assert_matches(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal to float32 rounding: 1e-5 relative, elementwise or to the tensor's largest value."""
    scale = expected.abs().max().item()
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5 * scale + 1e-30)


def _forward_backward(population, inputs: torch.Tensor, run) -> tuple[torch.Tensor, list]:
    """``run``'s output and the gradients of a fixed random projection of it."""
    population.zero_grad(set_to_none=True)
    output = run(population, inputs)
    weights = torch.randn(output.shape, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    if output.requires_grad:
        (output * weights).sum().backward()
    return output.detach(), [
        None if parameter.grad is None else parameter.grad.clone() for parameter in population.adaptation_parameters()
    ]


def _check(population, inputs: torch.Tensor, **options: int) -> None:
    eager_output, eager_grads = _forward_backward(population, inputs, lambda p, x: p(x))
    eager_kept = population.neuron.base_soma_prediction.detach().clone()
    fused_output, fused_grads = _forward_backward(
        population, inputs, lambda p, x: fused_population_forward(p, x, **options)
    )
    _assert_matches(fused_output, eager_output)
    _assert_matches(population.neuron.base_soma_prediction.detach(), eager_kept)
    for parameter, fused, eager in zip(population.adaptation_parameters(), fused_grads, eager_grads, strict=True):
        assert (fused is None) == (eager is None) == (not parameter.requires_grad)
        if eager is not None:
            _assert_matches(fused, eager)


@pytest.mark.parametrize(
    ("neurons", "time_steps", "contacts", "seed", "trained", "block_n"),
    [
        (1, 8, 2, 0, BANKS, None),
        (3, 12, 4, 1, BANKS, 2),  # ragged: blocks of 2 + 1 neurons
        (5, 16, 2, 2, ("behavior",), 4),  # ragged: 4 + 1
        (7, 12, 4, 3, ("morphology", "synaptic"), 4),  # ragged: 4 + 3
        (5, 10, 3, 4, ("synaptic",), None),  # time not a multiple of 4: a partial last patch
        (4, 6, 2, 5, ("behavior", "morphology"), None),  # one block, every forecast cut off
        # more of the same: the whole suite runs them, the fast subset (-m "not slow") does not
        *(
            pytest.param(*case, marks=pytest.mark.slow)
            for case in (
                (3, 16, 2, 11, BANKS, None),
                (5, 8, 4, 12, ("behavior", "synaptic"), 2),  # ragged: 2 + 2 + 1
                (7, 16, 2, 13, BANKS, None),
                (1, 12, 4, 14, ("morphology",), None),
            )
        ),
    ],
)
def test_matches_eager_output_and_gradients(
    neurons: int,
    time_steps: int,
    contacts: int,
    seed: int,
    trained: tuple[str, ...],
    block_n: int | None,
) -> None:
    population, inputs = _population(
        neurons=neurons, time_steps=time_steps, contacts=contacts, seed=seed, trained=trained
    )
    _check(population, inputs, block_n=block_n)


def test_widths_that_are_not_powers_of_two() -> None:
    population, inputs = _population(neurons=7, time_steps=12, contacts=3, seed=6, token_dim=6, state_dim=3)
    _check(population, inputs, block_n=4)


def test_shorter_than_one_patch_gives_zeros_without_a_graph() -> None:
    population, inputs = _population(neurons=3, time_steps=3, contacts=2, seed=7)
    output = fused_population_forward(population, inputs)
    assert output.shape == (3, 3, 2) and not output.requires_grad
    assert torch.equal(output, population(inputs))


def test_inference_without_grad_matches_eager() -> None:
    population, inputs = _population(neurons=5, time_steps=12, contacts=2, seed=8)
    with torch.no_grad():
        _assert_matches(fused_population_forward(population, inputs, block_n=4), population(inputs))


def test_unsupported_reasons() -> None:
    population, inputs = _population(neurons=2, time_steps=8, contacts=2, seed=9)
    assert unsupported_reason(population, torch.float32) is None
    assert "float32" in unsupported_reason(population, torch.float64)
    assert "AxoSimPopulation" in unsupported_reason(population.neuron, torch.float32)
    as_double = copy.deepcopy(population).double()
    assert "float64" in unsupported_reason(as_double, torch.float32)
    with pytest.raises(ValueError, match="float32"):
        fused_population_forward(as_double, inputs.double())
    population.neuron.state_bias.requires_grad_(True)
    assert "state_bias" in unsupported_reason(population, torch.float32)
    with pytest.raises(ValueError, match="neuron weights"):
        fused_population_forward(population, inputs)


def test_recurrence_refuses_trainable_neuron_weights() -> None:
    population, inputs = _population(neurons=2, time_steps=8, contacts=2, seed=10)
    neuron = population.neuron
    tokens = torch.zeros(2, 2, neuron.config.token_dim, device=DEVICE)
    cache = torch.zeros(2, neuron.cache_width, device=DEVICE)
    neuron.skip_head.weight.requires_grad_(True)
    with pytest.raises(ValueError, match="no gradient to neuron weights"):
        lite_recurrence.lite_recurrence(neuron, tokens, cache)
    with torch.no_grad():
        assert lite_recurrence.lite_recurrence(neuron, tokens, cache).shape == (2, 2, 8)
    from axoexp.kernels.lite_population import population_front

    neuron.skip_head.weight.requires_grad_(False)
    neuron.input_projection.bias.requires_grad_(True)
    with pytest.raises(ValueError, match="no gradient to the contact inputs or the input projection"):
        lite_recurrence.lite_front_recurrence(
            neuron, population_front(population), inputs, tuple(population.adaptation_parameters())
        )


@pytest.mark.parametrize(
    ("streams", "neurons", "time_steps", "contacts", "seed", "trained", "block_n"),
    [
        (2, 3, 12, 4, 15, BANKS, 4),  # 6 rows: 4 + 2, a program straddles two streams
        (3, 5, 10, 3, 16, ("behavior", "synaptic"), None),  # a partial last patch
        (4, 1, 8, 2, 17, ("morphology",), 2),
    ],
)
def test_batched_streams_match_forward_batch(
    streams: int,
    neurons: int,
    time_steps: int,
    contacts: int,
    seed: int,
    trained: tuple[str, ...],
    block_n: int | None,
) -> None:
    """B streams: the kernel's rows are B x neurons, each stream with the population's banks."""
    setup = lite(
        device=DEVICE,
        dtype=torch.float32,
        seed=seed,
        neurons=neurons,
        time_steps=time_steps,
        contacts=contacts,
        batches=1,
        batch_size=streams,
        **{f"train_{bank}": bank in trained for bank in BANKS},
    )
    population, inputs = setup.module, setup.batches[0][0]
    assert inputs.shape == (streams, neurons, time_steps, contacts)
    eager_output, eager_grads = _forward_backward(population, inputs, lambda p, x: p.forward_batch(x))
    fused_output, fused_grads = _forward_backward(
        population, inputs, lambda p, x: fused_population_forward(p, x, block_n=block_n)
    )
    assert fused_output.shape == (streams, neurons, time_steps, population.neuron.config.output_dim)
    _assert_matches(fused_output, eager_output)
    for parameter, fused, eager in zip(population.adaptation_parameters(), fused_grads, eager_grads, strict=True):
        assert (fused is None) == (eager is None) == (not parameter.requires_grad)
        if eager is not None:
            _assert_matches(fused, eager)


# --- the loss in the kernels (issue 23): the mean error and its gradient without an assembled output --------


LOSSES = {
    "causal_mse": causal_mse(),
    "mse": mse(),  # the warm-up zeros count in the loss
    "huber": huber(delta=0.05),  # errors on both sides of delta
    "causal_huber_6": huber(delta=0.05, warmup_steps=6),  # a warm-up longer than a patch
}


def _loss_case(
    loss: str, streams: int | None, neurons: int, time_steps: int, length: int | None
) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, list[torch.Tensor]]:
    """A population, its inputs and noisy targets (padded after ``length`` steps, then the 0-dim
    length), and the loss (its masked form for padded batches; the mean over streams for batched
    ones) of axosim's own forward with the banks' gradients."""
    setup = lite(
        device=DEVICE,
        dtype=torch.float32,
        seed=neurons + time_steps,
        neurons=neurons,
        time_steps=time_steps,
        contacts=3,
        batches=1,
        **({"batch_size": streams} if streams else {}),
    )
    population, (inputs, targets) = setup.module, setup.batches[0]
    targets = targets + 0.3 * torch.randn(targets.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    steps = None
    if length is not None:  # a padded batch: its steps after ``length`` are zeros, as the capture pads them
        inputs, targets = (
            pad_steps(inputs[..., :length, :], time_steps),
            pad_steps(targets[..., :length, :], time_steps),
        )
        steps = torch.tensor(length, device=DEVICE)
    population.zero_grad(set_to_none=True)
    expected = batch_loss(population, LOSSES[loss], inputs, targets, steps)
    expected.backward()
    eager_grads = [parameter.grad.clone() for parameter in population.adaptation_parameters()]
    for eager in eager_grads:
        assert (eager.abs().max() > 0) == (length is None or length > 4), "the banks get a gradient after warm-up"
    return population, inputs, targets, steps, expected.detach(), eager_grads


def _check_loss_and_gradients_without_autograd(
    population, inputs, targets, loss: str, steps, block_n, expected: torch.Tensor, eager_grads: list[torch.Tensor]
) -> None:
    """:func:`fused_population_loss_and_gradients`, with no autograd: the backward kernel adds the
    gradients into the banks' .grad (here already holding eager's, so they double) and its program 0
    sums the loss's shares."""
    for parameter, eager in zip(population.adaptation_parameters(), eager_grads, strict=True):
        parameter.grad = eager.clone()
    got = fused_population_loss_and_gradients(
        population, inputs, targets, kernel_loss(LOSSES[loss]), length=steps, block_n=block_n
    )
    assert got.grad_fn is None and got.shape == ()
    _assert_matches(got, expected)
    for parameter, eager in zip(population.adaptation_parameters(), eager_grads, strict=True):
        _assert_matches(parameter.grad, 2 * eager)


@pytest.mark.parametrize(
    ("loss", "streams", "neurons", "time_steps", "length", "block_n"),
    [
        ("causal_mse", None, 3, 12, None, 2),  # ragged: 2 + 1
        ("mse", None, 5, 10, None, None),  # a partial last patch, cut off
        ("huber", None, 5, 16, None, 4),
        ("causal_huber_6", 2, 3, 13, None, 4),  # 6 rows: a program straddles two streams
        ("causal_mse", None, 3, 16, 11, None),  # padded to 16, the loss masked to 11 steps
        ("mse", 3, 3, 16, 9, 4),
        ("huber", None, 2, 16, 3, None),  # masked inside the warm-up patch: a loss, no gradient
        ("huber", None, 2, 16, 6, None),
        # 3 streams at one row a program, as test_program_0_sums_the_loss_shares_of_more_than_128_programs
        # runs 129 programs (with no autograd only): here 6, through autograd too
        pytest.param("mse", 3, 2, 8, None, 1, marks=pytest.mark.slow),
    ],
)
def test_the_loss_in_the_kernels_equals_the_loss_of_the_eager_output(
    loss: str, streams: int | None, neurons: int, time_steps: int, length: int | None, block_n: int | None
) -> None:
    """Loss and bank gradients of :func:`fused_population_loss`, and of its form with no autograd,
    against the loss of axosim's own forward."""
    population, inputs, targets, steps, expected, eager_grads = _loss_case(loss, streams, neurons, time_steps, length)
    population.zero_grad(set_to_none=True)
    got = fused_population_loss(population, inputs, targets, kernel_loss(LOSSES[loss]), length=steps, block_n=block_n)
    got.backward()
    _assert_matches(got.detach(), expected)
    for parameter, eager in zip(population.adaptation_parameters(), eager_grads, strict=True):
        _assert_matches(parameter.grad, eager)
    _check_loss_and_gradients_without_autograd(population, inputs, targets, loss, steps, block_n, expected, eager_grads)


@pytest.mark.slow  # about 8 s: Triton's interpreter runs the 129 programs one after another, twice
def test_program_0_sums_the_loss_shares_of_more_than_128_programs() -> None:
    """With no autograd the backward kernel's program 0 sums the forward's shares of the loss, one a
    program, in blocks of 128 (through autograd torch sums them: no kernel's sum to check there).
    3 streams x 43 neurons at one row a program are 129 programs: the second block holds one share.
    7 steps are one P4 block (the interpreter's time grows with programs x blocks), whose forecasts
    fill 3 of the loss's steps: the banks get a gradient, added atomically by all 129 programs."""
    population, inputs, targets, steps, expected, eager_grads = _loss_case("mse", 3, 43, 7, None)
    assert inputs.shape[:2] == (3, 43)
    _check_loss_and_gradients_without_autograd(population, inputs, targets, "mse", steps, 1, expected, eager_grads)


def _targets(population, inputs: torch.Tensor) -> torch.Tensor:
    shape = (*inputs.shape[:-1], population.neuron.config.output_dim)
    return torch.randn(shape, generator=torch.Generator().manual_seed(2)).to(DEVICE)


def test_the_loss_in_the_kernels_is_chosen_for_the_built_in_mean_errors_only() -> None:
    population, inputs = _population(neurons=2, time_steps=8, contacts=2, seed=18)
    forward = FusedLiteForward(population)
    assert all(forward.objective(loss_fn) is not None for loss_fn in LOSSES.values())
    targets = _targets(population, inputs)
    for loss_fn in LOSSES.values():  # the executor's objective is the loss it was made for
        _assert_matches(
            forward.objective(loss_fn)(inputs, targets, None), batch_loss(population, loss_fn, inputs, targets)
        )
    assert forward.objective(torch.nn.functional.mse_loss) is None, "a plugin's loss runs in torch"
    assert forward.objective(MeanOverSteps(torch.nn.functional.l1_loss, torch.abs, 0)) is None, "no pointwise error"


def test_the_kernels_add_the_gradients_only_where_the_loss_the_front_and_the_step_all_run_in_kernels() -> None:
    from axoexp.executors.fused import gradients_for
    from axoexp.executors.fused_step import FusedStep

    population, inputs = _population(neurons=2, time_steps=8, contacts=2, seed=18)
    banks = list(population.adaptation_parameters())
    optimizer = torch.optim.Adam(banks, lr=1e-3)
    step = FusedStep(optimizer, None)
    in_kernels, torch_front = FusedLiteForward(population), FusedLiteForward(population, front=False)
    gradients, tag = gradients_for(True, in_kernels, huber(delta=0.05), optimizer, step)
    assert gradients is not None and tag == "kernel"
    targets = _targets(population, inputs)
    expected = batch_loss(population, huber(delta=0.05), inputs, targets)
    expected_grads = torch.autograd.grad(expected, banks)
    for bank in banks:
        bank.grad = torch.zeros_like(bank)
    _assert_matches(gradients(inputs, targets, None), expected.detach())  # the loss it was made for
    for bank, expected_grad in zip(banks, expected_grads, strict=True):
        _assert_matches(bank.grad, expected_grad)
    assert gradients_for(False, in_kernels, mse(), optimizer, step) == (None, "autograd")
    assert gradients_for(True, in_kernels, mse(), optimizer, None) == (None, "autograd: the step runs in torch")
    assert gradients_for(True, in_kernels, mse(), optimizer, step, loss_in_kernel=False) == (
        None,
        "autograd: the loss runs in torch",
    )
    torch.use_deterministic_algorithms(True)
    try:  # the kernels' adds into shared bank rows are atomic: their order may vary
        assert gradients_for(True, in_kernels, mse(), optimizer, step) == (
            None,
            "autograd: deterministic algorithms were asked for, and the kernels add atomically",
        )
    finally:
        torch.use_deterministic_algorithms(False)
    plugin_loss = torch.nn.functional.mse_loss
    assert gradients_for(True, in_kernels, plugin_loss, optimizer, step) == (None, "autograd: the loss runs in torch")
    assert gradients_for(True, torch_front, mse(), optimizer, step) == (None, "autograd: the front runs in torch")
    two_banks = torch.optim.Adam(banks[:2], lr=1e-3)
    assert gradients_for(True, in_kernels, mse(), two_banks, step) == (
        None,
        "autograd: the optimizer does not adapt exactly the three banks",
    )


def test_rows_per_program_other_than_a_power_of_two_are_refused_while_planning(make_config) -> None:
    from axoexp.errors import ConfigError
    from axoexp.executors.fused import block_n_problems
    from axoexp.plan import plan_experiment

    assert [block_n_problems({"block_n": block_n}) for block_n in (0, 1, 4, 16)] == [[]] * 4
    problem = "executor.block_n=3 is not a power of 2; give 1, 2, 4, 8, 16, ... or 0 to let it choose"
    assert block_n_problems({"block_n": 3}) == [problem]
    with pytest.raises(ConfigError) as refused:
        plan_experiment(make_config("executor=fused_cudagraph", "executor.block_n=3"))
    assert f"\n  - {problem}" in str(refused.value)


# --- the front in the kernels (issue 23): tokens, cache and their gradients from the raw inputs and banks -----
# Every test above runs it (``front=True`` is the default); these check what is particular to it.


@pytest.mark.parametrize(
    ("streams", "length", "block_n"),
    [(None, None, 2), (2, 9, 4)],  # ragged: 2 + 1; batched, ragged (4 + 2), padded and masked
)
def test_the_torch_front_matches_the_front_in_the_kernels(
    streams: int | None, length: int | None, block_n: int
) -> None:
    """``front=False`` (``executor.front_in_kernel=false``) computes the same loss, output and gradients."""
    setup = lite(
        device=DEVICE,
        dtype=torch.float32,
        seed=20,
        neurons=3,
        time_steps=12,
        contacts=3,
        batches=1,
        **({"batch_size": streams} if streams else {}),
    )
    population, (inputs, targets) = setup.module, setup.batches[0]
    steps = None
    if length is not None:
        inputs, targets = pad_steps(inputs[..., :length, :], 12), pad_steps(targets[..., :length, :], 12)
        steps = torch.tensor(length, device=DEVICE)
    runs = {}
    for front in (True, False):
        population.zero_grad(set_to_none=True)
        loss = fused_population_loss(
            population,
            inputs,
            targets,
            KernelLoss(error="squared", warmup_steps=4),
            length=steps,
            block_n=block_n,
            front=front,
        )
        loss.backward()
        grads = [parameter.grad.clone() for parameter in population.adaptation_parameters()]
        output, output_grads = _forward_backward(
            population, inputs, lambda p, x, front=front: fused_population_forward(p, x, block_n=block_n, front=front)
        )
        runs[front] = (loss.detach(), output, *grads, *output_grads)
    for in_kernel, in_torch in zip(runs[True], runs[False], strict=True):
        _assert_matches(in_kernel, in_torch)


def test_the_front_reads_the_banks_live_and_recomputes_its_constants_after_a_write() -> None:
    """A bank's value is never cached; the constants (route features x input projection) follow an
    in-place write to a buffer, into the same tensor (a captured graph keeps its pointer). Three
    neurons of two morphologies: the morphology bank's gradient sums over neurons (its index_add)."""
    from axoexp.kernels.lite_population import population_front

    population, inputs = _population(neurons=3, time_steps=10, contacts=2, seed=21, morphologies=2)
    assert population.morphology_indices.unique().numel() < population.population_size, "neurons share a row"
    front = population_front(population)
    assert population_front(population) is front, "unchanged sources: the cached constants"
    with torch.no_grad():
        for bank in population.adaptation_parameters():
            bank.add_(0.1 * torch.randn(bank.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE))
    _check(population, inputs)
    assert population_front(population) is front, "a bank's change recomputes nothing"
    with torch.no_grad():
        population.neuron.route_features.mul_(-0.5)
    recomputed = population_front(population)
    assert recomputed is not front and recomputed.projection.data_ptr() == front.projection.data_ptr()
    _check(population, inputs)


def test_inputs_that_need_a_gradient_take_the_torch_front() -> None:
    population, inputs = _population(neurons=3, time_steps=8, contacts=2, seed=22)
    inputs = inputs.clone().requires_grad_(True)
    fused_population_forward(population, inputs).sum().backward()
    expected = inputs.grad.clone()
    inputs.grad = None
    population(inputs).sum().backward()
    _assert_matches(expected, inputs.grad)
