"""Python's cyclic garbage collector held off while the command line starts, then on again for the work.

A full collection scans every object the process holds, and importing torch, MLflow, Hydra and
SQLAlchemy makes millions of them: the collector ran seven full collections in a default CPU run's
start-up, the last ones taking 0.2-0.4 s each (over a second in all, a fifth of the run; bare
``import torch, mlflow`` spends 0.5 s of its 3.5 s so). What start-up makes stays alive (modules,
classes, functions) or is freed by reference counting, so those scans find next to nothing.
:func:`hold` turns the collector off; :func:`release` moves what exists by then to the permanent
generation (``gc.freeze``: never scanned again, never freed) and turns the collector on, so the
run's own work (build, prepare, the timed updates) runs with it on, as in any program, and its
collections no longer scan the start-up's objects. The little cyclic garbage start-up leaves is
kept until the process ends. This is the pattern of the ``gc.freeze`` documentation. The command
line holds it; a single run releases it when its MLflow run is open, a sweep when it starts (before
its first job: its process may live for hours), and a process forked meanwhile (inductor's compile
workers, forked while the run plans) as it begins; a run started from Python is not touched.
"""

from __future__ import annotations

import gc
import os

_held = False
_fork_hook = False


def hold() -> None:
    """Turn the collector off until :func:`release` (the command line calls it as it starts)."""
    global _held, _fork_hook
    if gc.isenabled():
        gc.disable()
        _held = True
        if not _fork_hook:
            os.register_at_fork(after_in_child=release)
            _fork_hook = True


def release() -> None:
    """End :func:`hold`: freeze what exists and turn the collector on; nothing where it is not held
    (a run started from Python, a sweep's job once the sweep released it)."""
    global _held
    if _held:
        gc.freeze()
        gc.enable()
        _held = False
