"""A pool of long-lived worker processes that outlives the death of any of them.

``hydra/launcher=parallel`` runs a sweep's jobs on it (:mod:`axoexp.parallel_launcher`). Each
of ``size`` workers is a fresh interpreter (``python -m axoexp.worker_pool``) that runs call
after call, so its imports are paid once; calls and what they returned or raised travel over
pipes, pickled with cloudpickle as joblib does, and each call runs in the caller's working
directory and environment as of :meth:`WorkerPool.run`, as it would in a fresh process. In the
calling process one thread per worker hands it calls from a queue.

When a worker dies mid-call (kill -9, the out-of-memory killer), that call alone is lost: the
processes the worker forked for it (a sweep job's process, :mod:`axoexp.job_process`) get their
parent-death signal and are waited for (SIGKILL after :data:`~axoexp.job_process.CHILD_GRACE_S`),
``on_death`` gives the call's result, and a fresh worker takes the thread's next call. (joblib's
loky executor instead calls the pool broken and terminates every other worker.)

Nothing is left running: a worker gets SIGKILL when the thread that started it ends (Linux's
parent-death signal; the threads live as long as the pool, so as the calling process), exits
when its pipe of calls closes, and is closed after :data:`IDLE_S` without a call. Once the
calling process is being stopped by a signal (:func:`axoexp.signals.received`), the pool starts
no worker and no call.
"""

from __future__ import annotations

import atexit
import os
import pickle
import queue
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import cloudpickle

from axoexp import processes, signals
from axoexp.job_process import CHILD_GRACE_S, POLL_S, die_with_parent, how_it_ended

WORKER_MODULE = "axoexp.worker_pool"
IDLE_S = 120.0
"""How long a worker waits for its next call before the pool closes it (a fresh one starts on demand)."""
EXIT_GRACE_S = 10.0
"""How long a closed worker may take to exit before it is killed."""
_LENGTH = struct.Struct(">Q")
_FORKED = "forked"

Call = tuple[Callable[..., Any], tuple[Any, ...]]
"""A function and its arguments."""
Outcome = tuple[str, Any]
"""``("returned", value)`` or ``("raised", error)``."""


@dataclass(frozen=True)
class WorkerDeath:
    """A worker that died mid-call: its pid, how it ended (``was killed by SIGKILL``) and the
    processes it had forked for the call, as (pid, start time)."""

    pid: int
    how: str
    forked: tuple[tuple[int, str | None], ...]


class WorkerPool:
    """``size`` worker processes, started on demand, each running one call at a time."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a pool needs at least 1 worker, not {size}")
        self.size = size
        self._calls: queue.Queue[tuple[_Batch, int, bytes] | None] = queue.Queue()
        self._workers: set[_Worker] = set()
        self._lock = threading.Lock()
        self._deaths = threading.Lock()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._serve, name=f"axoexp-pool-{number}", daemon=True) for number in range(size)
        ]
        for thread in self._threads:
            thread.start()
        atexit.register(self.close)

    def run(self, calls: Sequence[Call], on_death: Callable[[int, WorkerDeath], Any]) -> list[Any]:
        """What each call returned, in order; for a call whose worker died, what ``on_death(index,
        death)`` returned (called once the worker's processes are gone, one at a time). When every
        call has ended, the first error a call raised is raised. An interruption (a stop signal)
        kills the workers and is raised at once."""
        context = (os.getcwd(), dict(os.environ))
        payloads = [cloudpickle.dumps((*context, *call)) for call in calls]
        batch = _Batch(len(calls), on_death)
        for index, payload in enumerate(payloads):
            self._calls.put((batch, index, payload))
        try:
            while not batch.done.wait(POLL_S):
                pass
        except BaseException:
            self.close(kill=True)
            raise
        raised = [value for kind, value in batch.outcomes if kind == "raised"]
        if raised:
            raise raised[0]
        return [value for _, value in batch.outcomes]

    def close(self, *, kill: bool = False) -> None:
        """End every worker (``kill``: at once, else when it has finished its call) and the threads."""
        with self._lock:
            self._closed = True
            if kill:
                for worker in self._workers:
                    worker.process.kill()
        for _ in self._threads:
            self._calls.put(None)
        for thread in self._threads:
            thread.join()

    def _stopping(self) -> bool:
        return self._closed or signals.received() is not None

    def _serve(self) -> None:
        """One thread's loop: take a call, run it on this thread's worker, replace a dead worker."""
        worker: _Worker | None = None
        try:
            while True:
                try:
                    item = self._calls.get(timeout=IDLE_S if worker is not None else None)
                except queue.Empty:  # idle: no call for a while
                    self._retire(worker)
                    worker = None
                    continue
                if item is None:
                    return
                batch, index, payload = item
                try:
                    if self._stopping():
                        raise RuntimeError("not run: the pool was stopped")
                    if worker is None or worker.process.poll() is not None:  # none yet, or it died between calls
                        self._retire(worker)
                        worker = None
                        worker = self._start()
                    result = worker.call(payload)
                    if isinstance(result, WorkerDeath):
                        self._retire(worker)
                        worker = None
                        _end(result.forked)
                        if self._stopping():
                            raise RuntimeError(f"the worker process {result.pid} {result.how} as the pool stopped")
                        with self._deaths:  # on_death's bookkeeping, one death at a time
                            result = ("returned", batch.on_death(index, result))
                    outcome = result
                except BaseException as error:  # the call's outcome; the thread goes on
                    outcome = ("raised", error)
                batch.finish(index, outcome)
        finally:
            self._retire(worker)

    def _start(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise RuntimeError("not run: the pool was stopped")
            worker = _Worker()
            self._workers.add(worker)
            return worker

    def _retire(self, worker: _Worker | None) -> None:
        if worker is not None:
            worker.close()
            with self._lock:
                self._workers.discard(worker)


class _Batch:
    """The calls of one :meth:`WorkerPool.run` and their outcomes as they come in."""

    def __init__(self, size: int, on_death: Callable[[int, WorkerDeath], Any]) -> None:
        self.outcomes: list[Outcome] = [("raised", RuntimeError("not run"))] * size
        self.on_death = on_death
        self.done = threading.Event()
        self._left = size
        self._lock = threading.Lock()
        if size == 0:
            self.done.set()

    def finish(self, index: int, outcome: Outcome) -> None:
        with self._lock:
            self.outcomes[index] = outcome
            self._left -= 1
            if self._left == 0:
                self.done.set()


class _Worker:
    """One worker process and its two pipes: calls in, announcements and outcomes out."""

    def __init__(self) -> None:
        call_read, self.calls = os.pipe()
        self.results, result_write = os.pipe()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", WORKER_MODULE, str(call_read), str(result_write), str(os.getpid())],
                pass_fds=(call_read, result_write),
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            os.close(self.calls)
            os.close(self.results)
            raise
        finally:
            os.close(call_read)
            os.close(result_write)
        try:  # what a spawned worker needs to unpickle calls
            _write_frame(self.calls, pickle.dumps((sys.path, sys.argv)))
        except BrokenPipeError:
            pass  # it died at once; its first call says how

    def call(self, payload: bytes) -> Outcome | WorkerDeath:
        """Run one call: its outcome, or how the worker died before handing one back."""
        forked: list[tuple[int, str | None]] = []
        buffer = bytearray()
        try:
            _write_frame(self.calls, payload)
        except BrokenPipeError:
            pass  # it died between calls; told below
        poller = select.poll()
        poller.register(self.results, select.POLLIN)
        while True:
            exited = self.process.poll() is not None  # before reading: what it wrote before exiting is read below
            closed = False
            while poller.poll(0 if exited else POLL_S * 1000):
                chunk = os.read(self.results, 1 << 16)
                if not chunk:
                    closed = True
                    break
                buffer.extend(chunk)
                for message in _frames(buffer):
                    if message[0] == _FORKED:
                        forked.append(message[1])
                    else:
                        return message
                if not exited:
                    break
            if exited or closed:
                return WorkerDeath(self.process.pid, how_it_ended(self.process.wait()), tuple(forked))

    def close(self) -> None:
        """Close its pipe of calls (it then exits) and reap it; kill it if it lingers."""
        os.close(self.calls)
        os.close(self.results)
        try:
            self.process.wait(timeout=EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _end(forked: Sequence[tuple[int, str | None]]) -> None:
    """End the processes a dead worker forked: SIGTERM (they got it already as their parent-death
    signal, if they set one), then SIGKILL after :data:`CHILD_GRACE_S`; return when all are gone."""
    for signum, grace in ((signal.SIGTERM, CHILD_GRACE_S), (signal.SIGKILL, 60.0)):
        alive = [process for process in forked if processes.alive(*process)]
        for pid, _ in alive:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while alive and time.monotonic() < deadline:
            time.sleep(POLL_S)
            alive = [process for process in alive if processes.alive(*process)]
        if not alive:
            return


def _framed(data: bytes) -> bytes:
    return _LENGTH.pack(len(data)) + data


def _write_frame(fd: int, data: bytes) -> None:
    view = memoryview(_framed(data))
    while view:
        view = view[os.write(fd, view) :]


def _frames(buffer: bytearray) -> list[Outcome]:
    """The complete messages at the start of ``buffer``, taken out of it."""
    messages = []
    while len(buffer) >= _LENGTH.size:
        (length,) = _LENGTH.unpack_from(buffer)
        if len(buffer) < _LENGTH.size + length:
            break
        messages.append(pickle.loads(bytes(buffer[_LENGTH.size : _LENGTH.size + length])))
        del buffer[: _LENGTH.size + length]
    return messages


# --- the worker process


def _read_frame(fd: int) -> bytes | None:
    """The next message from the pool; ``None`` once the pool closed the pipe."""
    data = bytearray()
    need = _LENGTH.size
    length: int | None = None
    while True:
        while len(data) < need:
            chunk = os.read(fd, need - len(data))
            if not chunk:
                return None
            data.extend(chunk)
        if length is not None:
            return bytes(data[_LENGTH.size :])
        (length,) = _LENGTH.unpack_from(data)
        need += length


def _announce(results: int, worker: int) -> None:
    """In a process the worker forks (a job's process): tell the pool its pid and start time, so
    that it is ended if the worker dies. Its own forks (a compiler's workers) are not announced."""
    pid = os.getpid()
    if os.getppid() != worker:
        return
    try:  # one write under PIPE_BUF: it cannot interleave with the worker's own
        os.write(results, _framed(pickle.dumps((_FORKED, (pid, processes.start_time(pid))))))
    except OSError:
        pass


def _outcome(payload: bytes) -> bytes:
    """Run one call; what it returned or raised, pickled."""
    try:
        cwd, environment, function, arguments = pickle.loads(payload)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environment)
        outcome: Outcome = ("returned", function(*arguments))
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # SystemExit too: the worker goes on
        outcome = ("raised", error)
    try:
        return cloudpickle.dumps(outcome)
    except Exception as error:  # e.g. an error holding a lock
        return cloudpickle.dumps(("raised", RuntimeError(f"the call's outcome cannot be handed back: {error}")))


def main(argv: list[str]) -> None:
    """``python -m axoexp.worker_pool CALLS RESULTS POOL_PID``: run calls until the pool closes CALLS."""
    calls, results, pool = (int(argument) for argument in argv)
    code = 1
    try:
        for fd in (calls, results):  # passed down to this process only, not to what it starts
            os.set_inheritable(fd, False)
        die_with_parent(signal.SIGKILL)
        if os.getppid() != pool:  # the pool's process died before the parent-death signal was set
            return
        setup = _read_frame(calls)
        if setup is None:
            return
        sys.path[:], sys.argv[:] = pickle.loads(setup)
        worker = os.getpid()
        os.register_at_fork(after_in_child=lambda: _announce(results, worker))
        while (payload := _read_frame(calls)) is not None:
            _write_frame(results, _outcome(payload))
        code = 0
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the sweep says what happened
        code = 128 + signal.SIGINT
    except BrokenPipeError:  # the pool's process is gone
        pass
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # no teardown of torch and friends: seconds, for nothing


if __name__ == "__main__":
    main(sys.argv[1:])
