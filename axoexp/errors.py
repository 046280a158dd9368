"""The errors axoexp reports to its users; each one's message names what to change."""

from __future__ import annotations

import logging
from typing import Any

from axoexp.redact import redacted

STORE_LOGGER = "mlflow.store.db.utils"
"""MLflow's logger that prints a traceback of each database error before raising it."""


def shown(path: str, limit: int = 200) -> str:
    """A path as a message shows it: quoted, and cut to ``limit`` characters if longer."""
    return repr(path) if len(path) <= limit else f"{path[:limit]!r}... ({len(path)} characters)"


MAX_REASON = 300
"""Characters of an error's first line that a message quotes; a longer one is cut at a word."""


def first_line(error: BaseException, typed: bool = True) -> str:
    """An error as one short line, any URI's password hidden: the first line of its message, cut at a
    word past :data:`MAX_REASON` characters, after its type where ``typed`` (its type alone where it
    has no message)."""
    text = redacted(error).strip()
    if not text:
        return type(error).__name__
    line = text.splitlines()[0]
    if len(line) > MAX_REASON:
        line = f"{line[:MAX_REASON].rsplit(' ', 1)[0]} ..."
    return f"{type(error).__name__}: {line}" if typed else line


class AxoexpError(Exception):
    """A problem the user can fix; the CLI prints its message, without a traceback."""

    exit_code = 1


class ConfigError(AxoexpError, ValueError):
    """A config that cannot run; the message lists every problem found (key, value, choices)."""

    exit_code = 2


class RegistryError(AxoexpError, LookupError):
    """An unknown group or component name, a duplicate, or a factory that breaks its group's rules."""

    exit_code = 2


class PluginLoadError(AxoexpError, ImportError):
    """A plugin file or entry point that failed to import, or a named plugins directory that is missing."""

    exit_code = 2


class CheckpointError(AxoexpError, ValueError):
    """A checkpoint that is missing, of the wrong kind, fails its pinned SHA-256, or needs
    arbitrary unpickling without a pin."""

    exit_code = 2


class IncompatibleComponentsError(AxoexpError, ValueError):
    """Components that cannot work together, found only once built (planning refuses what it can see)."""


class VerificationError(AxoexpError):
    """An executor's updates differ from eager ones by more than the tolerance."""


class TrackingUnavailableError(AxoexpError):
    """The tracking store could not be reached; what was measured is in the output dir, and in ``result``
    where the run measured all it was to."""

    result: Any = None  # the run's axoexp.experiment.ExperimentResult, for its summary (a higher layer)


class StoreError(AxoexpError):
    """The MLflow store cannot be used: a damaged or half-built sqlite file, or one that could
    not be created (e.g. its disk is full). The message names the file and what to do."""


class UnusableStoreError(StoreError):
    """A store the report and compare refuse to read, as a run refuses it: damaged, half-built, of an
    older schema, a file store, a file that is no MLflow store, or a database without its driver
    (:func:`axoexp.tracking.store_problem` names what to do)."""

    exit_code = 2


class StoreLockedError(StoreError):
    """Another process holds the sqlite store locked for longer than a write takes: the store is
    healthy and the config fine; retry once that process is done with it."""


class SweepRefusedError(ConfigError):
    """A sweep that cannot start: its launcher cannot run here, or no job passed planning; no run exists."""


class NoSweepError(AxoexpError):
    """The report found no sweep to report on (none yet, or ``--parent`` names no run)."""

    exit_code = 2


class ContentionError(AxoexpError):
    """``run.require_quiet=true`` and something competed for the machine while the run was timed."""


class LeaseError(AxoexpError):
    """A device cannot be leased at all: no such GPU, more CPUs than the process may use, no lock directory."""


class LeaseTimeoutError(LeaseError):
    """Another job held the device for longer than ``run.lease_timeout_s``."""


class NonFiniteResultError(AxoexpError):
    """An update produced a non-finite loss or parameter: the run's results are invalid."""


class BanksError(AxoexpError, ValueError):
    """``population.init_from`` names banks that cannot start this run: no such file or run, not a
    banks file, another population kind, other shapes or dtypes, or a SHA-256 other than the pin."""

    exit_code = 2


class JobExitedError(AxoexpError):
    """A sweep's job called ``sys.exit`` (a plugin's code, say): the job fails, the sweep goes on."""


class JobKilledError(AxoexpError):
    """A sweep's job process died of a signal; its run was ended KILLED from its journal."""


class RefusedTargetError(ConfigError):
    """The composed config names a ``_target_`` (a class to instantiate) that axoexp does not ship."""


class ReportError(AxoexpError):
    """``python -m axoexp.report`` cannot write where ``--out`` says: refused before it prints."""

    exit_code = 2


class ReportWriteError(AxoexpError):
    """``python -m axoexp.report`` could not write a file it began (a full disk): the same command may
    work later (exit 1)."""


class ComparisonError(AxoexpError):
    """``python -m axoexp.compare`` was given runs it cannot compare, or a bad option."""

    exit_code = 2


class SearchError(AxoexpError):
    """An Optuna search (``hydra/sweeper=optuna``) in which trials failed; the study keeps them as FAIL."""


class _RaisedStoreErrors(logging.Filter):
    """Drops MLflow's traceback of a database error it raises again (as an ``MlflowException``):
    axoexp reports that error itself, in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.exc_info is None


def quiet_store_errors() -> None:
    """Keep MLflow's SQLAlchemy store from printing a traceback of each database error it raises
    (a locked store, a full disk): for the command lines, whose own line names the cause."""
    logger = logging.getLogger(STORE_LOGGER)
    if not any(isinstance(existing, _RaisedStoreErrors) for existing in logger.filters):
        logger.addFilter(_RaisedStoreErrors())
