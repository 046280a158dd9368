"""The fused gradient transform and optimizer step (issue 23, part 1) against torch's own, on the CPU
through Triton's interpreter (conftest sets ``TRITON_INTERPRET=1`` without CUDA; with CUDA the same
checks run the compiled kernel): every optimizer and transform the fused executor accepts, over
several steps; what it cannot fuse exactly is refused while planning."""

from __future__ import annotations

import copy
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import PLUGINS, REPO, run_cli
from mlflow.tracking import MlflowClient

from axoexp.components import gradient_transforms, optimizers
from axoexp.errors import ConfigError, IncompatibleComponentsError
from axoexp.executors.capture import state_preserved
from axoexp.executors.step_rule import fused_step_problem, step_rule
from axoexp.experiment import run_experiment
from axoexp.plan import plan_experiment

pytest.importorskip("triton", reason="the fused step is a Triton kernel")
from axoexp.executors import fused_step
from axoexp.kernels.lite_recurrence import INTERPRETED

ON_GPU = torch.cuda.is_available()
if not ON_GPU and not INTERPRETED:
    pytest.skip("triton was imported before TRITON_INTERPRET=1 could be set in this process", allow_module_level=True)
DEVICE = torch.device("cuda" if ON_GPU else "cpu")

OPTIMIZERS = {  # the 4 x 3 matrix of tests/test_cuda.py, as factory arguments
    "adam": (optimizers.adam, {}),
    "adamw": (optimizers.adamw, {}),
    "sgd": (optimizers.sgd, {}),
    "sgd_momentum": (optimizers.sgd, {"momentum": 0.9, "nesterov": True}),
}
TRANSFORMS = {  # thresholds small enough that the transforms really act
    "none": (gradient_transforms.none, {}),
    "clip_norm": (gradient_transforms.clip_norm, {"max_norm": 0.5}),
    "clip_value": (gradient_transforms.clip_value, {"clip_value": 0.3}),
}
MORE = {  # settings the matrix leaves at their defaults
    "adam-decay-beta1-inf_norm": (
        "adam",
        {"weight_decay": 0.1, "beta1": 0.3},
        "clip_norm",
        {"max_norm": 0.5, "norm_type": math.inf},
    ),
    "sgd-decay-momentum-1_norm": (
        "sgd",
        {"weight_decay": 0.1, "momentum": 0.5},
        "clip_norm",
        {"max_norm": 0.5, "norm_type": 1.0},
    ),
    "adamw-unclipped": ("adamw", {"weight_decay": 0.5, "lr": 0.1}, "clip_norm", {"max_norm": 100.0}),
}
SHAPES = [(5, 7), (2, 7), (5, 3)]  # banks like lite's behavior, morphology and synaptic banks, tiny
STEPS = 4


def _banks() -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator).to(DEVICE)) for shape in SHAPES]


def _build(optimizer: str, optimizer_args: dict, transform: str, transform_args: dict, banks: list):
    factory, defaults = OPTIMIZERS[optimizer]
    built = factory(parameters=banks, capturable=False, **{**defaults, **optimizer_args})
    return built, TRANSFORMS[transform][0](parameters=banks, **transform_args)


def _gradients(step: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + step)
    return [torch.randn(shape, generator=generator).to(DEVICE) for shape in SHAPES]


def _eager_step(optimizer: torch.optim.Optimizer, transform, banks: list, step: int) -> list[torch.Tensor]:
    """Torch's transform and step; returns the transformed gradients (read before the step: on CUDA
    torch's foreach SGD with Nesterov momentum adds the momentum into the gradients in place)."""
    for bank, grad in zip(banks, _gradients(step), strict=True):
        bank.grad.copy_(grad)
    if transform is not None:
        transform()
    transformed = [bank.grad.clone() for bank in banks]
    optimizer.step()
    return transformed


def _assert_same(reference: list, fused: list, reference_optimizer, fused_optimizer, transformed: list) -> None:
    for a, b, grad in zip(reference, fused, transformed, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=0)
        torch.testing.assert_close(b.grad, grad, atol=1e-5, rtol=0)  # the fused step leaves them transformed
        assert fused_optimizer.state[b].keys() == reference_optimizer.state[a].keys()
        for key, value in reference_optimizer.state[a].items():  # torch keeps Adam's step on the CPU
            torch.testing.assert_close(
                fused_optimizer.state[b][key].float().cpu(), value.float().cpu(), atol=1e-5, rtol=0
            )


CASES = {f"{o}-{t}": (o, {}, t, TRANSFORMS[t][1]) for o in OPTIMIZERS for t in TRANSFORMS} | MORE


@pytest.mark.parametrize(("optimizer", "optimizer_args", "transform", "transform_args"), CASES.values(), ids=CASES)
def test_the_fused_step_equals_torchs_over_several_steps(optimizer, optimizer_args, transform, transform_args) -> None:
    reference, fused = _banks(), _banks()
    for bank in reference:
        bank.grad = torch.zeros_like(bank)
    reference_optimizer, reference_transform = _build(optimizer, optimizer_args, transform, transform_args, reference)
    fused_optimizer, fused_transform = _build(optimizer, optimizer_args, transform, transform_args, fused)
    step = fused_step.FusedStep(fused_optimizer, fused_transform)
    assert step.launches == (2 if transform == "clip_norm" else 1)
    initial = [bank.detach().clone() for bank in reference]
    for index in range(STEPS):
        transformed = _eager_step(reference_optimizer, reference_transform, reference, index)
        for bank, grad in zip(fused, _gradients(index), strict=True):
            bank.grad.copy_(grad)
        step()
        _assert_same(reference, fused, reference_optimizer, fused_optimizer, transformed)
    assert all(not torch.equal(bank, start) for bank, start in zip(fused, initial, strict=True)), "the banks moved"
    if transform != "none" and transform_args.get("max_norm") != 100.0:
        assert not torch.equal(fused[0].grad, _gradients(STEPS - 1)[0]), "the transform acted"


def test_the_banks_gradients_and_state_become_views_that_torchs_own_step_and_capture_keep_using() -> None:
    """The flat buffers are the parameters', gradients' and optimizer state's memory: torch's
    step continues a fused run exactly, and the capture's snapshot and restore put it back."""
    reference, fused = _banks(), _banks()
    for bank in reference:
        bank.grad = torch.zeros_like(bank)
    reference_optimizer, reference_transform = _build("adam", {}, "clip_norm", {"max_norm": 0.5}, reference)
    fused_optimizer, fused_transform = _build("adam", {}, "clip_norm", {"max_norm": 0.5}, fused)
    step = fused_step.FusedStep(fused_optimizer, fused_transform)
    identities = [id(bank) for bank in fused]
    for index in range(STEPS):
        transformed = _eager_step(reference_optimizer, reference_transform, reference, index)
        if index < 2:
            for bank, grad in zip(fused, _gradients(index), strict=True):
                bank.grad.copy_(grad)
            step()
        else:  # torch's own transform and Adam on the fused step's state
            _eager_step(fused_optimizer, fused_transform, fused, index)
    _assert_same(reference, fused, reference_optimizer, fused_optimizer, transformed)
    assert [id(bank) for bank in fused] == identities
    assert [float(fused_optimizer.state[bank]["step"]) for bank in fused] == [STEPS] * len(fused)
    flat = {"params": step.params, "grads": step.grads, "exp_avg": step.state["exp_avg"]}
    for bank in fused:
        for name, tensor in (
            ("params", bank),
            ("grads", bank.grad),
            ("exp_avg", fused_optimizer.state[bank]["exp_avg"]),
        ):
            assert tensor.untyped_storage().data_ptr() == flat[name].untyped_storage().data_ptr(), name
    before = copy.deepcopy([bank.detach() for bank in fused]), fused_optimizer.state[fused[0]]["exp_avg"].clone()
    module = torch.nn.ParameterList(fused)
    with state_preserved(module, fused_optimizer):
        step()
        assert not torch.equal(fused[0].detach(), before[0][0])
    assert all(torch.equal(bank.detach(), saved) for bank, saved in zip(fused, before[0], strict=True))
    assert torch.equal(fused_optimizer.state[fused[0]]["exp_avg"], before[1])
    assert float(step.steps[0]) == STEPS and int(step.tickets) == 0


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda banks: (optimizers.sgd(parameters=banks, capturable=False), lambda: None), "not <function"),
        (
            lambda banks: (
                optimizers.adam(parameters=banks, capturable=False),
                gradient_transforms.clip_norm(parameters=banks, norm_type=3.0),
            ),
            "cannot fuse gradient_transform.norm_type=3.0",
        ),
        (lambda banks: (torch.optim.Adagrad(banks), None), "not Adagrad"),
        (lambda banks: (torch.optim.SGD(banks, lr=0.1, momentum=0.9, dampening=0.5), None), "dampening=0.5"),
        (lambda banks: (torch.optim.Adam(banks, amsgrad=True), None), "amsgrad=True"),
    ],
)
def test_what_the_fused_step_cannot_compute_exactly_it_refuses(build, message: str) -> None:
    optimizer, transform = build(_banks())
    with pytest.raises(IncompatibleComponentsError, match=message):
        step_rule(optimizer, transform)


def test_planning_refuses_a_fused_step_it_cannot_compute_in_one_line_naming_key_value_and_choices(
    make_config, plugin_registry
) -> None:
    unfusable = ("gradient_transform=clip_norm", "gradient_transform.norm_type=3")
    problem = (
        "executor.fused_step=true cannot fuse gradient_transform.norm_type=3.0: it reduces the 1-, 2- and inf-norm "
        "exactly; set gradient_transform.norm_type to 1, 2 or inf, or executor.fused_step=false"
    )
    with pytest.raises(ConfigError) as refused:
        plan_experiment(make_config("executor=fused_eager", "executor.fused_step=true", *unfusable), plugin_registry)
    assert str(refused.value) == f"invalid experiment config: {problem}"
    with pytest.raises(ConfigError) as refused:  # on this CPU it also needs CUDA
        plan_experiment(make_config("executor=fused_cudagraph", "executor.fused_step=true", *unfusable))
    assert f"\n  - {problem}" in str(refused.value)
    plan_experiment(make_config("executor=fused_eager", *unfusable), plugin_registry)  # unfused: torch's clip, any p
    fusable = ("optimizer=sgd", "gradient_transform=clip_norm", "gradient_transform.norm_type=inf")
    plan_experiment(make_config("executor=fused_eager", "executor.fused_step=true", *fusable), plugin_registry)


def test_auto_fuses_what_the_kernel_computes_exactly_and_leaves_the_rest_to_torch(make_config, plugin_registry) -> None:
    from axoexp.executors.fused import fused_step_for

    banks = _banks()
    fusable = gradient_transforms.clip_norm(parameters=banks, max_norm=1.0, norm_type=2.0)
    fused, tag = fused_step_for("auto", torch.optim.Adam(banks, lr=1e-3), fusable)
    assert isinstance(fused, fused_step.FusedStep) and tag == "kernel"
    banks = _banks()
    before = [bank.detach().clone() for bank in banks]
    optimizer = torch.optim.Adam(banks, lr=1e-3)
    unfusable = gradient_transforms.clip_norm(parameters=banks, max_norm=1.0, norm_type=3.0)
    fused, tag = fused_step_for("auto", optimizer, unfusable)
    assert fused is None and tag.startswith("torch: ") and "norm_type=3.0" in tag
    assert all(bank.grad is None for bank in banks) and all(map(torch.equal, banks, before)), "banks left as they were"
    with pytest.raises(IncompatibleComponentsError, match="norm_type=3.0"):
        fused_step_for(True, optimizer, unfusable)
    assert fused_step_for(False, optimizer, unfusable) == (None, "torch")
    # auto is the default: planning refuses nothing for it; a setting that is not one is one line
    unfusable_config = ("gradient_transform=clip_norm", "gradient_transform.norm_type=3")
    plan_experiment(make_config("executor=fused_eager", *unfusable_config), plugin_registry)
    with pytest.raises(ConfigError) as refused:
        plan_experiment(make_config("executor=fused_eager", "executor.fused_step=sometimes"), plugin_registry)
    assert str(refused.value) == (
        "invalid experiment config: executor.fused_step=sometimes is not a setting; choose true, false or auto"
    )


def test_an_optimizer_or_transform_of_a_plugin_is_not_fused() -> None:
    config = {"optimizer": {"name": "lion"}, "gradient_transform": {"name": "none"}}
    assert fused_step_problem(config) == (
        "executor.fused_step=true fuses optimizer=adam, adamw, sgd, not optimizer=lion; "
        "choose one of those or executor.fused_step=false"
    )
    config = {"optimizer": {"name": "adam"}, "gradient_transform": {"name": "sign"}}
    assert "not gradient_transform=sign" in (fused_step_problem(config) or "")


@pytest.mark.slow
def test_the_cli_refuses_an_unfusable_step_in_one_line_before_any_run(tmp_path: Path) -> None:
    env = {"AXOEXP_PLUGINS_DIR": str(PLUGINS), "TRITON_INTERPRET": "1"}
    refused = run_cli(
        "executor=fused_eager",
        "executor.fused_step=true",
        "gradient_transform=clip_norm",
        "gradient_transform.norm_type=3",
        cwd=tmp_path,
        env=env,
    )
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().count("\n") == 0, refused.stderr
    assert "executor.fused_step=true cannot fuse gradient_transform.norm_type=3.0:" in refused.stderr
    assert "set gradient_transform.norm_type to 1, 2 or inf, or executor.fused_step=false" in refused.stderr
    store = tmp_path / "mlflow.db"
    client = MlflowClient(f"sqlite:///{store}")
    assert not store.exists() or not client.search_runs([e.experiment_id for e in client.search_experiments()])


@pytest.mark.slow  # about 5 s each: the recurrence, too, runs in Triton's interpreter
@pytest.mark.parametrize(
    "step",
    [
        ("optimizer=sgd", "optimizer.momentum=0.9", "gradient_transform=clip_norm", "gradient_transform.max_norm=0.01"),
        ("optimizer=adam", "gradient_transform=clip_value", "gradient_transform.clip_value=0.001"),
    ],
    ids=["sgd_momentum-clip_norm", "adam-clip_value"],
)
def test_a_run_with_the_fused_step_verifies_against_eager(make_config, plugin_registry, step) -> None:
    """The whole update (fused forward, backward and step) against eager torch, on a tiny population."""
    config = make_config(
        "executor=fused_eager",
        "executor.fused_step=true",
        *step,
        *(["device=cuda"] if ON_GPU else []),
        "population.neurons=4",
        "population.time_steps=8",
        "verify.enabled=true",
        "verify.updates=3",
        "verify.param_atol=1e-5",
        "verify.loss_atol=1e-5",
        "run.warmup_updates=1",
        "run.measured_updates=2",
    )
    plan = plan_experiment(config, plugin_registry)
    executor = plan.build_executor(plan.build_population().module)
    assert isinstance(executor.fused_step, fused_step.FusedStep), "the run's updates go through the fused step"
    assert executor.loss_and_gradients is not None, "and the kernels add the banks' gradients, with no autograd"
    result = run_experiment(config, registry=plugin_registry)
    assert result.verification is not None and result.verification.passed, result.verification
    assert result.verification.max_abs_param_change > 1e-5, "the compared updates must move the banks"


# The locals of the binder Triton 3.6 generates per kernel (``dynamic_func`` in ``triton/runtime/jit.py``):
# a kernel parameter of one of these names is overwritten before it is read ("failed to specialize argument
# of type: dict" on the H200, 2026-12-04), though the interpreter and Triton 3.9 run it.
TRITON_BINDER_LOCALS = {"params", "specialization", "options", "backend", "specialize_impl"}


def test_no_kernel_parameter_is_named_as_a_local_of_tritons_launch_binder() -> None:
    from triton.runtime import KernelInterface

    from axoexp.kernels import fused_step as step_kernels
    from axoexp.kernels import lite_recurrence

    kernels = {
        name: kernel
        for module in (step_kernels, lite_recurrence)
        for name, kernel in vars(module).items()
        if isinstance(kernel, KernelInterface)
    }
    assert {"step_kernel", "norm_partials_kernel", "_lite_forward_kernel", "_lite_backward_kernel"} <= set(kernels)
    clashes = {name: sorted(TRITON_BINDER_LOCALS & set(kernel.arg_names)) for name, kernel in kernels.items()}
    assert not any(clashes.values()), clashes


COMPILE_FOR_H200 = """
import itertools, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from axoexp.kernels.fused_step import BLOCK, PARTIALS_BLOCK, norm_partials_kernel, step_kernel
pointers = dict.fromkeys(("parameters", "grads", "first", "second", "steps", "partials"), "*fp32")
scalars = ("lr weight_decay decay_factor lerp_weight beta2 one_minus_beta2 log2_beta1 log2_beta2 eps momentum "
           "max_norm clip_value").split()
signature = {**pointers, "tickets": "*i32", "numel": "i32", "partial_count": "i32", **dict.fromkeys(scalars, "fp32")}
cases = [(0, 1, 2, False, False), (1, 2, 1, False, True), (2, 1, 0, True, False), (2, 0, 1, False, False)]
for optimizer, transform, norm, nesterov, lerp_from_end in cases:
    constants = dict(OPTIMIZER=optimizer, TRANSFORM=transform, NORM=norm, WEIGHT_DECAY=True, MOMENTUM=True,
                     NESTEROV=nesterov, LERP_FROM_END=lerp_from_end, BANKS=3, BANKS_PAD=4, BLOCK=BLOCK,
                     PARTIALS_BLOCK=PARTIALS_BLOCK)
    source = ASTSource(step_kernel, {**signature, **dict.fromkeys(constants, "constexpr")}, constants)
    triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
for norm in (0, 1, 2):
    constants = dict(NORM=norm, BLOCK=BLOCK)
    signature = {"grads": "*fp32", "partials": "*fp32", "numel": "i32", **dict.fromkeys(constants, "constexpr")}
    triton.compile(ASTSource(norm_partials_kernel, signature, constants), target=GPUTarget("cuda", 90, 32))
from axoexp.kernels.lite_recurrence import _lite_backward_kernel, _lite_forward_kernel
weights = ("input_weight", "recurrent_weight", "state_bias", "decay_logit", "output_weight", "output_bias",
           "skip_weight")
shape = dict(TOKEN=8, STATE=4, OUTPUT=8, TOKEN_PAD=8, STATE_PAD=4, OUTPUT_PAD=8, BLOCK_N=16)
front = {**dict.fromkeys(("morphology", "log_efficacy", "projection", "projection_bias"), "*fp32"),
         "morphology_indices": "*i64", "bank_rows": "i32", "input_steps": "i32"}
fronts = [dict(FRONT=False, CONTACTS=1, CONTACTS_PAD=1, PATCH_STEPS=1, PATCH_STEPS_PAD=1),
          dict(FRONT=True, CONTACTS=3, CONTACTS_PAD=4, PATCH_STEPS=4, PATCH_STEPS_PAD=4)]
forward = {**dict.fromkeys(("tokens", "cache", *weights, "outputs", "states", "targets", "partials"), "*fp32"),
           "length": "*i64", "neurons": "i32", "blocks": "i32", "time_steps": "i32", "warmup_steps": "i32",
           "delta": "fp32", **front}
# no loss; squared; masked; masked Huber; each with the front in torch and in the kernel
for (loss, masked), front_constants in itertools.product(((0, False), (1, False), (1, True), (2, True)), fronts):
    constants = dict(shape, STORE_STATES=True, LOSS=loss, MASKED=masked, OUTPUT_DIM=2, **front_constants)
    source = ASTSource(_lite_forward_kernel, {**forward, **dict.fromkeys(constants, "constexpr")}, constants)
    triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 1})
backward = {**dict.fromkeys(("tokens", "cache", *weights, "states", "grad_outputs", "grad_tokens", "grad_cache",
                             "grad_scale", "behavior_grad", "efficacy_grad", "morphology_grad", "partials", "loss"),
                            "*fp32"), "neurons": "i32", "blocks": "i32", "partial_count": "i32", **front}
for scaled, front_constants in itertools.product((False, True), fronts):
    constants = dict(shape, STORE_INPUT_GRAD=scaled, SCALED=scaled, BANK_GRADS=False, **front_constants)
    source = ASTSource(_lite_backward_kernel, {**backward, **dict.fromkeys(constants, "constexpr")}, constants)
    triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 1})
# the banks' gradients added in the kernel, with no autograd (the front in the kernel)
constants = dict(shape, STORE_INPUT_GRAD=False, SCALED=False, BANK_GRADS=True, **fronts[1])
source = ASTSource(_lite_backward_kernel, {**backward, **dict.fromkeys(constants, "constexpr")}, constants)
triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 1})
from axoexp.kernels.pad import BLOCK as PAD_BLOCK, _pad_kernel
signature = {**dict.fromkeys(("inputs", "static_inputs", "targets", "static_targets"), "*fp32"), "length": "*i64",
             **dict.fromkeys(("input_width", "static_input_width", "input_numel", "input_programs", "target_width",
                              "static_target_width", "target_numel", "steps"), "i32"),
             "BLOCK": "constexpr"}
triton.compile(ASTSource(_pad_kernel, signature, {"BLOCK": PAD_BLOCK}), target=GPUTarget("cuda", 90, 32))
print("compiled")
"""


@pytest.mark.slow  # a process of its own: Triton's interpreter, set in this one, compiles nothing
def test_the_kernels_compile_for_an_h200_without_one(tmp_path: Path) -> None:
    """Triton's compiler and the ptxas it ships build the fused step's, the recurrence's (with and
    without the loss, with the front in torch and in the kernels, with the banks' gradients added in
    the backward kernel) and the bucket padding's kernels
    for sm_90 on any machine: what the interpreter tolerates but a GPU build would reject (types,
    shapes, masks) fails here."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", COMPILE_FOR_H200], capture_output=True, text=True, env=env, timeout=600, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "compiled", done.stderr[-3000:]


def test_the_fused_step_zeroes_every_banks_gradient_in_one_fill_of_their_flat_buffer() -> None:
    banks = _banks()
    optimizer = torch.optim.SGD(banks, lr=0.1)
    fused = fused_step.FusedStep(optimizer, None)
    for bank, gradient in zip(banks, _gradients(0), strict=True):
        bank.grad.copy_(gradient)
    fused.zero_grad()
    assert all(torch.equal(bank.grad, torch.zeros_like(bank)) for bank in banks)
    assert all(bank.grad.untyped_storage().data_ptr() == fused.grads.untyped_storage().data_ptr() for bank in banks)
    assert not fused.grads.any(), "the flat buffer is what was zeroed"
