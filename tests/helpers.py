"""Helpers the tests share (fixtures live in conftest.py): the repository, CUDA skips, the CLI
in a fresh process, a plugin's text, free ports, a real MLflow server and leftover processes."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
import requests
import torch
from hydra.core.config_store import ConfigStore

from axoexp.config import node_class
from axoexp.plugins import load_plugins
from axoexp.registry import REGISTRY, Registry

REPO = Path(__file__).resolve().parents[1]
PLUGINS = Path(__file__).resolve().parent / "plugins"  # the tests' own: a documented population, a CPU fused executor
LENGTH_PLUGINS = Path(__file__).resolve().parent / "length_plugins"  # a CPU executor with length buckets
RAY_PORT_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}  # Ray then keeps every address on 127.0.0.1
TRACEBACK = "Traceback (most recent call last)"  # what no user-facing line may hold
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DRIVERLESS = next(
    (
        (f"{scheme}://u:p@127.0.0.1:1/db", module)
        for scheme, module in (
            ("mssql+pyodbc", "pyodbc"),
            ("mysql+pymysql", "pymysql"),
            ("postgresql+pg8000", "pg8000"),
        )
        if importlib.util.find_spec(module) is None
    ),
    None,
)
"""A database store's URI whose Python driver is not installed here, and that driver's module (pip's name
too); ``None`` where all three are (a test then skips)."""


def _cli_env(env: dict[str, str] | None) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}


def run_cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python -m axoexp ARGS`` in a fresh process."""
    return subprocess.run(
        [sys.executable, "-m", "axoexp", *args],
        cwd=cwd,
        env=_cli_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_cli(
    *args: str, cwd: Path, module: str = "axoexp", env: dict[str, str] | None = None, stdout: int = subprocess.PIPE
) -> subprocess.Popen[str]:
    """``python -m MODULE ARGS`` started in a fresh process, its output piped (or stdout to the file
    descriptor ``stdout``): :func:`run_cli` for commands that run side by side or are signalled while they run."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        text=True,
        env=_cli_env(env),
        stdout=stdout,
        stderr=subprocess.PIPE,
    )


def run_clis(
    calls: Sequence[tuple[Sequence[str], Path, dict[str, str] | None]],
    timeout: float = 300,
    stdout: int = subprocess.PIPE,
) -> list[subprocess.CompletedProcess[str]]:
    """:func:`run_cli` of each ``(args, cwd, env)``, all started at once: for commands that share
    nothing (each its own folder), as a process's start-up (imports) is most of a short command."""
    started = [start_cli(*args, cwd=cwd, env=env, stdout=stdout) for args, cwd, env in calls]
    try:
        finished = []
        for process in started:
            stdout, stderr = process.communicate(timeout=timeout)
            finished.append(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
        return finished
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.communicate()


def sleepy_executor_plugin(milliseconds: int) -> str:
    """A plugin file's text: executor ``sleepy``, eager plus a known sleep per update."""
    return f'''
import time
from axoexp import component
from axoexp.executors.eager import EagerExecutor

@component("executor", "sleepy")
class Sleepy(EagerExecutor):
    """Eager plus {milliseconds} ms of sleep per update: a known, slower executor."""
    update_includes = EagerExecutor.update_includes + ("sleep_{milliseconds}ms",)

    def step(self, inputs, targets):
        time.sleep({milliseconds / 1000})
        return super().step(inputs, targets)
'''


def registry_with_plugins(directory: Path) -> Registry:
    """The process registry plus the plugins in ``directory``, which the process registry then
    forgets again (other tests list the built-in executors); their config nodes stay in Hydra's
    store, so ``make_config`` composes them."""
    before = {(entry.group, entry.name) for entry in REGISTRY.components()}
    load_plugins(directory)
    registry = REGISTRY.copy()
    for entry in registry.components():
        if (entry.group, entry.name) not in before:
            del REGISTRY._components[entry.group][entry.name]
            ConfigStore.instance().store(group=entry.group, name=entry.name, node=node_class(entry))
    return registry


HOLD_LOCK = """
import sqlite3, sys, time
store = sqlite3.connect(sys.argv[1], isolation_level=None)
store.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(120)
"""


@contextmanager
def held_locked(store: Path) -> Iterator[None]:
    """Another process holds the sqlite file ``store`` locked (``BEGIN EXCLUSIVE``) meanwhile."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(store)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        yield
    finally:
        holder.kill()
        holder.wait()


@contextmanager
def gone_reader() -> Iterator[int]:
    """The write end of a pipe whose reader has gone, as ``| head -0`` leaves it: writes to it fail (EPIPE)."""
    read, write = os.pipe()
    os.close(read)
    try:
        yield write
    finally:
        os.close(write)


def fill(directory: Path) -> Path:
    """Write ``directory/filler`` until its filesystem is full (a real ENOSPC for what writes next)."""
    filler = directory / "filler"
    with filler.open("wb", buffering=0) as stream:
        try:
            while True:
                stream.write(b"\0" * 4096)
        except OSError:
            pass
    return filler


def start_python(args: Sequence[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``python ARGS`` in ``cwd`` with SIGINT's default handler, as a terminal's Ctrl-C finds it (a
    shell's background job would inherit it ignored)."""
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def interrupted(process: subprocess.Popen[str], ready: Callable[[], object], signum: int = signal.SIGINT) -> str:
    """Once ``ready()`` returns (the moment the test waits for), ``signum`` to ``process`` (SIGINT: a
    terminal's Ctrl-C): its stderr. It is killed if it outlives a minute or ``ready`` fails."""
    try:
        ready()
        process.send_signal(signum)
        return process.communicate(timeout=60)[1]
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def wait_for(path: Path, timeout_s: float = 120) -> None:
    """Until ``path`` exists (a process touches it as it reaches the moment a test waits for)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_mlflow(
    verb: str, root: Path, port: int, *, own_session: bool = False, backend: str | None = None, workers: int = 1
) -> subprocess.Popen[bytes]:
    """A real ``mlflow server`` or ``mlflow ui`` on 127.0.0.1:``port`` over ``root/mlflow.db``
    (or the ``backend`` store URI) with ``workers`` worker processes, returned once it answers
    /health (its log is ``root/VERB.log``, appended to). ``own_session`` puts it and its
    workers in a process group of their own, so a test can kill them all at once."""
    log = root / f"{verb}.log"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            verb,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            backend or f"sqlite:///{root / 'mlflow.db'}",
            "--workers",
            str(workers),
        ],
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=log.open("a"),
        start_new_session=own_session,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return server
        except requests.RequestException:
            pass
        if server.poll() is not None:
            break
        time.sleep(0.5)
    server.kill()
    pytest.fail(f"mlflow {verb} did not come up: " + log.read_text()[-2000:])


def leftovers(marker: str) -> list[str]:
    """Processes (other than this one) whose command line mentions ``marker``."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        command = " ".join(process.info["cmdline"] or [])
        if marker in command and process.info["pid"] != os.getpid():
            found.append(f"{process.info['pid']}: {command[:200]}")
    return found


def child_processes() -> set[int]:
    """The processes below this one now (the session's Ray instance and its workers among them)."""
    return {child.pid for child in psutil.Process().children(recursive=True)}


def new_child_processes(before: set[int]) -> list[psutil.Process]:
    """The processes below this one that are not in ``before`` nor below one of those."""
    return [
        child
        for child in psutil.Process().children(recursive=True)
        if not {child.pid, *(ancestor.pid for ancestor in child.parents())} & before
    ]
