"""The configs (conf/, linked as axoexp/conf) ship as package data: a non-editable install finds them, and the
named presets, from any directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

pytestmark = pytest.mark.slow  # every test here starts processes


def test_wheel_install_composes_configs_outside_the_checkout(tmp_path: Path) -> None:
    source = tmp_path / "src"  # a clean copy: setuptools would reuse a stale build/ in the checkout
    shutil.copytree(  # symlinks kept, as in a clone: axoexp/conf links to the top-level conf/
        REPO,
        source,
        symlinks=True,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", ".whl", "build", "outputs", "mlruns", "*.db", "__pycache__", "*.egg-info"
        ),
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("axoexp-*.whl")
    import zipfile

    shipped = set(zipfile.ZipFile(wheel).namelist())
    configs = {f"axoexp/conf/{path.relative_to(REPO / 'conf')}" for path in (REPO / "conf").rglob("*.yaml")}
    assert "axoexp/conf/hydra/job_logging/axoexp.yaml" in configs and configs <= shipped, configs - shipped
    sweeper = "hydra_plugins/axoexp_optuna_sweeper"
    assert {f"{sweeper}/{module}.py" for module in ("__init__", "config", "optuna_sweeper")} <= shipped
    launcher = "hydra_plugins/axoexp_parallel_launcher"
    assert {f"{launcher}/{module}.py" for module in ("__init__", "config", "parallel_launcher")} <= shipped
    assert "hydra_plugins/__init__.py" not in shipped, "a namespace package Hydra's other plugins share"
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    work = tmp_path / "elsewhere"
    work.mkdir()
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "PYTHONSAFEPATH": "1"}
    probe = subprocess.run(
        [sys.executable, "-c", "import axoexp; print(axoexp.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.startswith(str(site)), "the test must exercise the installed copy"
    result = subprocess.run(
        [sys.executable, "-m", "axoexp", "executor=cudagraph", "optimizer=sgd", "--cfg", "job"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "name: cudagraph" in result.stdout and "name: sgd" in result.stdout
    preset = subprocess.run(
        [sys.executable, "-m", "axoexp", "+experiment=regional_cudagraph_64x256x32_h200", "--cfg", "job"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert preset.returncode == 0, preset.stderr
    assert "name: regional_cudagraph" in preset.stdout and "neurons: 64" in preset.stdout
    help_text = subprocess.run(
        [sys.executable, "-m", "axoexp", "--help"], cwd=work, env=env, capture_output=True, text=True, timeout=120
    ).stdout
    assert f"their files: {site / 'axoexp' / 'conf' / 'experiment'}/NAME.yaml" in help_text
