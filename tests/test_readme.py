"""The commands the README and docs/ show work as written: those a CPU can run are run.

Each ``python -m axoexp...`` line of a bash block is run in a fresh directory with the shipped
plugins, in the order the page gives them, with few updates where it times any. A command that
reads what ran before it (the report, compare, sync: :data:`READERS`) waits for every command
before it and runs alone, and a sweep waits for an earlier sweep (a rerun reuses its jobs); the
others (single runs, those that only print: ``--help``, ``--describe``, ``--cfg``) start as the
page reaches them, alongside what runs then. A command that needs CUDA is composed instead
(Hydra's compose, in the test's process); one that needs another launcher or a cluster is named
with the reason it is not run. A ``$`` line with its output in a plain block is run and must
print that output.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO
from hydra import compose, initialize_config_module

from axoexp.registry import Registry

pytestmark = pytest.mark.slow  # every test here starts processes

README = REPO / "README.md"
PAGES = [
    README,
    *(REPO / "docs" / name for name in ("design.md", "sweeps.md", "troubleshooting.md", "decide.md", "lengths.md")),
]
FINDS_REGRESSIONS = "axoexp.compare"  # exits 1 when it finds a regression: it still ran as written
FEW_UPDATES = ["run.warmup_updates=1", "run.measured_updates=3", "run.progress=false"]
FEW_TRIALS = "hydra.sweeper.n_trials=3"  # a search's trials are jobs like any other: three show it searches
TIMED = ("run.warmup_updates=", "run.measured_updates=", "hydra.sweeper.n_trials=")  # what the test sets itself
NOT_RUN = {  # a pattern in the command: why a CPU test does not run it
    "hydra/launcher=": "another launcher (tests/test_launchers.py runs each)",
    "http://": "a tracking server on another host",
}
NEEDS_CUDA = ("device=cuda", "_h200")
INFORMATIVE = {"--help", "--describe", "--cfg"}  # print and exit: nothing timed, no store, no output folder
READERS = ("axoexp.report", "axoexp.compare", "axoexp.sync")  # read the store or outputs that earlier commands wrote


def blocks(page: Path, language: str) -> list[str]:
    """The fenced blocks of ``language`` ("" for plain ones) on the page, in order."""
    found: list[str] = []
    current: list[str] | None = None
    wanted = False
    for line in page.read_text().splitlines():
        line = line.strip()  # a block in a list item is indented
        if line.startswith("```"):
            if current is None:
                current, wanted = [], line[3:] == language
            else:
                if wanted:
                    found.append("\n".join(current) + "\n")
                current = None
        elif current is not None:
            current.append(line)
    return found


def commands(page: Path) -> list[str]:
    """The ``python -m axoexp`` commands of the page's bash blocks, continuation lines joined."""
    found = []
    for block in blocks(page, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line.startswith("python -m axoexp"):
                found.append(line)
    return found


def plan(command: str) -> tuple[list[str] | None, str]:
    """The arguments to run for a documented command, or None and why it is not run."""
    for pattern, reason in NOT_RUN.items():
        if pattern in command:
            return None, reason
    words = shlex.split(command)
    module, arguments = words[2], words[3:]
    multirun = "-m" in arguments
    if module == "axoexp" and any(marker in command for marker in NEEDS_CUDA):
        if multirun:
            return None, "a sweep on CUDA"
        return [module, *arguments], "composed only: needs CUDA"
    if module == "axoexp" and not INFORMATIVE & set(arguments):
        arguments = [*(a for a in arguments if not a.startswith(TIMED)), *FEW_UPDATES]
        if "hydra/sweeper=optuna" in arguments:
            arguments.append(FEW_TRIALS)
    return [module, *arguments], "run"


def run_by_the_readme(page: Path) -> set[str]:
    """The commands of ``page`` that the README's test runs the same way, in the same order
    before them: a page that repeats the README's steps is not run twice."""
    if page == README:
        return set()
    ran = [plan(command)[0] for command in commands(README)]
    mine = [plan(command)[0] for command in commands(page)]
    return {
        command
        for command, arguments in zip(commands(page), mine, strict=True)
        if arguments is not None and _in_order(mine[: mine.index(arguments) + 1], ran)
    }


def _in_order(steps: list[list[str] | None], ran: list[list[str] | None]) -> bool:
    """Whether ``steps`` (what a page runs up to one command) appear in ``ran`` in the same order."""
    position = 0
    for step in (step for step in steps if step is not None):
        try:
            position = ran.index(step, position) + 1
        except ValueError:
            return False
    return True


@pytest.fixture
def workdir(tmp_path: Path, empty_store: Path) -> Path:
    shutil.copyfile(empty_store, tmp_path / "mlflow.db")
    shutil.copytree(REPO / "plugins", tmp_path / "plugins")
    (tmp_path / "outputs").mkdir()  # where a reader's runs are, as the pages' sync commands expect
    return tmp_path


def start(arguments: list[str], cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.pop("MLFLOW_TRACKING_URI", None)  # as a reader's shell: the default store in the working directory
    return subprocess.Popen(
        [sys.executable, "-m", *arguments],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


Started = list[tuple[str, str, list[str], subprocess.Popen[str]]]  # command, why it runs, arguments, process


def finish(page: Path, started: Started, ran: list[str]) -> None:
    """Wait for the ``started`` commands, in order; each must succeed."""
    for command, why, arguments, process in started:
        _, stderr = process.communicate(timeout=600)
        ok = (0, 1) if arguments[0] == FINDS_REGRESSIONS else (0,)
        assert process.returncode in ok, f"{page.name}: `{command}` ({why}) failed:\n{stderr[-3000:]}"
        ran.append(command)
    started.clear()


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_documented_commands_work_as_written(page: Path, workdir: Path, loaded_registry: Registry) -> None:
    documented = commands(page)
    if page.name == "README.md":
        assert len(documented) >= 10, "the README's commands were not found"
    ran: list[str] = []
    started: Started = []  # running now, in the page's order
    covered = run_by_the_readme(page)
    try:
        for command in documented:
            arguments, why = plan(command)
            if arguments is None or command in covered:
                continue
            if why.startswith("composed only"):  # in this process: composing is what a CPU can check
                with initialize_config_module(config_module="axoexp.conf", version_base="1.3"):
                    compose("config", overrides=arguments[1:])
                continue
            reader, sweep = arguments[0] in READERS, "-m" in arguments[1:]
            if reader or (sweep and any("-m" in earlier[1:] for _, _, earlier, _ in started)):
                finish(page, started, ran)
            started.append((command, why, arguments, start(arguments, workdir)))
            if reader:
                finish(page, started, ran)
        finish(page, started, ran)
    finally:
        for *_, process in started:
            if process.poll() is None:
                process.kill()
                process.communicate()
    if page.name == "README.md":  # the first run, a preset, the sweep and its report all ran
        assert any(c.startswith("python -m axoexp executor=eager") for c in ran)
        assert any("+experiment=eager_cpu" in c for c in ran)
        assert any(c.startswith("python -m axoexp -m population.neurons") for c in ran)
        assert "python -m axoexp.report" in ran


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_documented_errors_are_what_the_command_prints(page: Path, workdir: Path) -> None:
    """Each ``$`` line and the line it prints; the commands are refused before they write anything,
    so they run side by side."""
    shown = []
    for block in blocks(page, ""):
        lines = block.splitlines()
        shown += [
            (line, lines[index + 1]) for index, line in enumerate(lines[:-1]) if line.startswith("$ python -m axoexp")
        ]
    started = [start(shlex.split(line[2:])[2:], workdir) for line, _ in shown]
    try:
        for (line, printed), process in zip(shown, started, strict=True):
            _, stderr = process.communicate(timeout=600)
            assert printed in stderr.splitlines(), f"{line}: printed {stderr!r}"
            assert process.returncode == 2
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.communicate()
