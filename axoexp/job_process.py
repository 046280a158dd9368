"""A sweep's job runs in a process of its own, so that its death is its own.

Every launcher calls the job function in a process it owns: the sweep's own (basic), a worker
of axoexp's pool (``parallel``, :mod:`axoexp.worker_pool`), a submitit job (``submitit_local``,
``slurm``) or a Ray worker. In a multirun, axoexp forks the job's work into a child of that
process (:func:`run_isolated`): the child plans, measures and logs, and hands back what it
returned or raised; the launcher's process only waits. When the child dies of a signal
(SIGKILL from the out-of-memory killer included), the launcher's process lives on: it
completes the child's run from its journal (``python -m axoexp.sync``'s function), ends it
KILLED naming the signal, records the death on the sweep's parent run (tag
``axoexp.died.jobN``) and fails the job, as Hydra fails any job: the siblings go on, later jobs
still run, and the parent ends FAILED naming the dead job. (A death of the launcher's process
itself, a ``parallel`` worker's, is contained by :mod:`axoexp.worker_pool`.)

Nothing is left running. The child gets SIGTERM when the process that forked it dies (Linux's
parent-death signal, ``prctl(PR_SET_PDEATHSIG)``), so it ends its run KILLED with what it
measured; and a job process other than the sweep's own watches the sweep's main process (named
in ``$AXOEXP_SWEEP_PROCESS`` by the sweep) and, once it is gone, stops its child and exits.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import pickle
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from axoexp import processes
from axoexp.errors import AxoexpError, JobExitedError, JobKilledError

SWEEP_PROCESS_ENV = "AXOEXP_SWEEP_PROCESS"
"""``HOST PID START`` of a sweep's main process, set by the sweep for its job processes to watch."""
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
POLL_S = 0.2
"""How often the waiting process looks at its child and at the sweep's main process."""
CHILD_GRACE_S = 10.0
"""How long a stopped child may take to end its run before it is killed (SLURM's grace is 30 s)."""

log = logging.getLogger(__name__)


def sweep_process_marker() -> str:
    """``HOST PID START`` of this process: what ``$AXOEXP_SWEEP_PROCESS`` says in a sweep's jobs."""
    return f"{socket.gethostname()} {os.getpid()} {processes.start_time(os.getpid())}"


def run_isolated(work: Callable[[], Any], on_killed: Callable[[int, str], str]) -> Any:
    """Run ``work`` in a forked child; return what it returned or raise what it raised.

    If the child dies without handing anything back (a signal, ``os._exit``), ``on_killed(pid,
    how)`` ends its run and says what it did, and :class:`JobKilledError` is raised.
    """
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():  # the child could not use CUDA
        raise RuntimeError(
            "CUDA was initialised in the process that forks the sweep's jobs; nothing before a job may touch "
            "CUDA there (planning reads the GPU through NVML)"
        )
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    waiter = os.getpid()
    child = os.fork()
    if child == 0:  # pragma: no cover (runs in the child, which exits without returning)
        os.close(read_end)
        _child(work, write_end, waiter)
    os.close(write_end)
    fcntl.fcntl(read_end, fcntl.F_SETFL, fcntl.fcntl(read_end, fcntl.F_GETFL) | os.O_NONBLOCK)
    payload = bytearray()
    status: int | None = None
    try:
        status = _wait(child, read_end, payload)
    finally:
        if status is None:  # the waiting was interrupted (a signal to this process): stop the child too
            _stop(child)
        _drain(read_end, payload)
        os.close(read_end)
    outcome = _outcome(payload)
    if outcome is not None:
        kind, value = outcome
        if kind == "raised":
            raise value
        return value
    assert status is not None
    how = how_it_ended(os.waitstatus_to_exitcode(status))
    raise JobKilledError(f"the job's process {child} {how}; {on_killed(child, how)}")


def _child(work: Callable[[], Any], write_end: int, waiter: int) -> None:
    """The forked job: die with the waiting process, run ``work``, hand back the outcome, exit.
    It always leaves through ``os._exit``: the launcher's atexit hooks (e.g. the one that ends
    the sweep's parent run) belong to the launcher's process, not to the job."""
    code = 1
    try:
        die_with_parent(signal.SIGTERM)
        if os.getppid() != waiter:  # it died before the parent-death signal was set
            return
        try:
            outcome: tuple[str, Any] = ("returned", work())
        except BaseException as error:  # handed to the waiting process, which raises it there
            outcome = ("raised", _picklable(error))
        try:
            data = pickle.dumps(outcome)
        except Exception as error:  # e.g. a plugin's result that cannot be pickled
            data = pickle.dumps(("raised", RuntimeError(f"the job's outcome cannot be handed back: {error}")))
        view = memoryview(data)
        while view:
            view = view[os.write(write_end, view) :]
        code = 0 if outcome[0] == "returned" else 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            logging.shutdown()
        finally:
            os._exit(code)


def _picklable(error: BaseException) -> BaseException:
    """``error`` itself if it survives pickling, else a RuntimeError with its text; any but an
    axoexp error (one line for the user) carries the child's traceback as a note. A ``sys.exit``
    in the job is its failure, not the sweep's: raised as it is, it would end the waiting
    process, which launches the other jobs."""
    if isinstance(error, SystemExit):
        return JobExitedError(f"the job called sys.exit({error.code!r}) in process {os.getpid()}")
    if not isinstance(error, AxoexpError | KeyboardInterrupt):
        error.add_note(f"(in the job's process {os.getpid()})\n" + "".join(traceback.format_exception(error)))
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        copy = RuntimeError(f"{type(error).__name__}: {error}")
        for note in getattr(error, "__notes__", []):
            copy.add_note(note)
        return copy


def die_with_parent(signum: int) -> None:
    """Ask Linux to send ``signum`` to this process when the thread that forked it exits."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_PDEATHSIG) failed: %s", os.strerror(ctypes.get_errno()))


def _wait(child: int, read_end: int, payload: bytearray) -> int:
    """Wait for ``child``, draining its pipe; stop it and exit if the sweep's main process dies."""
    sweep = _sweep_process()
    while True:
        _drain(read_end, payload)
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid == child:
            return status
        if sweep is not None and not processes.alive(*sweep):
            print(
                f"axoexp: the sweep's main process {sweep[0]} is gone; stopping job process {child}",
                file=sys.stderr,
                flush=True,
            )
            _stop(child)
            os._exit(128 + signal.SIGTERM)
        time.sleep(POLL_S)


def _sweep_process() -> tuple[int, str | None] | None:
    """The sweep's main process to watch: (pid, start time), unless it is this process or on another host."""
    host, _, rest = os.environ.get(SWEEP_PROCESS_ENV, "").partition(" ")
    pid, _, started = rest.partition(" ")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return None
    return int(pid), started or None


def _stop(child: int) -> None:
    """SIGTERM ``child`` (its run then ends KILLED), SIGKILL it after :data:`CHILD_GRACE_S`; reap it."""
    for signum, grace in ((signal.SIGTERM, CHILD_GRACE_S), (signal.SIGKILL, 60.0)):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                if os.waitpid(child, os.WNOHANG)[0] == child:
                    return
            except ChildProcessError:
                return
            time.sleep(POLL_S)


def _drain(read_end: int, payload: bytearray) -> None:
    while True:
        try:
            chunk = os.read(read_end, 65536)
        except OSError as error:
            if error.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                return
            raise
        if not chunk:
            return
        payload.extend(chunk)


def _outcome(payload: bytearray) -> tuple[str, Any] | None:
    """What the child handed back (pickled by our own child just now); ``None`` if it died first."""
    try:
        return pickle.loads(bytes(payload)) if payload else None
    except Exception:  # cut off mid-write by its death
        return None


def how_it_ended(exit_code: int) -> str:
    """How a process that handed nothing back ended, from its exit code as ``subprocess`` gives it
    (``-N`` for signal N), in words: ``was killed by SIGKILL``."""
    if exit_code < 0:
        return f"was killed by {signal.Signals(-exit_code).name}"
    return f"exited with status {exit_code} without handing back a result"
