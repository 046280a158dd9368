"""Overrides instantiate only what axoexp ships: a foreign ``_target_`` anywhere in the composed
config, and the removal of axoexp's sweep callback, are refused before Hydra instantiates anything."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers import run_clis
from hydra import compose, initialize_config_module
from omegaconf import open_dict

from axoexp.targets import check_targets


def composed(*overrides: str):
    with initialize_config_module(config_module="axoexp.conf", version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


@pytest.mark.parametrize("launcher", ["basic", "parallel", "submitit_local", "slurm", "ray_devices"])
def test_every_shipped_launcher_preset_passes(loaded_registry, launcher: str) -> None:
    assert check_targets(composed(f"hydra/launcher={launcher}")) is None


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["+hydra.callbacks.x._target_=builtins.open", "+hydra.callbacks.x.file=F", "+hydra.callbacks.x.mode=w"],
            "hydra.callbacks.x._target_=builtins.open: refused: only Callback classes from axoexp.*, hydra.*",
        ),
        (
            ["hydra.callbacks.mlflow_sweep._target_=builtins.print"],
            "hydra.callbacks.mlflow_sweep._target_=builtins.print: axoexp's sweep callback cannot be removed",
        ),
        (
            ["hydra.callbacks.mlflow_sweep._target_=hydra.experimental.callbacks.LogJobReturnCallback"],
            "hydra.callbacks.mlflow_sweep._target_=hydra.experimental.callbacks.LogJobReturnCallback: axoexp's sweep "
            "callback cannot be removed or replaced; it must be axoexp.sweep.MlflowSweepCallback",
        ),
        (["~hydra.callbacks.mlflow_sweep"], "hydra.callbacks.mlflow_sweep._target_: axoexp's sweep callback"),
        (
            ["+hydra.callbacks.y._target_=axoexp.sync.main"],
            "hydra.callbacks.y._target_=axoexp.sync.main: refused: not a class",
        ),
        (
            ["+hydra.callbacks.y._target_=axoexp.experiment.ExperimentResult"],
            "hydra.callbacks.y._target_=axoexp.experiment.ExperimentResult: refused: only Callback classes",
        ),
        (["hydra.launcher._target_=builtins.exec"], "hydra.launcher._target_=builtins.exec: refused: only Launcher"),
        (["hydra.sweeper._target_=os.system"], "hydra.sweeper._target_=os.system: refused: only Sweeper"),
        (
            ["+hydra.job_logging.handlers.x.class=builtins.open"],
            "hydra.job_logging.handlers.x.class=builtins.open: refused: only Formatter or Handler or Filter",
        ),
        (["+population.x._target_=os.system"], "population.x._target_=os.system: refused: only classes from axoexp"),
        (["+run.x.y._target_=subprocess.Popen"], "run.x.y._target_=subprocess.Popen: refused"),
    ],
)
def test_a_foreign_target_is_refused_naming_the_key(loaded_registry, overrides: list[str], message: str) -> None:
    problem = check_targets(composed(*overrides))
    assert problem is not None and problem.startswith(message), problem


def test_a_logging_factory_from_a_config_file_is_checked_too(loaded_registry) -> None:
    """``()`` cannot be written as an override, but a config directory's logging option can hold it."""
    config = composed()
    with open_dict(config):
        config.hydra.hydra_logging.formatters.colorlog["()"] = "os.system"
    assert (check_targets(config) or "").startswith("hydra.hydra_logging.formatters.colorlog.()=os.system: refused")


def test_a_key_named_class_outside_logging_is_data(loaded_registry) -> None:
    assert check_targets(composed("+population.x.class=builtins.open")) is None


INJECTED = ("+hydra.callbacks.x._target_=builtins.open", "+hydra.callbacks.x.mode=w", "run.measured_updates=2")
CLI = {  # the commands of this module's CLI tests: a name, the arguments
    "run": INJECTED,
    "sweep": ("-m", *INJECTED),
    "sweep value": ("-m", "+run.x._target_=os.system,axoexp.sweep.MlflowSweepCallback", "run.measured_updates=2"),
}


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[subprocess.CompletedProcess[str], Path]]:
    """What each of ``CLI`` printed and its folder: they share nothing, so they run side by side;
    each injected callback would open its folder's victim.txt for writing."""
    folders = {name: tmp_path_factory.mktemp("targets") for name in CLI}
    calls = []
    for name, arguments in CLI.items():
        (folders[name] / "victim.txt").write_text("kept")
        victim = (f"+hydra.callbacks.x.file={folders[name] / 'victim.txt'}",) if INJECTED[0] in arguments else ()
        calls.append(((*arguments, *victim), folders[name], None))
    return {name: (result, folders[name]) for name, result in zip(CLI, run_clis(calls), strict=True)}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["run", "sweep"])
def test_the_cli_refuses_an_injected_callback_before_calling_it(cli, mode: str) -> None:
    result, folder = cli[mode]
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "axoexp: hydra.callbacks.x._target_=builtins.open: refused: only Callback classes from axoexp.*, hydra.* "
        "may be named here"
    ]
    assert (folder / "victim.txt").read_text() == "kept"
    assert not (folder / "mlflow.db").exists() and not (folder / "outputs").exists(), "nothing ran"


@pytest.mark.slow
def test_a_sweep_value_naming_a_target_under_a_key_nothing_reads_refuses_the_sweep(cli) -> None:
    """Planning refuses a key that a ``+`` override added outside the components, in every job,
    before any run or instantiation; the target check (above) stays behind it."""
    result, folder = cli["sweep value"]
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(
        "axoexp: no job of the sweep can run, so it created no run: job 0 (+run.x._target_=os.system"
    )
    assert line.count("run.x: no such key in run; its keys: warmup_updates,") == 2
    assert not (folder / "mlflow.db").exists()
