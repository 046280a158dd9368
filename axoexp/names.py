"""The names axoexp logs under, one vocabulary for the runs, the report, the sweep and the tests.

MLflow's own names come from MLflow's constants. Metrics are milliseconds unless named otherwise.
"""

from __future__ import annotations

from mlflow.environment_variables import (
    MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR, MLFLOW_HTTP_REQUEST_BACKOFF_JITTER, MLFLOW_HTTP_REQUEST_MAX_RETRIES,
    MLFLOW_HTTP_REQUEST_TIMEOUT,
)
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

# --- tags: MLflow's
PARENT_RUN_ID = MLFLOW_PARENT_RUN_ID
HTTP_MAX_RETRIES_ENV = MLFLOW_HTTP_REQUEST_MAX_RETRIES.name
HTTP_TIMEOUT_ENV = MLFLOW_HTTP_REQUEST_TIMEOUT.name
HTTP_BACKOFF_FACTOR_ENV = MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR.name
HTTP_BACKOFF_JITTER_ENV = MLFLOW_HTTP_REQUEST_BACKOFF_JITTER.name

# --- tags: run status and bookkeeping
FAILURE = "axoexp.failure"
PARTIAL = "axoexp.partial"
CONFIG_HASH = "axoexp.config_hash"
SWEEP_ROLE = "axoexp.sweep"  # "parent" on a sweep's parent run
REUSED_PREFIX = "axoexp.reused."  # on a parent: axoexp.reused.jobN = the earlier run job N reused
REFUSED_PREFIX = "axoexp.refused."  # on a parent: axoexp.refused.jobN = why job N made no run
OUTPUT_DIR = "output_dir"
PROCESS_PID = "process.pid"
COMMAND = "command"
SEED = "seed"
SWEEP_DIR = "sweep.dir"
SWEEP_OVERRIDES = "sweep.overrides"
HOSTNAME = "hostname"
PROCESS_START = "process.start"  # the process's start time in clock ticks since boot (Linux), against pid reuse
RESULT_KEY = "axoexp.result_key"  # what determines a result: config, code, plugins, versions, device
CODE_HASH = "code.sha256"  # SHA-256 of axoexp's own source files as they ran
PLUGINS_HASH = "code.plugins_sha256"  # SHA-256 of every loaded plugin file
JOURNAL = "axoexp.journal"  # path of the run's local journal
JOURNAL_ID = "axoexp.journal_id"  # the journal's id: how a sync finds the run again
JOURNAL_LOST = "axoexp.journal_lost"  # why the local journal stopped (e.g. disk full); MLflow has the run
TRACKING_LOST = "axoexp.tracking_lost"  # why the store stopped answering mid-run; the journal has the rest
SYNCED = "axoexp.synced"  # set by python -m axoexp.sync when it completed the run from a journal
NON_FINITE_UPDATE = "axoexp.non_finite_update"  # the first update whose loss or parameters were not finite

# --- tags: what ran
SHAPE = "shape"  # neurons x time_steps x contacts, e.g. 64x256x32 (see shape_label)
SHAPE_INPUTS = "shape.inputs"
SHAPE_TARGETS = "shape.targets"
DTYPE_INPUTS = "dtype.inputs"
DTYPE_PARAMETERS = "dtype.parameters"
DEVICE_RESOLVED = "device.resolved"
OPTIMIZER_CAPTURABLE = "optimizer.capturable"
TIMING_CLOCK = "timing.clock"
TIMING_UPDATE_INCLUDES = "timing.update.includes"
TIMING_UPDATE_EXCLUDES = "timing.update.excludes"
TIMING_UPDATE_INPUTS = "timing.update.inputs"


def component_tag(group: str) -> str:
    """The tag holding the option chosen for ``group``, e.g. ``component.executor``."""
    return f"component.{group}"


def component_source_tag(group: str) -> str:
    """Where that option came from: ``builtin``, a plugin file or an entry point."""
    return f"component.{group}.source"


def bank_tag(bank: str) -> str:
    return f"bank.{bank}"


def population_tag(key: str) -> str:
    return f"population.{key}"


def timing_includes_tag(phase: str) -> str:
    """What a one-off phase (``capture``, ``compile``) includes."""
    return f"timing.{phase}.includes"


# --- metrics
UPDATE_SERIES = "update_ms"  # one value per update, warm-up included (step = update index)
LOSS_SERIES = "loss"
FIRST_UPDATE = "first_update_ms"
MEASURED_COMPLETED = "measured_updates_completed"
LOSS_INITIAL = "loss_initial"
LOSS_FINAL = "loss_final"
UPDATE_STATS = ("count", "median", "p10", "p90", "mean", "min", "max")


def update_metric(stat: str) -> str:
    """The steady-state summary statistic ``stat`` of the measured updates, e.g. ``update_ms_median``."""
    return f"update_ms_{stat}"


UPDATE_MEDIAN = update_metric("median")


def phase_metric(phase: str) -> str:
    """A one-off phase's duration, e.g. ``capture_ms``."""
    return f"{phase}_ms"


CAPTURE = phase_metric("capture")

# --- params
EXECUTOR_PARAM_PREFIX = "executor."
NOT_MEASUREMENT_PARAM_PREFIXES = ("tracking.", "sweep.")  # where results go, not what was measured


def shape_label(neurons: object, time_steps: object, contacts: object) -> str:
    """The one spelling of a population shape: ``neurons x time_steps x contacts``."""
    return f"{neurons}x{time_steps}x{contacts}"


def shape_size(label: str) -> int:
    """Neurons x time steps x contacts of a :func:`shape_label`, for ordering (0 if unreadable)."""
    parts = label.split("x")
    return int(parts[0]) * int(parts[1]) * int(parts[2]) if len(parts) == 3 and all(p.isdigit() for p in parts) else 0
