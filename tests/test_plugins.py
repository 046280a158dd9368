"""User plugins from a plugins directory and from an installed package's entry points."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from helpers import run_cli
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


def test_plugin_file_adds_a_selectable_configurable_option(tmp_path: Path) -> None:
    plugins = tmp_path / "my_plugins"
    plugins.mkdir()
    (plugins / "quartic.py").write_text(PLUGIN.format(name="quartic"))
    env = {"AXOEXP_PLUGINS_DIR": str(plugins)}

    shown = run_cli("--help", cwd=tmp_path, env=env)
    assert "loss: causal_mse, huber, mse, quartic" in shown.stdout

    result = run_cli("loss=quartic", "loss.power=6", "run.measured_updates=3", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    (run,) = _runs(tmp_path / "mlflow.db")
    assert run.data.params["loss.name"] == "quartic" and run.data.params["loss.power"] == "6.0"
    assert run.data.tags["component.loss.source"] == str(plugins / "quartic.py")


def test_entry_point_plugin_of_an_installed_package_is_found(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "axoexp_cubic").mkdir(parents=True)
    (site / "axoexp_cubic" / "__init__.py").write_text(PLUGIN.format(name="cubic"))
    dist_info = site / "axoexp_cubic-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: axoexp-cubic\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text("[axoexp.plugins]\ncubic = axoexp_cubic\n")
    (tmp_path / "empty").mkdir()
    env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
        "AXOEXP_PLUGINS_DIR": str(tmp_path / "empty"),
    }

    result = run_cli("loss=cubic", "run.measured_updates=3", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    (run,) = _runs(tmp_path / "mlflow.db")
    assert run.data.tags["component.loss.source"] == "entry point cubic (axoexp_cubic)"


def test_broken_plugin_names_its_file_and_help_still_works(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("import not_a_module_anywhere\n")
    env = {"AXOEXP_PLUGINS_DIR": str(tmp_path)}
    shown = run_cli("--help", cwd=tmp_path, env=env)
    assert shown.returncode == 0 and "loss: causal_mse" in shown.stdout
    assert f"plugin {tmp_path / 'broken.py'} failed to import" in shown.stderr
    result = run_cli("run.measured_updates=1", cwd=tmp_path, env=env)
    assert result.returncode == 2
    assert f"plugin {tmp_path / 'broken.py'} failed to import" in result.stderr


def test_plugin_cannot_shadow_a_builtin(tmp_path: Path) -> None:
    (tmp_path / "shadow.py").write_text(textwrap.dedent(PLUGIN.format(name="mse")))
    result = run_cli("run.measured_updates=1", cwd=tmp_path, env={"AXOEXP_PLUGINS_DIR": str(tmp_path)})
    assert result.returncode != 0
    assert f"loss=mse is registered twice: by builtin and by {tmp_path / 'shadow.py'}" in result.stderr


def test_a_named_plugins_directory_that_is_missing_is_an_error(tmp_path: Path) -> None:
    result = run_cli("--help", cwd=tmp_path, env={"AXOEXP_PLUGINS_DIR": str(tmp_path / "typo")})
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"axoexp: plugins directory {tmp_path / 'typo'} (from $AXOEXP_PLUGINS_DIR) does not exist or is not a directory"
    )
