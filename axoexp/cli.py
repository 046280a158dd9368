"""``python -m axoexp``: the Hydra application. It dispatches; the work lives elsewhere.

A user error (a bad name, value or type, an unreachable store) is printed as one line
starting with ``axoexp:``, without a traceback: exit status 2 for a config that cannot
run, 1 otherwise (and 1 for a sweep in which a job failed). ``HYDRA_FULL_ERROR=1`` shows
the full traceback instead.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import signal
import sys
import threading
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import hydra
from hydra.conf import HydraConf
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException, OverrideParseException
from hydra.types import RunMode
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from axoexp import collector, names, signals, targets, wallclock
from axoexp.compose_once import composed_once
from axoexp.config import describe, did_you_mean, one_line, register_configs, unchosen_group
from axoexp.errors import (
    AxoexpError,
    ConfigError,
    RefusedTargetError,
    TrackingUnavailableError,
    first_line,
    quiet_store_errors,
    shown,
)
from axoexp.outputs import remove_unused_run_dir, run_dir_given
from axoexp.plugins import load_plugins
from axoexp.redact import hide_passwords_in_logs
from axoexp.signals import Interrupted
from axoexp.stdout import WithoutHydrasJobLine, flush_out, print_out, reader_gone, say

if TYPE_CHECKING:
    from axoexp.plan import Plan

DESCRIBE_FLAG = "--describe"
VERSION_FLAG = "--version"
MULTIRUN_FLAGS = ("-m", "--multirun")
INFO_FLAGS = ("--info", "-i")  # Hydra logs these through a handler of its own, not hydra_logging's
HYDRA_PRINTS = ("--help", "-h", "--hydra-help", "--cfg", "-c", *INFO_FLAGS)  # Hydra prints them itself
FULL_ERROR_ENV = "HYDRA_FULL_ERROR"
USERS_FULL_ERROR_ENV = "AXOEXP_USERS_HYDRA_FULL_ERROR"
"""The user's own ``HYDRA_FULL_ERROR``, kept for the sweep's worker processes, which inherit ours."""
CONFIG_ERRORS = (ConfigCompositionException, OverrideParseException, OmegaConfBaseException)
HYDRA_ONE_COMMAND = "Only one of --run, --multirun, --cfg"  # Hydra's ValueError for -m with --cfg, say
_tracebacks_wanted = os.environ.get(USERS_FULL_ERROR_ENV, os.environ.get(FULL_ERROR_ENV)) == "1"


@hydra.main(version_base="1.3", config_path="pkg://axoexp.conf", config_name="config")
def hydra_app(config: DictConfig) -> float | None:
    """Run one experiment; Hydra's multirun calls this once per job, each in a process of its own."""
    wallclock.mark("config")
    hide_passwords_in_logs()  # a no-op here; a launcher's worker process starts without it
    load_plugins()  # likewise: in a launcher's worker process the registry starts empty
    if not _tracebacks_wanted:
        quiet_store_errors()  # likewise: a spawned worker (Hydra's joblib, submitit, ray) has no filters yet
    hydra_config = HydraConfig.get()
    if hydra_config.mode != RunMode.MULTIRUN:
        return _experiment(config, hydra_config)
    from axoexp import sweep
    from axoexp.job_process import run_isolated

    job_number, job_name = hydra_config.job.num, names.job_label(hydra_config.overrides.task)
    output_dir = Path(hydra_config.runtime.output_dir)
    try:
        return run_isolated(
            lambda: _experiment(config, hydra_config),
            lambda pid, how: sweep.end_killed_job(config, job_number, job_name, output_dir, pid, how),
        )
    except ConfigError as error:  # the sweep's end lists each refused job, with why
        sweep.note_refusal(error)
        raise
    finally:  # the job's phases ended in its forked process: the next job's count from here
        wallclock.take_phases()


def _experiment(config: DictConfig, hydra_config: HydraConf) -> float | None:
    """One run (or, in a sweep, one job): print its result, return its median update time."""
    from axoexp import describe as describe_run
    from axoexp import sweep
    from axoexp.console import format_result
    from axoexp.experiment import run_experiment
    from axoexp.progress import run_observers
    from axoexp.targets import check_targets

    wallclock.mark("imports")
    if signals.interrupted_outside_a_run() and hydra_config.mode != RunMode.MULTIRUN:
        raise KeyboardInterrupt  # caught by a library as modules imported: no run starts after it
    job_name = run_name = on_planned = None
    if hydra_config.mode == RunMode.MULTIRUN:
        job_name = names.job_label(hydra_config.overrides.task)
        job_number, overrides = hydra_config.job.num, list(hydra_config.overrides.task)
        run_name = lambda plan: describe_run.job_run_name(plan, job_number, overrides)  # noqa: E731
        resume = sweep.resume_job(config, hydra_config.job.num)
        if resume.run is not None:
            print_out(
                f"reused {job_name}: FINISHED as MLflow run {resume.run.info.run_id} "
                f"'{resume.run.info.run_name}' (sweep.resume=false re-measures)"
            )
            return None
        if resume.remeasure_reason:  # said and recorded once planning accepts the job: a refused job says only why
            line = f"measuring {job_name}: {resume.remeasure_reason}"

            def say_and_record(plan: Plan) -> None:
                print_out(line)
                sweep.note_remeasured_job(config, job_number, resume.remeasure_reason)

            on_planned = say_and_record

    try:
        refused = check_targets(config)  # this job's sweep values (Hydra's config was checked before instantiating)
        if refused:
            raise ConfigError(refused)
        in_this_terminal = hydra_config.mode != RunMode.MULTIRUN or hydra_config.launcher._target_.endswith(
            names.BASIC_LAUNCHER
        )
        result = run_experiment(
            config,
            Path(hydra_config.runtime.output_dir),
            run_name=run_name,
            observers=run_observers(config.run.progress, in_this_terminal),
            on_planned=on_planned,
        )
    except KeyboardInterrupt as interrupt:  # before the run began (planning, the build), or its end, KILLED
        if hydra_config.mode != RunMode.MULTIRUN and _no_run_began(interrupt):
            _remove_unused_folder(hydra_config)
        raise
    except AxoexpError as error:
        wallclock.take_phases()  # a failed job's phases are not the next job's
        if isinstance(error, TrackingUnavailableError) and error.result is not None:
            print_out(format_result(error.result))  # measured whole: the store's fault does not take it away
        if hydra_config.mode == RunMode.MULTIRUN:
            if isinstance(error, ConfigError):  # it made no run: the parent records why
                sweep.note_refused_job(config, hydra_config.job.num, job_name or "", error)
            raise  # the sweep records the failed job and goes on
        if isinstance(error, ConfigError):
            _remove_unused_folder(hydra_config)
        if _tracebacks_wanted:
            raise
        _exit_with(str(error), error.exit_code)
    print_out(format_result(result))
    return result.update.median


def _no_run_began(interrupt: KeyboardInterrupt) -> bool:
    """Whether a stop signal came before the run existed: before its own handlers (Ctrl-C's own
    ``KeyboardInterrupt``), or as it began (:data:`~axoexp.journal.NO_RUN_YET`)."""
    from axoexp.journal import NO_RUN_YET

    return not isinstance(interrupt, Interrupted) or interrupt.run_outcome == NO_RUN_YET


def _remove_unused_folder(hydra_config: HydraConf) -> None:
    """Remove a single run's output folder where it began no run (:func:`remove_unused_run_dir`),
    unless the user named it (``hydra.run.dir``) or asked for debug lines (``hydra.verbose``),
    which its log holds and the terminal did not show."""
    if not run_dir_given(hydra_config) and not hydra_config.verbose:
        remove_unused_run_dir(Path(hydra_config.runtime.output_dir))


def main() -> None:
    """Load plugins first, so their components are config options, then run Hydra. Ctrl-C or SIGTERM
    before a run's signal handlers are in place (imports, composition, planning) is one line, exit
    130 or 143."""
    hide_passwords_in_logs()  # also as the console script `axoexp`, which python -m's run_command does not start
    try:
        _main()
    except KeyboardInterrupt:
        if _tracebacks_wanted:
            raise
        _exit_with(*signals.outside_a_run())
    except Exception:
        if not signals.interrupted_outside_a_run() or _tracebacks_wanted:
            raise
        _exit_with(*signals.outside_a_run())  # an import the interrupt broke, a library caught it


def _main() -> None:
    signals.watch_outside_a_run(signal.SIGTERM)  # a scheduler's, until a run's own handlers
    wallclock.start_process_clock()
    collector.hold()  # until the run's work begins, or the sweep's (collector.release)
    multirun = any(argument in MULTIRUN_FLAGS for argument in sys.argv[1:])
    help_wanted = any(argument in ("--help", "-h", DESCRIBE_FLAG) for argument in sys.argv[1:])
    unknown = _unknown_option([argument for argument in sys.argv[1:] if argument != VERSION_FLAG])  # Hydra's prints
    if unknown:
        _exit_with(unknown, 2)
    if VERSION_FLAG in sys.argv[1:]:  # Hydra's own would print only "Hydra 1.3.x"
        from axoexp.versions import versions_line

        print_out(versions_line())
        return
    try:  # help still works with a broken plugin, naming it
        registry = load_plugins(on_error=_warn_broken_plugin if help_wanted else None)
    except AxoexpError as error:
        if _tracebacks_wanted:
            raise
        _exit_with(str(error), error.exit_code)
    register_configs(registry)
    unchosen = unchosen_group(sys.argv[1:], registry)
    if unchosen:
        _exit_with(unchosen, 2)
    wallclock.mark("imports")
    if DESCRIBE_FLAG in sys.argv[1:]:
        others = [argument for argument in sys.argv[1:] if argument != DESCRIBE_FLAG]
        if others:  # it printed every option and exited 0, as if they were read
            dropped = " ".join(others)
            _exit_with(f"{DESCRIBE_FLAG} lists every group's options and reads nothing else; drop {dropped}", 2)
        print_out(describe(registry))
        return
    os.environ[USERS_FULL_ERROR_ENV] = "1" if _tracebacks_wanted else "0"  # for the sweep's spawned workers
    os.environ[FULL_ERROR_ENV] = "1"  # Hydra then raises instead of printing; we report below
    targets.install()
    if not _tracebacks_wanted:
        quiet_store_errors()
    if any(argument.partition("=")[0] in INFO_FLAGS for argument in sys.argv[1:]):  # --info, --info=config
        logging.raiseExceptions = False  # Hydra's plain handler: no "Logging error" per line once | head has gone
    sys.stderr = WithoutHydrasJobLine(sys.stderr)  # Hydra writes its failed-job line there
    try:
        with nullcontext() if multirun else composed_once():
            hydra_app()
        _exit_without_teardown()
    except BrokenPipeError:  # Hydra's print of --help or --cfg, its reader gone (| head); axoexp's own never raise it
        if not any(argument in HYDRA_PRINTS for argument in sys.argv[1:]):
            raise  # a run's own (a plugin's pipe): not stdout's reader
        reader_gone(sys.stdout)
        _exit_without_teardown()
    except Interrupted as interrupted:  # the run ended KILLED with what was measured
        _exit_with(f"{interrupted}; {interrupted.run_outcome}", interrupted.exit_code)
    except (AxoexpError, *CONFIG_ERRORS) as error:
        line = _sweep_failed(error) if multirun else None  # noted for the sweep's parent, shown or not
        if _tracebacks_wanted:
            raise
        if isinstance(error, AxoexpError):  # in a sweep, a job's error (but a refusal before any job)
            status = 1 if multirun and not isinstance(error, RefusedTargetError) else error.exit_code
            if multirun and line is None and _sweep_lists_refusal(error):
                sys.exit(status)  # the sweep's end lists the refused job, with why
            _exit_with(line or str(error), status)
        composing = isinstance(error, ConfigCompositionException | OverrideParseException)  # before any job ran
        _exit_with(one_line(error), 1 if multirun and not composing else 2)
    except ValueError as error:
        if not str(error).startswith(HYDRA_ONE_COMMAND):
            _exit_if_launcher_failed(error, multirun)
        if _tracebacks_wanted:
            raise
        _exit_with(
            f"{str(error).replace('--shell_completion', '--shell-completion')}; give one (to print a sweep's "
            "config: --cfg job without -m)",
            2,
        )
    except OSError as error:  # Hydra creating the output folder or writing its files there; a launcher's cluster
        line = _sweep_failed(error) if multirun else None
        if _tracebacks_wanted:
            raise
        if line:
            _exit_with(line, 1)
        if error.filename is None:  # no file: e.g. a launcher's connection
            _exit_with(first_line(error), 1)
        _exit_with(
            f"cannot write {shown(str(error.filename))}: {error.strerror or error}; choose a writable output "
            "folder (hydra.run.dir=DIR, or hydra.sweep.dir=DIR with -m)",
            2,
        )
    except Exception as error:
        _exit_if_launcher_failed(error, multirun)


def _exit_if_launcher_failed(error: Exception, multirun: bool) -> NoReturn:
    """A launcher's failure (sbatch refused the jobs) is the sweep's one line, exit 1; anything else
    (a bug's) is raised again, with its traceback. Call it where ``error`` is being handled."""
    line = _sweep_failed(error) if multirun else None
    if line is None or _tracebacks_wanted:
        raise error
    _exit_with(line, 1)


def _exit_without_teardown() -> NoReturn:
    """End the process as ``sys.exit(0)`` would, less the interpreter's teardown of every module and
    object (seconds with torch, dynamo, MLflow and SQLAlchemy loaded): threads are waited for, exit
    handlers run (logging, a sweep's parent run, MLflow's own) and the streams are flushed first.
    Ctrl-C is ignored from here on: the work is done and logged, and a KeyboardInterrupt would only
    break one exit handler off halfway, with a traceback (SIGTERM still ends the process at once)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the watcher's KeyboardInterrupt inside an exit handler
    threading._shutdown()  # type: ignore[attr-defined]  # as the interpreter does before the handlers
    atexit._run_exitfuncs()
    flush_out()
    sys.stderr.flush()
    os._exit(0)


def _unknown_option(arguments: list[str]) -> str | None:
    """``--bogus: no such option ...; options: ...`` for a ``-`` argument neither Hydra nor axoexp reads.
    Hydra's argument parser said so in a dozen lines of usage under the name ``__main__.py``; its
    parser, named as the command is typed, still says what else it finds wrong (``--cfg bogus``)."""
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()
    parser.prog, parser.allow_abbrev = "python -m axoexp", False  # --vers would be Hydra's --version
    parser.add_argument(DESCRIBE_FLAG, action="store_true")
    parser.exit_on_error = False  # its one line, not a dozen of usage
    try:
        _, unknown = parser.parse_known_args(arguments)
    except argparse.ArgumentError as error:  # --cfg=bogus, --cfg without a value
        return f"{error.argument_name}: {error.message}"
    options = sorted(option for option in parser._option_string_actions if option.startswith("--"))
    for argument in unknown:
        if argument.startswith("-"):
            option = argument.partition("=")[0]
            return (
                f"{option}: no such option{did_you_mean(option, options)}; options: {', '.join(options)} "
                "(and overrides, key=value: python -m axoexp --help lists them)"
            )
    return None


def _sweep_failed(error: BaseException) -> str | None:
    """:func:`axoexp.sweep.failed`: the sweep's module is imported only by a sweep."""
    from axoexp import sweep

    return sweep.failed(error)


def _sweep_lists_refusal(error: BaseException) -> bool:
    """:func:`axoexp.sweep.lists_refusal`, the sweep's module imported only by a sweep."""
    from axoexp import sweep

    return sweep.lists_refusal(error)


def _warn_broken_plugin(error: AxoexpError) -> None:
    say("axoexp", f"{error} (its options are missing below)")


def _exit_with(message: str, status: int) -> NoReturn:
    """``axoexp: MESSAGE`` on stderr and exit ``status``; after a signal outside a run, also one that
    something caught (:func:`~axoexp.signals.interrupted_outside_a_run`), the signal's line instead:
    the error is the signal's doing (an import it broke halfway), not the user's; not once a sweep
    began, whose runs exist and whose own line says how it ended."""
    sweep = sys.modules.get("axoexp.sweep")  # imported only by a sweep
    if signals.interrupted_outside_a_run() and not (sweep is not None and sweep.began()):  # a sweep's runs exist
        message, status = signals.outside_a_run()
    say("axoexp", message)
    sys.exit(status)


if __name__ == "__main__":
    main()
