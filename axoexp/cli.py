"""``python -m axoexp``: the Hydra application. It dispatches; the work lives elsewhere.

A user error (a bad name, value or type, an unreachable store) is printed as one line
starting with ``axoexp:``, without a traceback: exit status 2 for a config that cannot
run, 1 otherwise (and 1 for a sweep in which a job failed). ``HYDRA_FULL_ERROR=1`` shows
the full traceback instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from hydra.types import RunMode
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from axoexp.config import describe, register_configs
from axoexp.errors import AxoexpError, ConfigError, shown
from axoexp.plugins import load_plugins
from axoexp.signals import Interrupted

DESCRIBE_FLAG = "--describe"
FULL_ERROR_ENV = "HYDRA_FULL_ERROR"
CONFIG_ERRORS = (ConfigCompositionException, OverrideParseException, OmegaConfBaseException)
_tracebacks_wanted = os.environ.get(FULL_ERROR_ENV) == "1"  # the user's own setting, read before ours


@hydra.main(version_base="1.3", config_path="pkg://axoexp.conf", config_name="config")
def hydra_app(config: DictConfig) -> float | None:
    """Run one experiment; Hydra's multirun calls this once per job."""
    from axoexp import describe as describe_run
    from axoexp import sweep
    from axoexp.console import format_result
    from axoexp.experiment import run_experiment
    from axoexp.progress import run_observers

    load_plugins()  # a no-op here; in a launcher's worker process the registry starts empty
    hydra_config = HydraConfig.get()
    job_name = run_name = None
    if hydra_config.mode == RunMode.MULTIRUN:
        job_name = hydra_config.job.override_dirname or "defaults"
        run_name = describe_run.job_run_name(config, hydra_config.job.num, hydra_config.overrides.task)
        previous = sweep.reused_run(config, hydra_config.job.num)
        if previous is not None:
            print(
                f"reused {job_name}: FINISHED as MLflow run {previous.info.run_id} "
                f"'{previous.info.run_name}' (sweep.resume=false re-measures)",
                flush=True,
            )
            return None
    try:
        in_this_terminal = hydra_config.mode != RunMode.MULTIRUN or "BasicLauncher" in hydra_config.launcher._target_
        result = run_experiment(
            config,
            Path(hydra_config.runtime.output_dir),
            run_name=run_name,
            observers=run_observers(config.run.progress, in_this_terminal),
        )
    except AxoexpError as error:
        if hydra_config.mode == RunMode.MULTIRUN:
            if isinstance(error, ConfigError):  # it made no run: the parent records why
                sweep.note_refused_job(config, hydra_config.job.num, job_name or "", error)
            raise  # the sweep records the failed job and goes on
        if _tracebacks_wanted:
            raise
        _exit_with(str(error), error.exit_code)
    print(format_result(result), flush=True)
    return result.update.median


def main() -> None:
    """Load plugins first, so their components are config options, then run Hydra."""
    help_wanted = any(argument in ("--help", "-h", DESCRIBE_FLAG) for argument in sys.argv[1:])
    try:  # help still works with a broken plugin, naming it
        registry = load_plugins(on_error=_warn_broken_plugin if help_wanted else None)
    except AxoexpError as error:
        if _tracebacks_wanted:
            raise
        _exit_with(str(error), error.exit_code)
    register_configs(registry)
    if DESCRIBE_FLAG in sys.argv[1:]:
        print(describe(registry))
        return
    os.environ[FULL_ERROR_ENV] = "1"  # Hydra then raises instead of printing; we report below
    try:
        hydra_app()
    except Interrupted as interrupted:  # the run ended KILLED with what was measured
        _exit_with(
            f"{interrupted}; what was measured is logged (see the journal in the output directory)",
            interrupted.exit_code,
        )
    except (AxoexpError, *CONFIG_ERRORS) as error:
        if _tracebacks_wanted:
            raise
        multirun = any(argument in ("-m", "--multirun") for argument in sys.argv[1:])
        if isinstance(error, AxoexpError):
            _exit_with(str(error), 1 if multirun else error.exit_code)
        _exit_with(one_line(error), 1 if multirun else 2)
    except OSError as error:  # Hydra creating the output folder or writing its files there
        if _tracebacks_wanted:
            raise
        _exit_with(
            f"cannot write {shown(str(error.filename))}: {error.strerror or error}; choose a writable output "
            "folder (hydra.run.dir=DIR, or hydra.sweep.dir=DIR with -m)",
            2,
        )


def one_line(error: BaseException) -> str:
    """A Hydra or OmegaConf composition error as one line: key, value and what is expected."""
    if isinstance(error, MissingConfigException) and error.missing_cfg_file and error.options is not None:
        group, _, option = error.missing_cfg_file.rpartition("/")
        return f"{group}={option}: no such option; valid {group} options: {', '.join(sorted(error.options))}"
    cause = error.__cause__
    text = str(error).strip().splitlines()[0].removeprefix("Error merging override ")
    if isinstance(cause, OmegaConfBaseException):
        detail = (getattr(cause, "msg", None) or str(cause)).strip().splitlines()[0]
        return f"{text}: {detail}"
    if isinstance(error, OmegaConfBaseException):
        key = getattr(error, "full_key", None)
        return f"{key}: {text}" if key else text
    return text


def _warn_broken_plugin(error: AxoexpError) -> None:
    print(f"axoexp: {error} (its options are missing below)", file=sys.stderr)


def _exit_with(message: str, status: int) -> NoReturn:
    print(f"axoexp: {message}", file=sys.stderr)
    sys.exit(status)


if __name__ == "__main__":
    main()
