"""User plugins from a plugins directory and from an installed package's entry points. Every
command of this module starts at once (module fixture ``ran``), each test's in a folder of its own."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from helpers import run_clis
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.slow  # every test here starts processes

PLUGIN = '''
import torch
from axoexp import component

@component("loss", "{name}")
def {name}(*, power: float = 4.0):
    """Mean |error|^power after the warm-up steps."""
    return lambda prediction, target: (prediction[:, 4:] - target[:, 4:]).abs().pow(power).mean()
'''


def _runs(db: Path):
    client = MlflowClient(f"sqlite:///{db}")
    return client.search_runs([client.get_experiment_by_name("axoexp").experiment_id])


def _quartic(folder: Path) -> list[tuple[tuple[str, ...], dict[str, str]]]:
    plugins = folder / "my_plugins"
    plugins.mkdir()
    (plugins / "quartic.py").write_text(PLUGIN.format(name="quartic"))
    env = {"AXOEXP_PLUGINS_DIR": str(plugins)}
    return [(("--help",), env), (("loss=quartic", "loss.power=6", "run.measured_updates=3"), env)]


def _entry_point(folder: Path) -> list[tuple[tuple[str, ...], dict[str, str]]]:
    site = folder / "site"
    (site / "axoexp_cubic").mkdir(parents=True)
    (site / "axoexp_cubic" / "__init__.py").write_text(PLUGIN.format(name="cubic"))
    dist_info = site / "axoexp_cubic-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: axoexp-cubic\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text("[axoexp.plugins]\ncubic = axoexp_cubic\n")
    (folder / "empty").mkdir()
    env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
        "AXOEXP_PLUGINS_DIR": str(folder / "empty"),
    }
    return [(("loss=cubic", "run.measured_updates=3"), env)]


def _broken(folder: Path) -> list[tuple[tuple[str, ...], dict[str, str]]]:
    (folder / "broken.py").write_text("import not_a_module_anywhere\n")
    env = {"AXOEXP_PLUGINS_DIR": str(folder)}
    return [(("--help",), env), (("run.measured_updates=1",), env)]


def _shadow(folder: Path) -> list[tuple[tuple[str, ...], dict[str, str]]]:
    (folder / "shadow.py").write_text(textwrap.dedent(PLUGIN.format(name="mse")))
    return [(("run.measured_updates=1",), {"AXOEXP_PLUGINS_DIR": str(folder)})]


def _missing(folder: Path) -> list[tuple[tuple[str, ...], dict[str, str]]]:
    return [(("--help",), {"AXOEXP_PLUGINS_DIR": str(folder / "typo")})]


CASES = {"quartic": _quartic, "entry point": _entry_point, "broken": _broken, "shadow": _shadow, "missing": _missing}


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[subprocess.CompletedProcess[str]], Path]]:
    """Each case's folder, set up by its function, and what its commands printed, in order: the
    cases share nothing, so every command runs side by side."""
    folders = {name: tmp_path_factory.mktemp("plugins") for name in CASES}
    commands = {name: prepare(folders[name]) for name, prepare in CASES.items()}
    calls = [(arguments, folders[name], env) for name in CASES for arguments, env in commands[name]]
    results = iter(run_clis(calls))
    return {name: ([next(results) for _ in commands[name]], folders[name]) for name in CASES}


def test_plugin_file_adds_a_selectable_configurable_option(ran) -> None:
    (shown, result), folder = ran["quartic"]
    assert "loss: causal_mse, huber, mse, quartic" in shown.stdout
    assert result.returncode == 0, result.stderr
    (run,) = _runs(folder / "mlflow.db")
    assert run.data.params["loss.name"] == "quartic" and run.data.params["loss.power"] == "6.0"
    assert run.data.tags["component.loss.source"] == str(folder / "my_plugins" / "quartic.py")


def test_entry_point_plugin_of_an_installed_package_is_found(ran) -> None:
    (result,), folder = ran["entry point"]
    assert result.returncode == 0, result.stderr
    (run,) = _runs(folder / "mlflow.db")
    assert run.data.tags["component.loss.source"] == "entry point cubic (axoexp_cubic)"


def test_broken_plugin_names_its_file_and_help_still_works(ran) -> None:
    (shown, result), folder = ran["broken"]
    assert shown.returncode == 0 and "loss: causal_mse" in shown.stdout
    assert f"plugin {folder / 'broken.py'} failed to import" in shown.stderr
    assert result.returncode == 2
    assert f"plugin {folder / 'broken.py'} failed to import" in result.stderr


def test_plugin_cannot_shadow_a_builtin(ran) -> None:
    (result,), folder = ran["shadow"]
    assert result.returncode != 0
    assert f"loss=mse is registered twice: by builtin and by {folder / 'shadow.py'}" in result.stderr


def test_a_named_plugins_directory_that_is_missing_is_an_error(ran) -> None:
    (result,), folder = ran["missing"]
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"axoexp: plugins directory {folder / 'typo'} (from $AXOEXP_PLUGINS_DIR) does not exist or is not a directory"
    )
