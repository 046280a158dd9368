"""A run's wall time from its process's start, in phases that add up (axoexp.wallclock)."""

from __future__ import annotations

import gc
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import run_cli
from hydra import initialize_config_module
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from axoexp import collector, names, wallclock
from axoexp.compose_once import RUN_MODE_OVERRIDE, composed_once
from axoexp.console import process_summary
from axoexp.registry import Registry
from axoexp.tracking import latest_schema_revision

PROCESS_START_TICK_MS = 10
"""The process's start is read in clock ticks (1/100 s on Linux)."""
UNLOGGED_TOLERANCE_MS = 3000
"""What the run cannot log, seen from outside: its exit after the last mark (exit handlers, the
streams flushed, the kernel reaping it) and the test's own fork and exec, on a shared 2-core machine."""


@pytest.mark.slow
def test_phases_are_logged_and_add_up_to_the_wall_time_seen_from_outside(tmp_path: Path) -> None:
    started = time.perf_counter()
    result = run_cli("executor=eager", "loss=causal_mse", "run.measured_updates=5", cwd=tmp_path)
    outside_ms = (time.perf_counter() - started) * 1000
    assert result.returncode == 0, result.stderr
    run_id = re.search(r"mlflow run\s+([0-9a-f]{32})", result.stdout).group(1)
    metrics = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(run_id).data.metrics
    phases = {key: value for key, value in metrics.items() if key.startswith("process_") and key != names.PROCESS_TOTAL}
    expected = {names.process_metric(phase) for phase in names.PROCESS_PHASES if phase != "verify"}  # verify is off
    assert set(phases) == expected
    assert all(value >= 0 for value in phases.values())
    assert sum(phases.values()) == pytest.approx(metrics[names.PROCESS_TOTAL], rel=1e-6)  # as stored: rounded
    total = metrics[names.PROCESS_TOTAL]
    assert total <= outside_ms + PROCESS_START_TICK_MS, "the process cannot have run longer than it was watched"
    assert outside_ms - total <= UNLOGGED_TOLERANCE_MS, f"{outside_ms - total:.0f} ms of the wall time not logged"
    assert re.search(r"process\s+\d+\.\d\d s from start: \w+ \d+\.\d\d s, ", result.stdout)


def test_phase_clock_adds_phases_marked_twice_and_sums_to_its_total() -> None:
    clock = wallclock.PhaseClock(wallclock.now_s())
    for phase in ("imports", "config", "imports", "store"):
        clock.mark(phase)
    metrics = clock.metrics()
    assert list(metrics) == [names.process_metric(p) for p in ("imports", "config", "store")] + [names.PROCESS_TOTAL]
    assert metrics[names.PROCESS_TOTAL] == sum(value for key, value in metrics.items() if key != names.PROCESS_TOTAL)


@pytest.mark.slow  # starts an interpreter
def test_process_start_is_when_this_process_began() -> None:
    """Read in a fresh interpreter that reports the clock at its first line: the start lies before it."""
    code = "import time; now = time.clock_gettime(time.CLOCK_BOOTTIME); from axoexp import wallclock; "
    code += "print(now, wallclock.process_start_s())"
    now, start = map(float, subprocess.check_output([sys.executable, "-c", code], text=True).split())
    assert start <= now + PROCESS_START_TICK_MS / 1000
    assert now - start < 120, "an interpreter starts in far less than two minutes: the start was misread"


def test_console_names_the_total_and_the_biggest_phases() -> None:
    process_ms = {
        names.process_metric("imports"): 5210.0,
        names.process_metric("planning"): 12.0,
        names.process_metric("store"): 2100.0,
        names.process_metric("measure"): 1020.0,
        names.PROCESS_TOTAL: 8342.0,
    }
    assert process_summary(process_ms) == (
        "      8.34 s from start: imports 5.21 s, store 2.10 s, measure 1.02 s (exit not included)"
    )


@pytest.mark.slow  # starts an interpreter
def test_determinism_left_off_does_not_import_inductor_and_on_sets_its_flag() -> None:
    code = """
import sys
from omegaconf import OmegaConf
from axoexp.runtime import configure_determinism
settings = dict(cudnn_benchmark=False, float32_matmul_precision="highest")
configure_determinism(OmegaConf.create({**settings, "deterministic_algorithms": False}))
print("torch._inductor.config" in sys.modules)
configure_determinism(OmegaConf.create({**settings, "deterministic_algorithms": True}))
import torch
from torch._inductor import config
print(torch.are_deterministic_algorithms_enabled(), config.deterministic)
configure_determinism(OmegaConf.create({**settings, "deterministic_algorithms": False}))
print(torch.are_deterministic_algorithms_enabled(), config.deterministic)
"""
    lines = subprocess.check_output([sys.executable, "-c", code], text=True).split("\n")
    assert lines[:3] == ["False", "True True", "False False"]


def test_the_newest_schema_read_from_the_migration_scripts_is_alembics() -> None:
    from mlflow.store.db.utils import _get_latest_schema_revision

    assert latest_schema_revision() == _get_latest_schema_revision()


@pytest.mark.slow  # starts an interpreter
def test_a_cpu_run_plans_and_updates_without_dynamo_or_planning_the_stores_backend(empty_store: Path) -> None:
    """The default CPU run's planning (against an existing store) and updates, in a fresh interpreter:
    the loss is checked on the population built on the CPU (a meta forward imports ``torch._dynamo``),
    the store's schema without SQLAlchemy and Alembic (the store's own thread imports them), the probe
    ends on the meta device, and torch.optim's construction, zero_grad and step leave the compiler
    unimported (``axoexp.executors.optimizer_calls``)."""
    code = f"""
import sys
from hydra import compose, initialize_config_module
from axoexp.config import register_configs
from axoexp.plan import plan_experiment
from axoexp.plugins import load_plugins

registry = load_plugins()
register_configs(registry)
with initialize_config_module(config_module="axoexp.conf", version_base="1.3"):
    overrides = ["executor=eager", "loss=causal_mse", "tracking.uri=sqlite:///{empty_store}"]
    config = compose("config", overrides=overrides)
plan = plan_experiment(config, registry)
modules = "torch._dynamo" in sys.modules, "sqlalchemy" in sys.modules
print(plan.probe.module.behavior_adapter.device, plan.shape, *modules)
setup = plan.build_population()
executor = plan.build_executor(setup.module)
losses = [float(executor.step(*batch)) for batch in setup.batches * 2]
print(losses[-1] < losses[0], "torch._dynamo" in sys.modules)
"""
    output = subprocess.check_output([sys.executable, "-c", code], text=True).split()
    assert output == ["meta", "3x12x4", "False", "False", "True", "False"]


@pytest.mark.parametrize("overrides", [["population.neurons=5"], ["hydra.mode=RUN", "optimizer=sgd"]])
def test_a_single_run_takes_the_config_hydra_composed_to_learn_its_mode(
    loaded_registry: Registry, monkeypatch: pytest.MonkeyPatch, overrides: list[str]
) -> None:
    """Hydra 1.3 composes a run's config in ``get_mode`` and again in ``run``; with ``composed_once``
    ``run`` gets the first, equal to what Hydra composes (its ``hydra.mode=RUN`` override included).
    Fails when a Hydra upgrade makes ``composed_once`` fall back to composing twice."""
    compositions: list[RunMode] = []
    hydras_own = ConfigLoaderImpl._load_configuration_impl

    def counted(self: ConfigLoaderImpl, *args: object, **kwargs: object) -> object:
        compositions.append(kwargs["run_mode"])  # type: ignore[arg-type]
        return hydras_own(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ConfigLoaderImpl, "_load_configuration_impl", counted)
    run_overrides = overrides if "hydra.mode=RUN" in overrides else [*overrides, RUN_MODE_OVERRIDE]
    with initialize_config_module(config_module="axoexp.conf", version_base="1.3"):
        hydra = GlobalHydra.instance().hydra
        assert hydra is not None
        hydras_config = hydra.compose_config("config", list(run_overrides), run_mode=RunMode.RUN)
        compositions.clear()
        with composed_once() as applied:
            assert applied, "this Hydra is not the one axoexp/compose_once.py was written for: it composes twice"
            mode = hydra.get_mode("config", list(overrides))
            kept = hydra.compose_config("config", list(run_overrides), run_mode=RunMode.RUN)
            again = hydra.compose_config("config", list(run_overrides), run_mode=RunMode.RUN)
    assert mode == (RunMode.RUN if "hydra.mode=RUN" in overrides else None)
    assert compositions == [RunMode.RUN, RunMode.RUN], "composed once for the mode and the run, once more on request"
    assert OmegaConf.to_yaml(kept) == OmegaConf.to_yaml(hydras_config)
    assert OmegaConf.to_yaml(again) == OmegaConf.to_yaml(hydras_config)


@pytest.mark.parametrize(
    "overrides, mode",
    [
        (["hydra.mode=MULTIRUN"], RunMode.MULTIRUN),
        (["population.neurons=2,5", "hydra.mode=MULTIRUN"], RunMode.MULTIRUN),
    ],
)
def test_a_config_that_is_no_single_run_gets_hydras_own_mode_and_composition(
    loaded_registry: Registry, overrides: list[str], mode: RunMode
) -> None:
    """A sweep's values fail the run-mode composition, so Hydra's own (multirun) one decides; nothing is kept."""
    with initialize_config_module(config_module="axoexp.conf", version_base="1.3"):
        hydra = GlobalHydra.instance().hydra
        assert hydra is not None
        with composed_once():
            assert hydra.get_mode("config", list(overrides)) == mode
            config = hydra.compose_config("config", list(overrides), run_mode=RunMode.MULTIRUN)
        assert config.hydra.mode == mode


@pytest.mark.slow  # starts a run
def test_a_single_run_composes_once_collects_no_garbage_before_its_work_and_reads_no_git(tmp_path: Path) -> None:
    """The README's command as ``python -m axoexp`` runs it, watched from inside: Hydra composes the config
    once; the collector makes no full collection from the process's start to the run's work, and is on,
    with the start-up's objects frozen, afterwards; MLflow's git tags (which axoexp drops) are not read,
    so GitPython stays unimported. Hydra's files are written as before."""
    code = """
import atexit, gc, sys
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from axoexp import collector
hydras_own, modes, full, held = ConfigLoaderImpl._load_configuration_impl, [], [], []
def counted(self, *args, **kwargs):
    modes.append(str(kwargs["run_mode"]))
    return hydras_own(self, *args, **kwargs)
ConfigLoaderImpl._load_configuration_impl = counted
gc.callbacks.append(lambda phase, info: full.append(1) if phase == "stop" and info["generation"] == 2 else None)
hold, release = collector.hold, collector.release
collector.hold = lambda: (held.append(len(full)), hold())
collector.release = lambda: (held.append(len(full)), release())
atexit.register(lambda: print("compositions", *modes, "git", "git" in sys.modules))
frozen = lambda: gc.get_freeze_count() > 0
atexit.register(lambda: print("full collections held", held[1] - held[0], "on", gc.isenabled(), frozen()))
sys.argv = ["axoexp", "executor=eager", "loss=causal_mse", "run.measured_updates=3"]
from axoexp.cli import main
main()
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-2:] == [
        "full collections held 0 on True True",
        "compositions RunMode.RUN git False",
    ]
    (hydra_dir,) = tmp_path.glob("outputs/*/*/.hydra")
    assert sorted(path.name for path in hydra_dir.iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    assert RUN_MODE_OVERRIDE in OmegaConf.load(hydra_dir / "hydra.yaml").hydra.overrides.hydra


@pytest.mark.slow  # starts a sweep
def test_a_sweep_turns_the_collector_on_again_before_its_first_job(tmp_path: Path) -> None:
    """The command line holds the collector for a sweep's start too; the sweep releases it before any job."""
    code = """
import atexit, gc, sys, traceback
from axoexp import collector
release, callers = collector.release, []
collector.release = lambda: (callers.append(traceback.extract_stack()[-2].name), release())
atexit.register(lambda: print("released by", callers[0], "on", gc.isenabled(), gc.get_freeze_count() > 0))
sys.argv = ["axoexp", "-m", "population.neurons=2", "run.warmup_updates=1", "run.measured_updates=1"]
from axoexp.cli import main
main()
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "released by on_multirun_start on True True"


@pytest.mark.slow  # starts an interpreter
def test_a_process_forked_while_the_collector_is_held_turns_it_on_as_it_begins() -> None:
    """Inductor's compile workers are forked while a run plans: they do not inherit the hold."""
    code = """
import gc, os
from axoexp import collector
collector.hold()
child = os.fork()
if child == 0:
    print("child", gc.isenabled(), gc.get_freeze_count() > 0, flush=True)
    os._exit(0)
os.waitpid(child, 0)
print("parent", gc.isenabled())
collector.release()
print("parent", gc.isenabled())
"""
    output = subprocess.check_output([sys.executable, "-c", code], text=True).splitlines()
    assert output == ["child True True", "parent False", "parent True"]


def test_the_collector_is_left_as_it_was_where_the_command_line_did_not_hold_it() -> None:
    """A run started from Python (or a sweep's job) releases nothing: the collector stays on, nothing is frozen."""
    frozen = gc.get_freeze_count()
    collector.release()
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen


@pytest.mark.slow  # starts an interpreter
def test_a_sweep_value_without_multirun_is_refused_in_one_line_as_before(tmp_path: Path) -> None:
    """The run-mode composition fails on it, Hydra's own path runs and refuses it (exit 2, no store)."""
    result = run_cli("population.neurons=2,5", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "axoexp: population.neurons=2,5: several values outside a sweep; to sweep over them add -m (--multirun), "
        "for a list write population.neurons=[2,5], for a string quote it inside the shell's quotes: "
        "\"population.neurons='2,5'\""
    ]
    assert not (tmp_path / "mlflow.db").exists()
