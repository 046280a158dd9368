"""docs/plugins.md works as written: its commands run from a copy of the repository's root (its
``plugins/`` and ``tests/plugins/``), with its ``lite`` wrapper saved as a plugin file there, and
each ``$`` line prints the line shown under it."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest
from helpers import REPO, run_clis
from mlflow.tracking import MlflowClient
from test_readme import blocks

from axoexp import names

pytestmark = pytest.mark.slow  # every test here starts processes

PAGE = REPO / "docs" / "plugins.md"
WRAPPER = '@component("population", "lite_wide")'


def command(line: str) -> tuple[list[str], dict[str, str]]:
    """A documented ``[NAME=VALUE ...] python -m axoexp ARGS`` line: the arguments after ``python -m axoexp``
    and the environment it sets."""
    words = shlex.split(line)
    start = words.index("python")
    assert words[start : start + 3] == ["python", "-m", "axoexp"], line
    return words[start + 3 :], dict(word.split("=", 1) for word in words[:start])


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, empty_store: Path) -> Path:
    """What the page's reader runs from: the repository's plugins and test plugins, the page's
    wrapper in ``plugins/`` ("with the file above in your plugins directory") and a store."""
    folder = tmp_path_factory.mktemp("root")
    shutil.copyfile(empty_store, folder / "mlflow.db")
    shutil.copytree(REPO / "plugins", folder / "plugins")
    shutil.copytree(REPO / "tests" / "plugins", folder / "tests" / "plugins")
    (wrapper,) = [
        block for block in re.findall(r"^```python\n(.*?)^```$", PAGE.read_text(), re.M | re.S) if WRAPPER in block
    ]
    (folder / "plugins" / "lite_wide.py").write_text(wrapper)
    return folder


def test_the_pages_commands_run_as_written(root: Path) -> None:
    lines = [line for block in blocks(PAGE, "bash") for line in block.splitlines() if "python -m axoexp" in line]
    assert len(lines) >= 4, "the page's commands were not found"
    results = run_clis([(arguments, root, env) for arguments, env in map(command, lines)])
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("axoexp").experiment_id])
    for line, result in zip(lines, results, strict=True):
        assert result.returncode == 0, f"`{line}` failed:\n{result.stderr[-3000:]}"
        assert "eval loss " in result.stdout, f"`{line}`: its population holds out batches, so the run evaluates"
    assert len(runs) == len(lines) and all(run.info.status == "FINISHED" for run in runs)
    (wide,) = [run for run in runs if run.data.params["population.name"] == "lite_wide"]
    assert wide.data.tags["component.population.source"] == str(root / "plugins" / "lite_wide.py")
    assert wide.data.tags[names.SHAPE] == "32x12x8", (
        "the wrapper's own neurons, lite's time steps and its fixed contacts"
    )


def test_the_pages_refusals_print_what_it_shows(root: Path) -> None:
    shown = []
    for block in blocks(PAGE, ""):
        lines = block.splitlines()
        shown += [(line, lines[index + 1]) for index, line in enumerate(lines[:-1]) if line.startswith("$ ")]
    assert any("lite_wide" in line for line, _ in shown)
    # and what the page says the wrapper keeps of lite: its memory estimate refuses a population too big
    too_big = ("population=lite_wide", "population.neurons=1000000000")
    refusals = [(arguments, root, env) for arguments, env in (command(line[2:]) for line, _ in shown)]
    results = run_clis([*refusals, (too_big, root, None)])
    for (line, printed), result in zip(shown, results, strict=False):
        assert printed in result.stderr.splitlines(), f"{line}: printed {result.stderr!r}"
        assert result.returncode == 2
    assert results[-1].returncode == 2 and "population lite_wide needs about" in results[-1].stderr, results[-1].stderr
