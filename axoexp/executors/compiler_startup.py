"""Inductor's one-off start-up in a process, begun in the background as soon as a run knows
it will compile.

The first compile of a process first imports dynamo, AOTAutograd and inductor and starts
inductor's compile workers: seconds that do not depend on what is compiled. ``begin``
starts that work in a thread while the run sets up (MLflow run, metadata, device lease,
population); ``prepare`` then waits for what is left of it and reports that wait as its own
phase, ``compiler_startup``, apart from ``compile`` (tracing and code generation, or loading
them from the cache).

Inductor compiles Triton kernels in its worker pool only once the pool has answered a first
no-op job; until then it compiles them one after another in the process itself. Its default
pool lives in a new Python process that imports torch and Triton before it forks the
workers, about 7 s on an H200 host, so a compile that begins sooner compiles its first
kernels serially (12 of 40 at 64x256x32, 5 s). Here the workers are forked from this
process instead, once it has imported inductor and Triton: they answer within a second.
Where ``TORCHINDUCTOR_WORKER_START`` is set it still decides, as it does in a daemonic
process (which may not fork a pool); the start-up then only starts that pool early.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Mapping
from typing import Any

import torch

from axoexp.timing import stopwatch, synchronizer

PHASE = "compiler_startup"
STAGES = ("wait_for_background_import_of_dynamo_and_inductor", "wait_for_compile_worker_pool_start")
WORKER_START_ENV = "TORCHINDUCTOR_WORKER_START"

_lock = threading.Lock()
_thread: threading.Thread | None = None


def worker_start_method(environ: Mapping[str, str], daemonic: bool) -> str | None:
    """How inductor's compile workers start: ``fork`` (from this process, ready within a
    second), or None to leave it to inductor (the environment's choice, or a daemon's)."""
    return None if WORKER_START_ENV in environ or daemonic else "fork"


def _start_up() -> None:
    try:
        import torch._inductor.compile_fx
        from torch._inductor import config
        from torch._inductor.async_compile import AsyncCompile

        if torch.cuda.is_available():
            import torch._inductor.codegen.triton
        method = worker_start_method(os.environ, multiprocessing.current_process().daemon)
        if method is not None:
            config.worker_start_method = method
        AsyncCompile.warm_pool()  # no-op with one compile thread
        if config.worker_start_method == "fork":
            AsyncCompile.wait_pool_ready()  # forked workers answer at once: every kernel compiles in parallel
        else:
            AsyncCompile.wakeup()  # the pool answers once its process has imported torch; no wait for it
    except Exception:
        pass


def begin(device: torch.device) -> None:
    """Start the start-up in a daemon thread, once per process; only for CUDA runs."""
    global _thread
    if device.type != "cuda":
        return
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_start_up, name="axoexp-compiler-startup", daemon=True)
            _thread.start()


def wait_into(phases: dict[str, float], device: torch.device) -> None:
    """Wait for the start-up (beginning it now if nobody did) and time the wait into ``phases``."""
    begin(device)
    with stopwatch(synchronizer(device), phases, PHASE):
        if _thread is not None:
            _thread.join()


class StartsCompilerEarly:
    """Mixin for executors that compile with inductor: the run begins the start-up once planned."""

    @classmethod
    def begin_setup(cls, device: torch.device, params: Mapping[str, Any]) -> None:
        begin(device)
