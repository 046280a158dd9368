"""A batch copied into a length bucket's static buffers in one launch, CUDA-graph friendly.

A bucket's captured update reads fixed-size buffers: each replay copies a batch of ``steps``
steps into the first steps of the static inputs and targets, zeroes the rest and writes
``steps`` to the device scalar the masked loss reads. As torch operations that is five
launches (two copies, two fills, one fill of the scalar) ahead of every replay; with the update
itself around 0.2 ms on an H200, their launch gaps were most of the difference between a
bucketed update and one at a fixed length (benchmarks/README.md). :func:`pad_into` does all of
it in one launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024
"""Destination elements per program."""
NUM_WARPS = 4


@triton.jit
def _pad_block(source, destination, source_width, destination_width, numel, block, BLOCK: tl.constexpr):
    """Block ``block`` of ``destination`` viewed as (rows, destination_width): the same row of
    ``source`` (rows, source_width) where the column exists there, zero after it."""
    offsets = block.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    row = offsets // destination_width
    column = offsets % destination_width
    inside = offsets < numel
    value = tl.load(source + row * source_width + column, mask=inside & (column < source_width), other=0.0)
    tl.store(destination + offsets, value, mask=inside)


@triton.jit(do_not_specialize=["input_width", "target_width", "steps"])
def _pad_kernel(
    inputs,
    static_inputs,
    input_width,
    static_input_width,
    input_numel,
    input_programs,
    targets,
    static_targets,
    target_width,
    static_target_width,
    target_numel,
    length,
    steps,
    BLOCK: tl.constexpr,
):
    """The first ``input_programs`` programs pad the inputs, the others the targets; program 0
    also writes ``steps`` to ``length``. The widths that follow a batch's length are not
    specialised: Triton would compile a variant for each new divisibility of them by 16 (or 8) inside
    a measured update, most likely why a bucketed variant measured first in its process read a mean
    of 0.46 ms against a median of 0.14 ms on the H200 (2026-12-04)."""
    program = tl.program_id(0)
    if program < input_programs:
        _pad_block(inputs, static_inputs, input_width, static_input_width, input_numel, program, BLOCK)
    else:
        block = program - input_programs
        _pad_block(targets, static_targets, target_width, static_target_width, target_numel, block, BLOCK)
    if program == 0:
        tl.store(length, steps)


class BucketPad:
    """:func:`pad_into` for one bucket's static buffers, with what no batch changes worked out once:
    each replay of a bucket's graph waits for this launch to be issued, and on an H200's host
    pad_into's checks and argument arithmetic took about 9 of its 25 us (2026-12-04)."""

    def __init__(self, static_inputs: torch.Tensor, static_targets: torch.Tensor, length: torch.Tensor) -> None:
        self.static_inputs, self.static_targets, self.length = static_inputs, static_targets, length
        self.input_lead, self.input_channels = static_inputs.shape[:-2], static_inputs.shape[-1]
        self.target_lead, self.target_channels = static_targets.shape[:-2], static_targets.shape[-1]
        self.bucket = static_inputs.shape[-2]
        self.input_programs = triton.cdiv(static_inputs.numel(), BLOCK)
        self.grid = (self.input_programs + triton.cdiv(static_targets.numel(), BLOCK),)
        self.static_input_width = self.bucket * self.input_channels
        self.static_target_width = static_targets.shape[-2] * self.target_channels

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        """Copy ``inputs`` and ``targets`` into the first steps of the static buffers, zero the
        steps after them and write the number of steps to ``length``: one launch, no host read."""
        steps = inputs.shape[-2]
        if (
            inputs.shape != (*self.input_lead, steps, self.input_channels)
            or targets.shape != (*self.target_lead, steps, self.target_channels)
            or inputs.dtype != self.static_inputs.dtype
            or targets.dtype != self.static_targets.dtype
            or steps > self.bucket
            or steps > self.static_targets.shape[-2]
        ):
            raise ValueError(
                f"inputs {tuple(inputs.shape)} {inputs.dtype} and targets {tuple(targets.shape)} {targets.dtype} "
                f"do not pad into {tuple(self.static_inputs.shape)} and {tuple(self.static_targets.shape)}"
            )
        if not inputs.is_contiguous():
            inputs = inputs.contiguous()
        if not targets.is_contiguous():
            targets = targets.contiguous()
        _pad_kernel[self.grid](
            inputs,
            self.static_inputs,
            steps * self.input_channels,
            self.static_input_width,
            self.static_inputs.numel(),
            self.input_programs,
            targets,
            self.static_targets,
            steps * self.target_channels,
            self.static_target_width,
            self.static_targets.numel(),
            self.length,
            steps,
            BLOCK=BLOCK,
            num_warps=NUM_WARPS,
        )


def pad_into(
    inputs: torch.Tensor,
    targets: torch.Tensor,
    static_inputs: torch.Tensor,
    static_targets: torch.Tensor,
    length: torch.Tensor,
) -> None:
    """Copy ``inputs`` and ``targets`` (time on the second last axis) into the first steps of the
    static buffers (the same shapes but a longer time axis), zero the steps after them, and write
    the number of steps to the 0-dim ``length``: one launch, nothing read back to the host."""
    BucketPad(static_inputs, static_targets, length)(inputs, targets)
