"""An executor with length buckets that runs on the CPU: each batch padded at the end up to its bucket
and the loss masked to its real length, as the bucketed captured executors do (docs/lengths.md), with
eager updates. Each bucket is set up once, its "capture", during ``prepare`` or, with ``lazy``, on the
bucket's first update, and counted as the captured executors count their graphs (``captures``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import torch

from axoexp import component
from axoexp.executors.base import UPDATE_STAGES, eager_update, pad_steps
from axoexp.executors.cudagraph import Buckets, CudaGraphExecutor
from axoexp.interfaces import Batch, Executor, LossFn
from axoexp.lengths import DEFAULT_BUCKETS, bucket_of, buckets_for


@component("executor", "padded_eager")
class PaddedEagerExecutor(Executor):
    """Eager updates on batches padded to their length bucket, the loss masked."""

    update_includes = ("pad_to_bucket", *UPDATE_STAGES, "synchronize")

    def __init__(
        self,
        *,
        buckets: Buckets = DEFAULT_BUCKETS,
        lazy: Annotated[bool, "set each bucket up on its first update rather than during prepare"] = False,
        **components: object,
    ) -> None:
        super().__init__(**components)  # type: ignore[arg-type]
        self.bucket_rule, self.lazy = buckets, lazy
        self.used: tuple[int, ...] = ()
        self.ready: set[int] = set()

    @classmethod
    def length_refusal(cls, *, params: Mapping[str, Any], lengths: list[int], loss_fn: LossFn | None) -> str | None:
        return CudaGraphExecutor.length_refusal(params=params, lengths=lengths, loss_fn=loss_fn)

    def prepare_all(self, batches: list[Batch]) -> dict[str, float]:
        lengths = [int(inputs.shape[-2]) for inputs, _ in batches]
        rule = buckets_for(self.bucket_rule, lengths)
        self.used = tuple(sorted({bucket_of(length, rule) for length in lengths}))
        if not self.lazy:
            self.ready.update(self.used)
        return {}

    def buckets(self) -> tuple[int, ...] | None:
        return self.used or None

    def captures(self) -> int:
        return len(self.ready)

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        steps = inputs.shape[-2]
        bucket = bucket_of(steps, self.used)
        self.ready.add(bucket)
        length = torch.tensor(steps, device=inputs.device)
        padded = pad_steps(inputs, bucket), pad_steps(targets, bucket)
        return eager_update(self.module, self.optimizer, self.loss_fn, self.gradient_transform, *padded, length)
