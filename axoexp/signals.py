"""SIGTERM and SIGHUP (what SLURM and a closed terminal send) end a run like Ctrl-C does.

Inside :func:`interruptible` the first SIGTERM, SIGHUP or SIGINT raises :class:`Interrupted`
(a ``KeyboardInterrupt``) in the main thread, so every ``finally`` runs: what was measured
is logged and the MLflow run ends KILLED naming the signal. Later signals are noted and
ignored, so the clean-up itself is not interrupted. HTTP timeouts to the tracking store are
shortened at the first signal, so the clean-up fits in SLURM's grace period (30 s by default).
A process forked from the run (inductor's compile workers are) gets the default handlers
back: it is not the run, and a signal to it (SLURM signals every process of a job) must not
act for the run, e.g. signal a sweep's workers. Inside :func:`deferred` the first signal acts
only when the block ends, so what the block records together is recorded whole. Every
``python -m`` command starts by :func:`run_command`, so Ctrl-C while it imports is one line too.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, NoReturn

from axoexp import names
from axoexp.redact import hide_passwords_in_logs

HANDLED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
CTRL_C = "interrupted (SIGINT)"
"""How every command's line on Ctrl-C begins."""
_OUTSIDE = "interrupted ({}) outside a run: no run was left unfinished"
"""What a stop signal before a run's handlers are in place (imports, composition, planning) prints."""
OUTSIDE_A_RUN_EXIT = 128 + signal.SIGINT
SHUTDOWN_HTTP_TIMEOUT_S = 3
"""Seconds per request to the tracking store once a signal came, with no retries."""

_received: list[str] = []
_outside_a_run: list[str] = []
"""Stop signals :func:`watch_outside_a_run` saw: before a run's own handlers, or after them."""
_deferring = 0
"""How many :func:`deferred` blocks the main thread is in."""
_deferred: list[Callable[[], None]] = []
"""The stop a signal asked for inside them, run as the outermost block ends."""


MEASURED_IS_LOGGED = "what was measured is logged (see the journal in the output directory)"


def interrupted_by(signal_name: str) -> str:
    """``interrupted by SIGTERM``: the reason a stopped run or sweep ends with."""
    return f"interrupted by {signal_name}"


class Interrupted(KeyboardInterrupt):
    """A signal asked this process to stop; what was measured is kept and the run ends KILLED."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(interrupted_by(signal_name))
        self.signal_name = signal_name
        self.run_outcome = MEASURED_IS_LOGGED
        """What became of the run, as the CLI's line says after the signal's name."""

    @property
    def exit_code(self) -> int:
        return 128 + int(signal.Signals[self.signal_name])


def received() -> str | None:
    """The first signal this process was asked to stop by, if any (e.g. ``SIGTERM``)."""
    return _received[0] if _received else None


def watch_outside_a_run(*signums: int) -> None:
    """Make Ctrl-C (and ``signums``, e.g. a scheduler's SIGTERM, which killed the process without a
    line) raise ``KeyboardInterrupt``, as Python's own handler does for Ctrl-C, and remember which
    came (:func:`interrupted_outside_a_run`): a library that catches it halfway through an import
    leaves its modules broken, and the error a later import raises (``partially initialized
    module``, a registration made twice) is then the interrupt's doing, not the user's config's."""

    def handle(signum: int, frame: FrameType | None) -> None:
        _outside_a_run.append(signal.Signals(signum).name)
        raise KeyboardInterrupt

    for signum in (signal.SIGINT, *signums):
        signal.signal(signum, handle)


def interrupted_outside_a_run() -> bool:
    """Whether a signal came while :func:`watch_outside_a_run` watched, even where something caught it."""
    return bool(_outside_a_run)


def outside_a_run() -> tuple[str, int]:
    """The line and exit status of a command stopped outside a run: by the first signal watched, or
    by Ctrl-C (a ``KeyboardInterrupt`` that came otherwise)."""
    name = _outside_a_run[0] if _outside_a_run else "SIGINT"
    return _OUTSIDE.format(name), 128 + int(signal.Signals[name])


def _shorten_http_timeouts() -> None:
    os.environ[names.HTTP_TIMEOUT_ENV] = str(SHUTDOWN_HTTP_TIMEOUT_S)
    os.environ[names.HTTP_MAX_RETRIES_ENV] = "0"


def install(before_raising: Callable[[str], None] | None = None) -> dict[int, Any]:
    """Make the first stop signal raise :class:`Interrupted` in the main thread; return the
    handlers replaced. ``before_raising(signal_name)`` runs first, inside the handler (a sweep
    parent waits there for its workers to end their runs before the launcher kills them)."""

    def handle(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        _received.append(name)
        if len(_received) > 1:
            return  # already stopping
        _shorten_http_timeouts()

        def stop() -> None:
            if before_raising is not None:
                before_raising(name)
            raise Interrupted(name)

        if _deferring:
            _deferred.append(stop)
            return
        stop()

    return {signum: signal.signal(signum, handle) for signum in HANDLED}


_DEFAULTS: dict[int, Callable[[int, FrameType | None], Any] | int] = {
    signal.SIGTERM: signal.SIG_DFL,
    signal.SIGHUP: signal.SIG_DFL,
    signal.SIGINT: signal.default_int_handler,
}


def _default_handlers_in_child() -> None:
    for signum in HANDLED:
        handler = signal.getsignal(signum)
        if getattr(handler, "__module__", None) == __name__:  # one of ours: the run's, not this child's
            signal.signal(signum, _DEFAULTS[signum])


os.register_at_fork(after_in_child=_default_handlers_in_child)


@contextmanager
def interruptible() -> Iterator[None]:
    """:func:`install` for the duration of the block; a no-op outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = install()
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def deferred() -> Iterator[None]:
    """A stop signal that arrives inside the block raises :class:`Interrupted` as the block ends,
    not inside it: e.g. an update is added to the run's trace and to its journal both or neither,
    so MLflow and the journal never disagree about the last update. Python runs signal handlers
    in the main thread only, so this needs nothing more than a counter."""
    global _deferring
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
        if not _deferring and _deferred:
            _deferred.pop()()


def run_command(command: str, module: str | None = None, runs: bool = False) -> NoReturn:
    """``python -m COMMAND``, called atop the module ``-m`` runs, before it imports anything heavy:
    import ``module`` (``command`` itself unless named) and exit with what its ``main()`` returns.
    Ctrl-C while it imports (MLflow alone takes seconds) is one line, ``COMMAND: interrupted (SIGINT)``,
    and exit 130, as ``main()`` says Ctrl-C once it runs; a command that ``runs`` experiments says
    :func:`outside_a_run`, and SIGTERM (a scheduler's) is one line too. Those signals are watched for
    (:func:`watch_outside_a_run`) from here on, and every log line hides passwords
    (:func:`~axoexp.redact.hide_passwords_in_logs`). A command's module imported as a library (by the
    tests) has no handler."""
    watch_outside_a_run(*((signal.SIGTERM,) if runs else ()))
    hide_passwords_in_logs()
    try:
        main = importlib.import_module(module or command).main
    except KeyboardInterrupt:
        line, status = outside_a_run() if runs else (CTRL_C, OUTSIDE_A_RUN_EXIT)
        print(f"{command}: {line}", file=sys.stderr)
        sys.exit(status)
    sys.exit(main())
