"""AxoSim-Lite's recurrence as one hand-fused Triton kernel, and the whole update captured."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import torch
from axosim import AxoSimPopulation

from axoexp import names
from axoexp.components.losses import MeanOverSteps
from axoexp.errors import IncompatibleComponentsError
from axoexp.executors.base import UPDATE_STAGES, LossAndGradients, Objective, StepFusion, batch_loss
from axoexp.executors.cudagraph import Buckets, CudaGraphExecutor, WarmupSteps
from axoexp.executors.step_rule import FUSED_STEP_KEY, fused_step_problem
from axoexp.interfaces import GradientTransform, LossFn
from axoexp.kernels.lite_population import (
    adaptation_banks,
    front_in_kernel,
    fused_population_forward,
    fused_population_loss,
    fused_population_loss_and_gradients,
    fused_refusal,
    unsupported_reason,
)
from axoexp.kernels.loss import KernelLoss
from axoexp.lengths import DEFAULT_BUCKETS
from axoexp.registry import NON_NEGATIVE, component

FusedStepOption = Annotated[
    bool | str,
    "gradient transform and optimizer step as one Triton launch (two with clip_norm) over flat banks: true, false, "
    "or auto (the default: where the kernel computes them exactly, else torch's; tag fused.step says which ran)",
]
FUSED_STEP_SETTINGS = (True, False, "auto")
BlockNOption = Annotated[
    int,
    "rows (neurons x streams) each recurrence kernel program runs, a power of 2; 0 chooses (docs/fused.md)",
    NON_NEGATIVE,
]
LossInKernelOption = Annotated[
    bool,
    "the loss and its gradient inside the recurrence kernels for mse, causal_mse and huber (other losses run in "
    "torch either way; tag fused.loss says which ran)",
]

LOSS_IN_TORCH = "autograd: the loss runs in torch"
"""Tag :data:`axoexp.names.FUSED_GRADIENTS` where the loss is not computed in the kernels (either reason)."""

GradientsInKernelOption = Annotated[
    bool,
    "the backward kernel adds the banks' gradients into the fused step's buffer and sums the loss itself, with no "
    "autograd, where the loss, the front and the step all run in kernels (tag fused.gradients says whether it did)",
]

FrontInKernelOption = Annotated[
    bool,
    "the front in the recurrence kernels too: tokens from the raw contact inputs and efficacies, the cache from the "
    "banks, and their gradients (false: torch computes them; tag fused.front says which ran)",
]


def fused_step_config_problems(params: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """A ``fused_step`` setting that is not one, or with ``true``: what of the config's optimizer and
    transform it cannot fuse exactly (``auto`` falls back to torch's instead)."""
    setting = params.get(FUSED_STEP_KEY, "auto")
    if setting not in FUSED_STEP_SETTINGS or isinstance(setting, (int, float)) and not isinstance(setting, bool):
        return [f"executor.{FUSED_STEP_KEY}={setting} is not a setting; choose true, false or auto"]
    problem = fused_step_problem(config) if setting is True else None
    return [problem] if problem else []


def fused_step_for(
    setting: bool | str, optimizer: torch.optim.Optimizer, transform: GradientTransform
) -> tuple[StepFusion | None, str]:
    """The fused step a ``fused_step`` setting gives, and the :data:`axoexp.names.FUSED_STEP` tag saying
    which step runs: ``kernel``, ``torch``, or with ``auto`` where the kernel cannot, ``torch: why``.
    With ``true`` what it cannot compute raises :class:`IncompatibleComponentsError`."""
    if setting is False:
        return None, "torch"
    from axoexp.executors.fused_step import FusedStep  # imports Triton

    try:
        return FusedStep(optimizer, transform), "kernel"
    except IncompatibleComponentsError as error:
        if setting is True:
            raise
        return None, f"torch: {error}"


def gradients_for(
    setting: bool,
    fused: FusedLiteForward,
    loss_fn: LossFn,
    optimizer: torch.optim.Optimizer,
    fused_step: StepFusion | None,
    *,
    loss_in_kernel: bool = True,
) -> tuple[LossAndGradients | None, str]:
    """The update's forward, loss and backward without autograd that a ``gradients_in_kernel`` setting
    gives (:meth:`FusedLiteForward.loss_and_gradients`), and the :data:`axoexp.names.FUSED_GRADIENTS` tag:
    ``kernel``, ``autograd``, or ``autograd: why`` where the kernels cannot (then None). Under
    ``torch.use_deterministic_algorithms`` autograd runs it: the kernels' adds into shared bank rows
    are atomic, so their order may vary from run to run."""
    if not setting:
        return None, "autograd"
    if not loss_in_kernel:
        return None, LOSS_IN_TORCH
    if fused_step is None:  # the fused step is what gives every bank a .grad to add into
        return None, "autograd: the step runs in torch"
    if torch.are_deterministic_algorithms_enabled():
        return None, "autograd: deterministic algorithms were asked for, and the kernels add atomically"
    return fused.loss_and_gradients(loss_fn, optimizer)


def block_n_problems(params: Mapping[str, Any]) -> list[str]:
    """A ``block_n`` the kernels cannot take (Triton's block shapes are powers of 2)."""
    block_n = params.get("block_n", 0)
    if block_n and block_n & (block_n - 1):
        return [f"executor.block_n={block_n} is not a power of 2; give 1, 2, 4, 8, 16, ... or 0 to let it choose"]
    return []


def kernel_loss(loss_fn: LossFn) -> KernelLoss | None:
    """``loss_fn`` as the kernels compute it, where it is a mean of a pointwise error they compute
    (the built-in mse, causal_mse and huber); None for any other loss."""
    if not isinstance(loss_fn, MeanOverSteps) or loss_fn.pointwise is None:
        return None
    return KernelLoss(error=loss_fn.pointwise.kind, warmup_steps=loss_fn.warmup_steps, delta=loss_fn.pointwise.delta)


class FusedLiteForward(torch.nn.Module):
    """``population(inputs)`` with the P4 recurrence in the fused kernels (same parameters)."""

    def __init__(self, population: AxoSimPopulation, block_n: int | None = None, front: bool = True) -> None:
        super().__init__()
        self.population = population
        self.block_n = block_n
        """Rows per kernel program; None: the kernels' (:func:`axoexp.kernels.lite_recurrence.default_block_n`)."""
        self.front = front
        """Whether the kernels compute the tokens and the cache
        (:func:`axoexp.kernels.lite_population.front_in_kernel`)."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return fused_population_forward(self.population, inputs, block_n=self.block_n, front=self.front)

    def forward_batch(self, inputs: torch.Tensor) -> torch.Tensor:
        """B streams: the kernel's rows are B x neurons."""
        return fused_population_forward(self.population, inputs, block_n=self.block_n, front=self.front)

    def loss_and_gradients(
        self, loss_fn: LossFn, optimizer: torch.optim.Optimizer
    ) -> tuple[LossAndGradients | None, str]:
        """The update's forward, loss and backward with no autograd
        (:func:`axoexp.kernels.lite_recurrence.lite_front_loss_and_gradients`), and the
        :data:`axoexp.names.FUSED_GRADIENTS` tag: ``kernel``, or ``autograd: why`` (then None) where the
        loss is not one the kernels compute, the front is not in the kernels, or ``optimizer`` does not
        adapt exactly the three banks. The banks' ``.grad`` must exist (the fused step makes them)."""
        in_kernel = kernel_loss(loss_fn)
        if in_kernel is None:
            return None, LOSS_IN_TORCH
        if not self.front:
            return None, "autograd: the front runs in torch"
        population = self.population
        banks = adaptation_banks(population)
        adapted = {id(parameter) for group in optimizer.param_groups for parameter in group["params"]}
        if adapted != {id(bank) for bank in banks} or not all(bank.requires_grad for bank in banks):
            return None, "autograd: the optimizer does not adapt exactly the three banks"

        def loss_and_gradients(
            inputs: torch.Tensor, targets: torch.Tensor, length: torch.Tensor | None
        ) -> torch.Tensor:
            if not front_in_kernel(population, inputs, True):  # all warm-up: autograd, as the objective does
                loss = batch_loss(self, loss_fn, inputs, targets, length)
                loss.backward()
                return loss.detach()
            return fused_population_loss_and_gradients(
                population, inputs, targets, in_kernel, length=length, block_n=self.block_n
            )

        return loss_and_gradients, "kernel"

    def objective(self, loss_fn: LossFn) -> Objective | None:
        """The update's forward and loss with the loss's error and gradient in the recurrence kernels
        (:func:`fused_population_loss`), where ``loss_fn`` is a mean of a pointwise error the kernels
        compute (the built-in mse, causal_mse and huber); None for any other loss."""
        in_kernel = kernel_loss(loss_fn)
        if in_kernel is None:
            return None
        patch = self.population.neuron.patch_size

        def objective(inputs: torch.Tensor, targets: torch.Tensor, length: torch.Tensor | None) -> torch.Tensor:
            if inputs.shape[-2] < patch:  # all warm-up: no recurrence to put the loss in
                return batch_loss(self, loss_fn, inputs, targets, length)
            return fused_population_loss(
                self.population, inputs, targets, in_kernel, length=length, block_n=self.block_n, front=self.front
            )

        return objective


@component("executor", "fused_cudagraph")
class FusedCudaGraphExecutor(CudaGraphExecutor):
    """The forward's P4 recurrence runs as one Triton launch (backward: one more, in reverse
    order) for ``block_n`` neurons a program; with ``loss_in_kernel`` the forward launch also
    computes the loss and its gradient when the loss is a built-in mean error; with ``fused_step``
    (``auto``: wherever it computes them exactly) the gradient transform and optimizer step are one
    Triton launch (two with clip_norm) over flat views of the banks; with ``front_in_kernel`` the
    recurrence kernels also compute the tokens and the cache from the contact inputs and the banks
    (else torch does); with ``gradients_in_kernel``, where all three run in kernels, the backward
    kernel adds the banks' gradients into the fused step's buffer itself (no autograd); the whole
    update is captured in one CUDA graph (docs/fused.md). float32,
    AxoSim-Lite populations, adaptation banks only."""

    update_includes = ("input_copy", "graph_replay", *UPDATE_STAGES, "loss_clone", "synchronize")

    def __init__(
        self,
        *,
        warmup_steps: WarmupSteps = 3,
        buckets: Buckets = DEFAULT_BUCKETS,
        fused_step: FusedStepOption = "auto",
        loss_in_kernel: LossInKernelOption = True,
        front_in_kernel: FrontInKernelOption = True,
        gradients_in_kernel: GradientsInKernelOption = True,
        block_n: BlockNOption = 0,
        **components: object,
    ) -> None:
        super().__init__(warmup_steps=warmup_steps, buckets=buckets, **components)
        self.fused = FusedLiteForward(self.module, block_n or None, front_in_kernel)
        self.objective = self.fused.objective(self.loss_fn) if loss_in_kernel else None
        self.prepared_tags[names.FUSED_LOSS] = "torch" if self.objective is None else "kernel"
        self.prepared_tags[names.FUSED_FRONT] = "kernel" if front_in_kernel else "torch"
        self.fused_step, self.prepared_tags[names.FUSED_STEP] = fused_step_for(
            fused_step, self.optimizer, self.gradient_transform
        )
        self.loss_and_gradients, self.prepared_tags[names.FUSED_GRADIENTS] = gradients_for(
            gradients_in_kernel,
            self.fused,
            self.loss_fn,
            self.optimizer,
            self.fused_step,
            loss_in_kernel=loss_in_kernel,
        )

    @classmethod
    def config_problems(cls, params: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
        return [
            *super().config_problems(params, config),
            *fused_step_config_problems(params, config),
            *block_n_problems(params),
        ]

    @classmethod
    def refusal(cls, *, module: torch.nn.Module, dtype: torch.dtype) -> str | None:
        return fused_refusal(module, dtype)

    def captured_forward(self) -> torch.nn.Module:
        return self.fused

    def prepare(self, example_inputs: torch.Tensor, example_targets: torch.Tensor) -> dict[str, float]:
        reason = unsupported_reason(self.module, example_inputs.dtype)
        if reason is not None:  # what planning cannot see: where the population lives
            raise IncompatibleComponentsError(f"executor=fused_cudagraph cannot run this population: {reason}")
        return super().prepare(example_inputs, example_targets)
