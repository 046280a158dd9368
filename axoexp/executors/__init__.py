"""Built-in executors; importing this package registers them."""

from axoexp.executors import compiled, cudagraph, eager
from axoexp.executors.base import Executor

__all__ = ["Executor", "compiled", "cudagraph", "eager"]
