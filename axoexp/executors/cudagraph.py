"""The whole update captured once in a CUDA graph and replayed (:mod:`axoexp.executors.capture`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import torch

from axoexp import names
from axoexp.components.losses import masked_form
from axoexp.executors.base import UPDATE_STAGES, LossAndGradients, Objective, StepFusion
from axoexp.executors.capture import CapturedUpdate, capture_update
from axoexp.interfaces import Batch, Executor, LossFn
from axoexp.lengths import BUCKETS_SYNTAX, DEFAULT_BUCKETS, bucket_of, buckets_for
from axoexp.registry import AT_LEAST_ONE, component
from axoexp.timing import stopwatch, synchronizer

WarmupSteps = Annotated[int, "eager updates on a side stream before capture (state is restored)", AT_LEAST_ONE]
Buckets = Annotated[
    str | list[int], f"length buckets, one graph each, for batches of different lengths: {BUCKETS_SYNTAX}"
]
CAPTURE_STAGES = ("graph_capture", "module_and_optimizer_state_restore", "synchronize")


def buckets_problem(params: Mapping[str, Any]) -> str | None:
    """Why the ``executor.buckets`` rule cannot be read, for every run: a run of one fixed length
    pads no batch, but such a value is still a mistake."""
    try:
        buckets_for(params.get("buckets", DEFAULT_BUCKETS), [1])  # every bucket holds 1 step: the form alone
    except ValueError as error:
        return str(error)
    return None


def pool_bytes(pool: tuple[int, int]) -> int:
    """Bytes the caching allocator holds in graph memory pool ``pool``: its segments in a memory
    snapshot (as inductor's CUDA graph trees find them). A difference of ``memory_reserved`` around
    the captures is not: the allocator may free other cached blocks meanwhile (the H200 read -12 MB)."""
    segments = torch.cuda.memory_snapshot()
    return sum(segment["total_size"] for segment in segments if tuple(segment["segment_pool_id"]) == tuple(pool))


@component("executor", "cudagraph")
class CudaGraphExecutor(Executor):
    """Captures zero_grad, forward, loss, backward, gradient transform and optimizer step.

    Each replay copies the inputs and targets into the graph's static buffers (device to
    device), replays the graph and clones the loss. ``warmup_steps`` eager updates run on
    a side stream before capture; module and optimizer state are restored afterwards, so
    capture consumes no update. The graph is the one ``axosim.CudaGraphAdaptationStep``
    captures (the benchmark compares the two).

    Batches of different lengths (``population.lengths``): one graph per length bucket that a
    batch falls in, all captured during ``prepare`` from one shared memory pool; each batch is
    padded at the end up to its bucket and the loss masked to its real length (docs/lengths.md).
    """

    requires_cuda = True
    requires_capturable_optimizer = True
    update_includes = ("input_copy", "graph_replay", *UPDATE_STAGES, "loss_clone", "synchronize")

    def __init__(
        self, *, warmup_steps: WarmupSteps = 3, buckets: Buckets = DEFAULT_BUCKETS, **components: object
    ) -> None:
        super().__init__(**components)  # type: ignore[arg-type]
        self.warmup_steps = warmup_steps
        self.bucket_rule = buckets
        self.graph_step: CapturedUpdate | None = None
        self.bucket_examples: dict[int, Batch] = {}
        """Bucket -> an example batch of a length in it; empty when every batch has one length."""
        self.bucket_steps: dict[int, CapturedUpdate] = {}
        self.graphs_captured = 0
        self.fused_step: StepFusion | None = None
        """The gradient transform and optimizer step as one call, where a subclass fuses them."""
        self.objective: Objective | None = None
        """The forward and loss of an update, where a subclass computes them its own way."""
        self.loss_and_gradients: LossAndGradients | None = None
        """The forward, loss and backward of an update without autograd, where a subclass has them."""

    @classmethod
    def config_problems(cls, params: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
        return list(filter(None, [buckets_problem(params)]))

    @classmethod
    def length_refusal(cls, *, params: Mapping[str, Any], lengths: list[int], loss_fn: LossFn | None) -> str | None:
        if len(set(lengths)) == 1:
            return None
        try:
            buckets_for(params.get("buckets", DEFAULT_BUCKETS), lengths)
        except ValueError as error:
            return str(error)
        if loss_fn is not None and masked_form(loss_fn) is None:
            return "its bucket graphs pad batches and mask the loss, and this loss has no masked form"
        return None

    def buckets(self) -> tuple[int, ...] | None:
        return tuple(sorted(self.bucket_examples)) or None

    def captures(self) -> int:
        return self.graphs_captured

    def prepare_all(self, batches: list[Batch]) -> dict[str, float]:
        """One graph per length bucket in use (largest first) when the batches' lengths differ."""
        lengths = [inputs.shape[-2] for inputs, _ in batches]
        if len(set(lengths)) > 1:
            buckets = buckets_for(self.bucket_rule, lengths)
            by_length = sorted(batches, key=lambda batch: -batch[0].shape[-2])
            for batch in by_length:
                self.bucket_examples.setdefault(bucket_of(batch[0].shape[-2], buckets), batch)
        return self.prepare(*batches[0])

    def prepare_includes(self) -> dict[str, tuple[str, ...]]:
        warmup = f"{self.warmup_steps}x_warmup_update({'+'.join(UPDATE_STAGES)})_on_side_stream"
        stages = ("static_buffer_copy", warmup, *CAPTURE_STAGES)
        # capture_bucket: what each capture_bucket_<N> phase includes (MLflow keys allow no wildcard)
        return {"capture": stages, "capture_bucket": ("pad_to_bucket", *stages)}

    def captured_forward(self) -> torch.nn.Module:
        """The forward the graph captures: the population itself here."""
        return self.module

    def prepare(self, example_inputs: torch.Tensor, example_targets: torch.Tensor) -> dict[str, float]:
        phases: dict[str, float] = {}
        if self.bucket_examples:
            return self.capture_buckets(example_inputs.device)
        with stopwatch(synchronizer(example_inputs.device), phases, "capture"):
            self.graph_step = self.capture(self.captured_forward(), example_inputs, example_targets)
        return phases

    def capture_buckets(self, device: torch.device) -> dict[str, float]:
        """Capture every bucket's graph from one memory pool; time each apart; measure the pool."""
        phases: dict[str, float] = {}
        pool = torch.cuda.graph_pool_handle()
        for bucket in sorted(self.bucket_examples, reverse=True):  # the largest first: later ones reuse its blocks
            with stopwatch(synchronizer(device), phases, names.bucket_phase(bucket)):
                self.bucket_steps[bucket] = self.capture(
                    self.captured_forward(), *self.bucket_examples[bucket], bucket=bucket, pool=pool
                )
        self.prepared_metrics[names.GRAPH_POOL_BYTES] = float(pool_bytes(pool))
        return phases

    def capture(
        self,
        module: torch.nn.Module,
        example_inputs: torch.Tensor,
        example_targets: torch.Tensor,
        *,
        bucket: int | None = None,
        pool: Any = None,
    ) -> CapturedUpdate:
        """Capture the whole update with ``module`` as the forward (e.g. a compiled one); with
        ``bucket``, for padded batches of up to that many steps (:func:`capture_update`). Every capture
        is counted (:meth:`captures`), whenever it happens."""
        captured = capture_update(
            module,
            self.optimizer,
            self.loss_fn,
            self.gradient_transform,
            example_inputs,
            example_targets,
            warmup_steps=self.warmup_steps,
            bucket=bucket,
            pool=pool,
            fused_step=self.fused_step,
            objective=self.objective,
            loss_and_gradients=self.loss_and_gradients,
        )
        self.graphs_captured += 1
        return captured

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.bucket_steps:
            return self.bucket_steps[bucket_of(inputs.shape[-2], tuple(self.bucket_steps))](inputs, targets)
        if self.graph_step is None:
            raise RuntimeError("CudaGraphExecutor.step called before prepare (nothing captured)")
        return self.graph_step(inputs, targets)
