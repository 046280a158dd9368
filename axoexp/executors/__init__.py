"""Built-in executors; importing this package registers them."""

from axoexp.executors import compiled, cudagraph, eager, reduce_overhead
from axoexp.executors.base import Executor

__all__ = ["Executor", "compiled", "cudagraph", "eager", "reduce_overhead"]
