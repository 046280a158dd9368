"""``python -m axoexp`` in fresh processes, as a user runs it: every command of this module
starts at once (module fixture ``ran``), each in a folder of its own, and each test reads its own."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from helpers import REPO, gone_reader, interrupted, run_clis, start_python, wait_for
from mlflow.tracking import MlflowClient

from axoexp import names
from axoexp.lease import LEASE_DIR_ENV

pytestmark = pytest.mark.slow  # every test here starts processes

USER_ERRORS = [  # (the overrides, space-separated; the one line printed)
    (
        "population.neurons=abc",
        "population.neurons=abc: Value 'abc' of type 'str' could not be converted to Integer",
    ),
    (
        "population.neurons=3.5",
        "population.neurons=3.5: Value '3.5' of type 'float' could not be converted to Integer",
    ),
    ("optimizer.lr=abc", "optimizer.lr=abc: Value 'abc' of type 'str' could not be converted to Float"),
    (
        "optimzer=adam",
        "optimzer: no such key (did you mean optimizer?); top-level keys: population, loss, optimizer, "
        "gradient_transform, executor, device, dtype, seed, run, verify, determinism, tracking, sweep",
    ),
    (
        "optimizer.lrr=0.1",
        "optimizer.lrr: no such key in optimizer=adam (did you mean lr?); its keys: capturable, lr, beta1, beta2, "
        "eps, weight_decay",
    ),
    ("population.neurons=0", "invalid experiment config: population.neurons=0: must be at least 1"),
    (
        "population.time_steps=4",
        "invalid experiment config: population.time_steps=4: AxoSim-Lite's first 4 outputs are warm-up, with no "
        "gradient to adapt on, so an update needs more than 4 time steps; use population.time_steps=5 or more",
    ),
    (  # the loss's own warm-up is shorter than the population's: planned, then a traceback, before
        "loss.warmup_steps=1 population.time_steps=3",
        "invalid experiment config: population.time_steps=3: AxoSim-Lite's first 4 outputs are warm-up, with no "
        "gradient to adapt on, so an update needs more than 4 time steps; use population.time_steps=5 or more",
    ),
    (
        "executor=cudagrph",
        "executor=cudagrph: no such option (did you mean cudagraph?); valid executor options: compiled_cudagraph, "
        "cudagraph, eager, fused_cudagraph, reduce_overhead, regional_cudagraph",
    ),
    ("optimizer=zz", "optimizer=zz: no such option; valid optimizer options: adam, adamw, sgd"),
    (  # a group that --help lists, but the config chooses none of by default
        "experiment=eager_cpu",
        "experiment=eager_cpu: the config chooses no experiment by default, so none can be overridden; add one: "
        "+experiment=eager_cpu",
    ),
    ("loss=null", "loss=null: every run needs a loss option; valid loss options: causal_mse, huber, mse"),
    (
        "population.neurons=3,64",
        "population.neurons=3,64: several values outside a sweep; to sweep over them add -m (--multirun), for a list "
        "write population.neurons=[3,64], for a string quote it inside the shell's quotes: "
        "\"population.neurons='3,64'\"",
    ),
    (
        "population.lengths=[64,128",
        "population.lengths=[64,128: not an override Hydra can read (no viable alternative at input '[64,128'); "
        "write key=value, a list as key=[a,b], a string with , [ ] = or spaces quoted inside the shell's quotes: "
        "\"key='a,b'\"",
    ),
    (
        "+population.neurons=5",
        "+population.neurons: the config has population.neurons already; drop the + to set it (a + adds a key the "
        "config lacks)",
    ),
    (
        "--multi-run population.neurons=2,5",
        "--multi-run: no such option (did you mean --multirun?); options: --cfg, --config-dir, --config-name, "
        "--config-path, --describe, --experimental-rerun, --help, --hydra-help, --info, --multirun, --package, "
        "--resolve, --run, --shell-completion, --version (and overrides, key=value: python -m axoexp --help lists "
        "them)",
    ),
    (
        "--version --multi-run",  # refused, not the version printed and the rest ignored
        "--multi-run: no such option (did you mean --multirun?); options: --cfg, --config-dir, --config-name, "
        "--config-path, --describe, --experimental-rerun, --help, --hydra-help, --info, --multirun, --package, "
        "--resolve, --run, --shell-completion, --version (and overrides, key=value: python -m axoexp --help lists "
        "them)",
    ),
    (
        "--vers",  # argparse's abbreviation of Hydra's --version printed "Hydra 1.3.8"
        "--vers: no such option (did you mean --version?); options: --cfg, --config-dir, --config-name, "
        "--config-path, --describe, --experimental-rerun, --help, --hydra-help, --info, --multirun, --package, "
        "--resolve, --run, --shell-completion, --version (and overrides, key=value: python -m axoexp --help lists "
        "them)",
    ),
    ("--cfg=bogus", "--cfg/-c: invalid choice: 'bogus' (choose from 'job', 'hydra', 'all')"),  # was usage
    (
        "--describe loss=nonexist",
        "--describe lists every group's options and reads nothing else; drop loss=nonexist",
    ),
    (
        "-m --cfg job",
        "Only one of --run, --multirun, --cfg, --info and --shell-completion can be specified; give one (to print "
        "a sweep's config: --cfg job without -m)",
    ),
]
COMMANDS = {  # a name: the command's arguments
    "default": ("executor=eager", "loss=causal_mse"),
    "cudagraph on cpu": ("executor=cudagraph", "device=cpu"),
    "help": ("--help",),
    "multirun": ("-m", "population.neurons=2,5", "run.measured_updates=3"),
    "shipped plugin": ("loss=log_cosh", "run.measured_updates=3"),
    "describe": ("--describe",),
    "no logging": ("hydra/job_logging=disabled", "hydra/hydra_logging=disabled", "run.measured_updates=3"),
    "refused into a named folder": ("population.neurons=0", "hydra.run.dir=mine"),
    "version": ("--version",),
    **{overrides: tuple(overrides.split(" ")) for overrides, _ in USER_ERRORS},
}


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[subprocess.CompletedProcess[str], Path]]:
    """What each of ``COMMANDS`` printed and the folder it ran in: they share nothing, so they
    run side by side."""
    folders = {name: tmp_path_factory.mktemp("cli") for name in COMMANDS}
    (folders["shipped plugin"] / "plugins").symlink_to(REPO / "plugins")
    results = run_clis([(arguments, folders[name], None) for name, arguments in COMMANDS.items()])
    return {name: (result, folders[name]) for name, result in zip(COMMANDS, results, strict=True)}


LOG_ON_STDERR = (
    "hydra.hydra_logging.handlers.console.stream=ext://sys.stderr",
    "hydra.job_logging.handlers.console.stream=ext://sys.stderr",
)
READER_GONE = {  # a name: the command's arguments, run with stdout a pipe whose reader has gone (| head -0)
    "run": ("run.measured_updates=3",),  # its log's first line meets the closed pipe
    "sweep": ("-m", "population.neurons=2,3", "run.measured_updates=3", *LOG_ON_STDERR),  # each job's summary does
    "parallel sweep": ("-m", "hydra/launcher=parallel", "population.neurons=2,3", "run.measured_updates=3"),
    "info": ("--info",),  # Hydra logs it through a plain handler of its own
}


@pytest.fixture(scope="module")
def reader_gone(
    tmp_path_factory: pytest.TempPathFactory, empty_store: Path
) -> dict[str, tuple[CompletedProcess, list]]:
    """How each of ``READER_GONE`` ended and the runs it left: all at once, each in a folder of its own
    with a copy of the empty store and its own leases (else each waits for the CPU another holds)."""
    folders = {name: tmp_path_factory.mktemp("gone") for name in READER_GONE}
    for folder in folders.values():
        shutil.copyfile(empty_store, folder / "mlflow.db")
    with gone_reader() as stdout:
        calls = [
            (arguments, folders[name], {LEASE_DIR_ENV: str(folders[name] / "leases")})
            for name, arguments in READER_GONE.items()
        ]
        results = run_clis(calls, stdout=stdout)
    found = {}
    for (name, folder), result in zip(folders.items(), results, strict=True):
        client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
        experiment = client.get_experiment_by_name("axoexp")
        found[name] = result, client.search_runs([experiment.experiment_id]) if experiment else []
    return found


def test_a_run_whose_reader_has_gone_logs_everything_and_exits_0(reader_gone) -> None:
    """``python -m axoexp | head -2``: the reader gone is no fault. The run printed a ``--- Logging
    error ---`` and a call stack for each later log line, then "cannot write 'None': Broken pipe;
    choose a writable output folder", exit 2; now it says nothing and exits 0."""
    result, (run,) = reader_gone["run"]
    assert (result.returncode, result.stderr) == (0, "")
    assert run.info.status == "FINISHED" and run.data.metrics[names.update_metric("count")] == 3


def test_info_whose_reader_has_gone_exits_0_without_logging_errors(reader_gone) -> None:
    """``python -m axoexp --info | head -2`` printed a ``--- Logging error ---`` and a call stack
    for each of Hydra's later lines."""
    result, runs = reader_gone["info"]
    assert (result.returncode, result.stderr, runs) == (0, "", [])


@pytest.mark.parametrize("sweep", ["sweep", "parallel sweep"])
def test_a_sweep_whose_reader_has_gone_runs_every_job_and_exits_0(reader_gone, sweep: str) -> None:
    """``python -m axoexp -m ... | head -1``, with the basic launcher (its log on stderr: each job's
    process meets the closed pipe with its summary, the sweep's with its last line) and with the
    parallel one (its log on stdout, the sweep's process and its worker meet it)."""
    result, runs = reader_gone[sweep]
    assert result.returncode == 0, result.stderr
    assert all(line.startswith("[") for line in result.stderr.splitlines()), f"its log lines alone: {result.stderr}"
    parents = [run for run in runs if run.data.tags.get(names.SWEEP_ROLE) == "parent"]
    jobs = [run for run in runs if run not in parents]
    assert [run.info.status for run in runs] == ["FINISHED"] * 3 and len(parents) == 1
    assert sorted(run.data.params["population.neurons"] for run in jobs) == ["2", "3"]
    assert all(run.data.metrics[names.update_metric("count")] == 3 for run in jobs)


def test_default_command_prints_timings_and_logs_to_mlflow_db_in_cwd(ran) -> None:
    result, folder = ran["default"]
    assert result.returncode == 0, result.stderr
    assert re.search(r"update\s+\d+\.\d+ ms\s+median of 50\s+\(p10 ", result.stdout)
    run_id = re.search(r"mlflow run\s+([0-9a-f]{32})", result.stdout).group(1)
    assert (folder / "mlflow.db").is_file()
    assert "mlflow.store.db.utils" not in result.stderr, "MLflow's own lines as it creates the store's tables"
    run = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}").get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["loss.name"] == "causal_mse"
    shown = re.search(r"update\s+(\S+) ms\s+median of 50\s+\(p10 (\S+), p90 (\S+), mean (\S+)\)", result.stdout)
    logged = [run.data.metrics[names.update_metric(stat)] for stat in ("median", "p10", "p90", "mean")]
    assert list(shown.groups()) == [f"{value:.3f}" for value in logged], "the digits the report shows of MLflow's"
    assert (Path(run.data.tags["output_dir"]) / "result.json").is_file()
    job_log = (Path(run.data.tags["output_dir"]) / "axoexp.log").read_text()
    for phase in ("prepare (compile, capture): done in ", "warm-up: 5 updates in ", "measured: 50 updates in "):
        assert phase in job_log and phase in result.stdout
    assert "\x1b[" not in result.stdout + result.stderr, "no colour codes or progress bar when not a terminal"


def test_cudagraph_on_cpu_exits_at_once_suggesting_eager(ran) -> None:
    result, folder = ran["cudagraph on cpu"]
    assert result.returncode == 2
    assert "executor=cudagraph needs CUDA, but device=cpu" in result.stderr
    assert "use executor=eager" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (folder / "mlflow.db").exists()
    assert not [path for path in folder.rglob("*") if path.is_file()], "a refused run leaves no folder of its own"


def test_help_lists_every_group_and_option(ran) -> None:
    result, _ = ran["help"]
    assert result.returncode == 0
    for line in (
        "executor: compiled_cudagraph, cudagraph, eager, fused_cudagraph, reduce_overhead, regional_cudagraph",
        "gradient_transform: clip_norm, clip_value, none",
        "loss: causal_mse, huber, mse",
        "optimizer: adam, adamw, sgd",
        "population: lite",
    ):
        assert line in result.stdout


def test_multirun_sweeps_shapes_into_separate_runs(ran) -> None:
    result, folder = ran["multirun"]
    assert result.returncode == 0, result.stderr
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    runs = client.search_runs(
        [client.get_experiment_by_name("axoexp").experiment_id], filter_string=f"tags.`{names.PARENT_RUN_ID}` != ''"
    )
    assert sorted(run.data.tags[names.SHAPE_INPUTS] for run in runs) == ["(2, 12, 4)", "(5, 12, 4)"]
    assert all(run.info.status == "FINISHED" for run in runs)


def test_shipped_example_plugin_is_found_in_plugins_of_the_cwd(ran) -> None:
    result, _ = ran["shipped plugin"]
    assert result.returncode == 0, result.stderr
    assert "mlflow run" in result.stdout


@pytest.mark.parametrize("overrides, message", USER_ERRORS)
def test_user_errors_exit_2_with_one_line_and_no_run(ran, overrides: str, message: str) -> None:
    result, folder = ran[overrides]
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"axoexp: {message}"], result.stderr
    assert "Traceback" not in result.stderr
    assert not (folder / "mlflow.db").exists()
    assert not [path for path in folder.rglob("*") if path.is_file()], "a refused run leaves no folder of its own"


def test_version_names_axoexp_and_its_stack(ran) -> None:
    result, _ = ran["version"]
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(
        r"axoexp \S+ \(axosim \S+, torch \S+, .*hydra-core 1\.3\.\S+, .*python 3\.\S+\)\n", result.stdout
    )


def test_a_refused_run_keeps_a_folder_the_command_line_named(ran) -> None:
    """The folder is the user's (hydra.run.dir=DIR): Hydra's record of the job stays in it."""
    result, folder = ran["refused into a named folder"]
    assert result.returncode == 2
    assert (folder / "mine" / ".hydra" / "overrides.yaml").is_file()


def test_hydras_own_logging_options_replace_axoexps_whole(ran) -> None:
    """hydra/job_logging=disabled: no log lines, no axoexp.log (axoexp's handler settings, merged into
    Hydra's option, made it fail: "Unable to configure handler 'file'"); the summary still prints."""
    result, folder = ran["no logging"]
    assert result.returncode == 0, result.stderr
    assert "MLflow run" not in result.stdout and "update " in result.stdout
    assert not list(folder.rglob("axoexp.log")) and list(folder.rglob("journal.jsonl"))


def test_describe_explains_every_key_with_type_default_and_help(ran) -> None:
    result, _ = ran["describe"]
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(
        re.fullmatch(r"\s+run\.measured_updates\s+int\s+50\s+updates in the steady-state summary.*", line)
        for line in lines
    )
    assert any(re.fullmatch(r"\s+optimizer\.lr\s+float\s+0\.001\s+learning rate", line) for line in lines)
    assert any(
        re.fullmatch(r"\s+optimizer\.capturable\s+auto\|bool\s+auto\s+auto: true exactly when .*", line)
        for line in lines
    )


SLOW_IMPORT = """
import pathlib, time
pathlib.Path("importing").touch()
time.sleep(120)
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_before_a_run_is_one_line(tmp_path: Path, signum: int) -> None:
    """SIGINT or SIGTERM (a scheduler's, which killed the process without a line) while a plugin
    imports, before any run's signal handlers: one line, exit 130 or 143, no store. SIGINT's
    default is restored in the child, as a terminal's Ctrl-C finds it (a shell's background job
    would inherit it ignored). The signal waits for the plugin's import to begin: one at a set
    time could land before any guard exists (the interpreter's start and the package's import, a
    tenth of a second when idle, far longer on a loaded machine)."""
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "slow_import.py").write_text(SLOW_IMPORT)
    process = start_python(["-m", "axoexp"], tmp_path)
    stderr = interrupted(process, lambda: wait_for(tmp_path / "importing"), signum)
    name = signal.Signals(signum).name
    assert process.returncode == 128 + signum, stderr
    assert stderr.strip().splitlines() == [f"axoexp: interrupted ({name}) outside a run: no run was left unfinished"]
    assert not (tmp_path / "mlflow.db").exists()


SLOW_PLANNING = """
import logging, pathlib, time
from axoexp import component
from axoexp.components.losses import causal_mse

@component("loss", "slow_to_build")
def slow_to_build(*, warmup_steps: int = 4):
    logging.getLogger(__name__).info("slow_to_build: building")  # the log holds a line, as a long planning's
    pathlib.Path("planning").touch()
    time.sleep(120)
    return causal_mse(warmup_steps=warmup_steps)
"""


@pytest.mark.parametrize("verbose", [False, True])
def test_a_run_stopped_while_planning_leaves_no_folder_unless_its_debug_lines_were_asked_for(
    tmp_path: Path, verbose: bool
) -> None:
    """Ctrl-C while planning (a long one logs its progress) left the run's output folder: its log was
    not empty, and the interrupt was not a refusal. No run began: the folder goes, as a refused
    run's does, unless hydra.verbose asked for debug lines, which the log alone holds."""
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "slow_to_build.py").write_text(SLOW_PLANNING)
    args = ["-m", "axoexp", "loss=slow_to_build", *(["hydra.verbose=true"] if verbose else [])]
    process = start_python(args, tmp_path)
    stderr = interrupted(process, lambda: wait_for(tmp_path / "planning"))
    assert process.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == "axoexp: interrupted (SIGINT) outside a run: no run was left unfinished"
    logs = list((tmp_path / "outputs").rglob("axoexp.log"))
    assert [log.read_text().count("slow_to_build: building") for log in logs] == ([1] if verbose else [])
    assert not (tmp_path / "mlflow.db").exists()


SWALLOWING_IMPORT = """
import os, signal, time
try:  # as a library may, halfway through its own imports: the interrupt is caught, and gone
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
except KeyboardInterrupt:
    pass
"""


@pytest.mark.parametrize("overrides", [["run.measured_updates=1"], ["-m", "run.measured_updates=1,2"]])
def test_ctrl_c_that_a_plugin_catches_as_it_imports_still_stops_the_command(
    tmp_path: Path, overrides: list[str]
) -> None:
    """A Ctrl-C caught by library code as modules import (which breaks them halfway: a later import
    then fails with 'partially initialized module', which the command reported as a refused
    config, exit 2) ran the whole experiment, or the whole sweep, and exited 0. It is the
    interrupt's line, exit 130, and no run starts, nor a sweep's parent."""
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "swallowing.py").write_text(SWALLOWING_IMPORT)
    process = start_python(["-m", "axoexp", *overrides], tmp_path)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == "axoexp: interrupted (SIGINT) outside a run: no run was left unfinished"
    assert not (tmp_path / "mlflow.db").exists()


def test_the_ctrl_c_handler_is_reached_before_any_other_module_of_axoexp_imports() -> None:
    """What ``python -m axoexp`` imports before :func:`~axoexp.signals.run_command` catches Ctrl-C:
    the package, and the signals module with its names and the log lines' redaction (re and logging
    only); a SIGINT there is a traceback. The
    registry and the plugin loader (entry points) once took it to 60 ms."""
    listed = "import sys, axoexp.signals; print(*sorted(m for m in sys.modules if m.split('.')[0] == 'axoexp'))"
    imported = subprocess.run(
        [sys.executable, "-c", listed],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert imported == ["axoexp", "axoexp.names", "axoexp.redact", "axoexp.signals"]  # redact: the log lines
