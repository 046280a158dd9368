"""A batch padded into a length bucket's static buffers in one launch (axoexp.kernels.pad), against
torch's padding; in Triton's CPU interpreter without a GPU (conftest sets it), compiled on one."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the padding kernel needs Triton")

from axoexp.executors.base import pad_steps
from axoexp.kernels.pad import BLOCK, pad_into

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize(
    ("shape", "steps", "bucket"),
    [((2, 3, 5, 4), 5, 8), ((3, 7, 2), 7, 7), ((40, 33, 9), 30, 33)],  # streams; a full bucket; several programs
)
def test_one_launch_pads_inputs_and_targets_and_writes_the_length(
    shape: tuple[int, ...], steps: int, bucket: int
) -> None:
    generator = torch.Generator().manual_seed(len(shape) + steps)
    inputs = torch.randn(*shape[:-2], steps, shape[-1], generator=generator).to(DEVICE)
    targets = torch.randn(*shape[:-2], steps, 2, generator=generator).to(DEVICE)
    static_inputs = torch.full((*shape[:-2], bucket, shape[-1]), 7.0, device=DEVICE)  # a longer batch's leftovers
    static_targets = torch.full((*shape[:-2], bucket, 2), 7.0, device=DEVICE)
    length = torch.tensor(bucket, device=DEVICE)
    pad_into(inputs, targets, static_inputs, static_targets, length)
    assert torch.equal(static_inputs, pad_steps(inputs, bucket))
    assert torch.equal(static_targets, pad_steps(targets, bucket))
    assert length.item() == steps
    if shape == (40, 33, 9):
        assert static_inputs.numel() > 2 * BLOCK, "the inputs span several programs"


def test_a_batch_that_does_not_fit_its_buffers_is_refused() -> None:
    static = torch.zeros(3, 8, 4, device=DEVICE)
    length = torch.tensor(0, device=DEVICE)
    with pytest.raises(ValueError, match="do not pad into"):
        pad_into(torch.zeros(3, 5, 3, device=DEVICE), torch.zeros(3, 5, 4, device=DEVICE), static, static, length)
    with pytest.raises(ValueError, match="do not pad into"):
        pad_into(torch.zeros(3, 9, 4, device=DEVICE), torch.zeros(3, 9, 4, device=DEVICE), static, static, length)
