"""Inductor's ``decompose_mm_pass``, widened to AxoSim-Lite's tiny matmuls.

AxoSim-Lite's step is four matrix-vector products per neuron and P4 block (weights of at
most 8x8 at the default model dimensions). Left as matmuls, each one is a cuBLAS call of a
few microseconds between the pointwise kernels around it, and the backward adds as many
again. The pass rewrites an ``mm``/``addmm`` whose second operand has both dimensions below
``max_other`` (a ``bmm`` with two of its three sizes below it) as a broadcast multiply and a
sum; inductor unrolls sums of up to 8 terms into pointwise code, so a block's products fuse
with its pointwise work. At 64x256x32 on an H200 that is 4.6 times fewer GPU operations per
update and a 5.8 times faster captured update at the same region size. The sums run in
another order than cuBLAS's: results differ from eager in float32 rounding only.

Upstream decomposes only matmuls with at least 10,240 rows on CUDA (and one row on the CPU).
The pass reads its thresholds from module globals that it copies from inductor's config
when inductor is imported, so ``widen_thresholds`` sets those globals. They are process-wide
and stay set, but the pass runs only in compiles that enable it (``OPTIONS``); another
compile that enables it with thresholds of its own would get these.
"""

from __future__ import annotations

from typing import Any

THRESHOLDS = {
    "min_first_dimension_decomposition": 1,  # CUDA: any number of rows
    "max_other_dimension_decomposition": 65,  # CUDA: see the module docstring
    "cpu_max_first_dimension_decomposition": 1 << 40,  # the CPU alike (tests compile there)
    "cpu_max_other_dimension_decomposition": 65,
}
OPTIONS: dict[str, Any] = {"post_grad_fusion_options": {"decompose_mm_pass": dict(THRESHOLDS)}}
"""``torch.compile(..., options=OPTIONS)`` enables the pass (and puts it in the cache key)."""


def widen_thresholds() -> None:
    """Set the pass's thresholds to ``THRESHOLDS`` (idempotent; imports inductor).

    Raises RuntimeError when this torch's inductor has no such pass or names its thresholds
    otherwise, rather than silently compiling the matmuls as they are.
    """
    try:
        from torch._inductor.fx_passes import decompose_mem_bound_mm as module
    except ImportError as error:
        raise RuntimeError(f"this torch's inductor has no decompose_mm_pass ({error})") from error
    missing = [name for name in THRESHOLDS if not hasattr(module, name)]
    if missing:
        raise RuntimeError(f"this torch's inductor lacks the decompose_mm_pass thresholds {missing}")
    for name, value in THRESHOLDS.items():
        setattr(module, name, value)
