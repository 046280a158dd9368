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


@triton.jit
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
    also writes ``steps`` to ``length``."""
    program = tl.program_id(0)
    if program < input_programs:
        _pad_block(inputs, static_inputs, input_width, static_input_width, input_numel, program, BLOCK)
    else:
        block = program - input_programs
        _pad_block(targets, static_targets, target_width, static_target_width, target_numel, block, BLOCK)
    if program == 0:
        tl.store(length, steps)


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
    steps = inputs.shape[-2]
    pairs = ((inputs, static_inputs), (targets, static_targets))
    for given, static in pairs:
        if given.shape[:-2] + given.shape[-1:] != static.shape[:-2] + static.shape[-1:] or given.dtype != static.dtype:
            raise ValueError(f"a batch of shape {tuple(given.shape)} does not pad into {tuple(static.shape)}")
    if targets.shape[-2] != steps or steps > static_inputs.shape[-2]:
        raise ValueError(f"inputs of {steps} steps and targets of {targets.shape[-2]} do not pad into a bucket")
    inputs, targets = inputs.contiguous(), targets.contiguous()
    input_programs = triton.cdiv(static_inputs.numel(), BLOCK)
    grid = (input_programs + triton.cdiv(static_targets.numel(), BLOCK),)
    _pad_kernel[grid](
        inputs,
        static_inputs,
        steps * inputs.shape[-1],
        static_inputs.shape[-2] * inputs.shape[-1],
        static_inputs.numel(),
        input_programs,
        targets,
        static_targets,
        steps * targets.shape[-1],
        static_targets.shape[-2] * targets.shape[-1],
        static_targets.numel(),
        length,
        steps,
        BLOCK=BLOCK,
        num_warps=NUM_WARPS,
    )
