"""Hand-fused Triton kernels; ``lite_population`` imports Triton only when it runs one."""

from axoexp.kernels.lite_population import fused_population_forward, unsupported_reason

__all__ = ["fused_population_forward", "unsupported_reason"]
