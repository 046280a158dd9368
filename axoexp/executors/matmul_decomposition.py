"""Inductor's ``decompose_mm_pass``, widened to AxoSim-Lite's tiny matmuls.

AxoSim-Lite's step is four matrix-vector products per neuron and P4 block (weights of at
most 8x8 at the default model dimensions). Left as matmuls, each one is a cuBLAS call of a few microseconds between the
pointwise kernels around it, and the backward adds as many again: about 20 launches per
block. The pass rewrites an ``mm``/``addmm``/``bmm`` whose small dimensions are below a
threshold as a broadcast multiply and a sum; inductor unrolls sums of at most 8 terms into
pointwise code, so a block's products fuse with its pointwise work (4.6 times fewer GPU
operations per update at 64x256x32 on an H200, and a 3-4x faster captured update). The sums run in another order than cuBLAS's:
results differ from eager in float32 rounding only.

Upstream decomposes only matmuls with at least 10,240 rows on CUDA (and one row on the CPU),
and the pass copies its thresholds from inductor's config into module globals when it is
first imported, so ``inductor_options`` sets those globals itself. They matter only to
compiles that enable the pass (through the options returned here), never to others.
"""

from __future__ import annotations

from typing import Any

THRESHOLDS = {
    "min_first_dimension_decomposition": 1,  # CUDA: any number of rows
    "max_other_dimension_decomposition": 65,  # CUDA: both weight dimensions (bmm: two of three) <= 64
    "cpu_max_first_dimension_decomposition": 1 << 40,  # the CPU alike (tests compile there)
    "cpu_max_other_dimension_decomposition": 65,
}


def inductor_options() -> dict[str, Any]:
    """Options for ``torch.compile(..., options=...)`` that decompose the small matmuls.

    Raises RuntimeError when this torch's inductor has no such pass (or names its thresholds
    otherwise), rather than silently compiling the matmuls as they are.
    """
    from torch._inductor.fx_passes import decompose_mem_bound_mm as module

    missing = [name for name in THRESHOLDS if not hasattr(module, name)]
    if missing:
        raise RuntimeError(f"this torch's inductor lacks decompose_mm_pass thresholds {missing}; "
                           "set executor.decompose_matmuls=false")
    for name, value in THRESHOLDS.items():
        setattr(module, name, value)
    return {"post_grad_fusion_options": {"decompose_mm_pass": dict(THRESHOLDS)}}
