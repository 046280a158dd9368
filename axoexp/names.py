"""The names axoexp logs under, one vocabulary for the runs, the report, the sweep and the tests.

MLflow's own names are spelled here rather than imported, because importing MLflow costs
over a second and the modules that name things (executors, plans) must load fast for
``--help``; tests/test_names.py checks them against MLflow's constants. Metrics are
milliseconds unless named otherwise.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

# --- MLflow's own (checked against mlflow.utils.mlflow_tags and mlflow.environment_variables)
PARENT_RUN_ID = "mlflow.parentRunId"
HTTP_MAX_RETRIES_ENV = "MLFLOW_HTTP_REQUEST_MAX_RETRIES"
HTTP_TIMEOUT_ENV = "MLFLOW_HTTP_REQUEST_TIMEOUT"
HTTP_BACKOFF_FACTOR_ENV = "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"
HTTP_BACKOFF_JITTER_ENV = "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER"
HTTP_MAX_RETRIES, HTTP_TIMEOUT_S, HTTP_BACKOFF_FACTOR = 2, 10, 1
"""The defaults of tracking.http_max_retries, http_timeout_s and http_backoff_factor: a dead
server fails in seconds, not MLflow's minutes (also for commands without a run config)."""
ARTIFACTS_PROGRESS_BAR_ENV = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
SOURCE_NAME = "mlflow.source.name"
SOURCE_GIT_COMMIT = "mlflow.source.git.commit"
MLFLOW_GIT_PREFIX = "mlflow.source.git."
DATASET_CONTEXT = "mlflow.data.context"
WORKLOAD_CONTEXT = "training"  # the workload is what the adaptation updates train on
# The MLflow UI opens an experiment in the view its kind names; this one is the training view
# (runs, metrics, charts), not the GenAI view (traces). MLflow has no constant for either.
EXPERIMENT_KIND = "mlflow.experimentKind"
EXPERIMENT_KIND_TRAINING = "custom_model_development"
# A runs-table view the MLflow UI opens from a link (...?viewStateShareKey=axoexp): MLflow keeps
# shared views in experiment tags under this prefix.
SHARED_VIEW_PREFIX = "mlflow.sharedViewState."
RUNS_VIEW = "axoexp"

# --- Hydra's launchers a sweep may run under, by class name (axoexp.sweep_plan)
SLURM_LAUNCHER, RAY_LAUNCHER = "SlurmLauncher", "RayLauncher"
"""The launchers that start jobs on a cluster: submitit's SLURM one and Ray's."""
POOL_LAUNCHER = "hydra_plugins.axoexp_parallel_launcher."
"""The package of axoexp's own launcher (``hydra/launcher=parallel``)."""
BASIC_LAUNCHER = "BasicLauncher"
"""Hydra's default launcher: each job in this process, one after another (axoexp forks each)."""
JOBLIB_LAUNCHER = "JoblibLauncher"
"""joblib's: the jobs in a pool of worker processes (``hydra.launcher.n_jobs``; -1: one per CPU)."""
LOCAL_LAUNCHERS = (BASIC_LAUNCHER, JOBLIB_LAUNCHER, "LocalLauncher")
"""Launchers whose jobs run on this machine: Hydra's own, joblib's, submitit's local executor; and
axoexp's (:data:`POOL_LAUNCHER`)."""

# --- tags: run status and bookkeeping
FAILURE = "axoexp.failure"
PARTIAL = "axoexp.partial"
CONFIG_HASH = "axoexp.config_hash"
SWEEP_ROLE = "axoexp.sweep"  # "parent" on a sweep's parent run
SWEEP_DEFINITION = "axoexp.sweep_definition"  # on a parent: SHA-256 of its jobs' configs (else overrides)
REUSED_PREFIX = "axoexp.reused."  # on a parent: axoexp.reused.jobN = the earlier run job N reused
REFUSED_PREFIX = "axoexp.refused."  # on a parent: axoexp.refused.jobN = why job N made no run
REMEASURED_PREFIX = "axoexp.remeasured."  # on a parent: axoexp.remeasured.jobN = why job N, once planned, reused no run
DIED_PREFIX = "axoexp.died."  # on a parent: axoexp.died.jobN = how job N's process died, what became of its run
OUTPUT_DIR = "output_dir"
PROCESS_PID = "process.pid"
COMMAND = "command"
DATE = "date"  # UTC, ISO 8601, in a benchmark's provenance
SEED = "seed"
SWEEP_DIR = "sweep.dir"
SWEEP_OVERRIDES = "sweep.overrides"
HOSTNAME = "hostname"
PROCESS_START = "process.start"  # the process's start time (psutil create_time), against pid reuse
RESULT_KEY = "axoexp.result_key"  # what determines a result: config, code, plugins, versions, device
CODE_HASH = "code.sha256"  # SHA-256 of axoexp's own source files as they ran
PLUGINS_HASH = "code.plugins_sha256"  # SHA-256 of the plugin files the run's components come from
CODE_FILES = "code.files"  # path=sha256[:12] of each of those files: which one changed between runs
JOURNAL = "axoexp.journal"  # path of the run's local journal
JOURNAL_ID = "axoexp.journal_id"  # the journal's id: how a sync finds the run again
JOURNAL_LOST = "axoexp.journal_lost"  # why the local journal stopped (e.g. disk full); MLflow has the run
TRACKING_LOST = "axoexp.tracking_lost"  # why the store stopped answering mid-run; the journal has the rest
SYNCED = "axoexp.synced"  # set by python -m axoexp.sync when it completed the run from a journal
NON_FINITE_UPDATE = "axoexp.non_finite_update"  # the first update whose loss or parameters were not finite

# --- tags: the adapted banks, the run's result (axoexp.banks)
BANKS_ARTIFACT = "banks.artifact"  # the artifact holding them, e.g. banks.safetensors
BANKS_SHA256 = "banks.sha256"  # SHA-256 of that file: what population.init_from_sha256 pins
BANKS_SHAPES = "banks.shapes"  # name=shape of each bank saved, e.g. behavior_adapter=(3, 44)
BANKS_UPDATES = "banks.updates"  # adaptation updates (warm-up and measured) the saved banks went through
BANKS_INIT_FROM = "banks.init_from"  # population.init_from as given: the run or file the run started from
BANKS_INIT_SHA256 = "banks.init_sha256"  # SHA-256 of the banks file the run started from

# --- tags: an Optuna search (hydra/sweeper=optuna, axoexp.search)
STUDY = "axoexp.study"  # on the search's parent run: the Optuna study's name
STUDY_STORAGE = "axoexp.study.storage"  # on the parent: the study's RDB URL (a rerun resumes it)
STUDY_OBJECTIVES = "axoexp.study.objectives"  # on the parent: metric:direction,... in the study's order
TRIAL = "axoexp.trial"  # on a trial's run: its Optuna trial number
TRIAL_STATE = "axoexp.trial.state"  # what Optuna was told: COMPLETE or FAIL
TRIAL_FAILURE = "axoexp.trial.failure"  # why the trial was told FAIL (a failed run, contention, no metric)
TRIAL_PARAM_PREFIX = "axoexp.trial.param."  # axoexp.trial.param.<key> = the value the sampler chose
SWEEP_TRIAL_PARAM = "sweep.trial"  # the config key the sweeper sets on each trial's job


def trial_param_tag(key: str) -> str:
    """The tag holding a trial's sampled value of ``key``, e.g. ``axoexp.trial.param.optimizer.lr``."""
    return f"{TRIAL_PARAM_PREFIX}{key}"


# --- tags: what ran
SHAPE = "shape"  # one stream's (population x time x channels), e.g. 64x256x32 (see shape_label)
STREAMS = "workload.streams"  # independent streams per update (B); batches are (B, population, time, channels)
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
COMPILE_CACHE = "compile.cache"  # cold | warm | in-process: where the compiled graphs came from
COMPILE_CACHE_DIR = "compile.cache_dir"
FUSED_LOSS = "fused.loss"  # kernel | torch: where fused_cudagraph computed the loss and its gradient
FUSED_FRONT = "fused.front"  # kernel | torch: where fused_cudagraph computed the tokens, the cache and their gradients
FUSED_STEP = "fused.step"  # kernel | torch | torch: why: fused_cudagraph's gradient transform and optimizer step
FUSED_GRADIENTS = (
    "fused.gradients"  # kernel | autograd | autograd: why: who added the banks' gradients in fused_cudagraph
)

# --- tags: the code, the versions and the hardware a result belongs to (axoexp.metadata)
GIT_COMMIT = "git.commit"
GIT_DIRTY = "git.dirty"
GIT_ROOT = "git.root"
GIT_DIFF_SHA256 = "git.diff_sha256"
DEVICE = "device"  # cpu, cuda:0
CPU_MODEL = "cpu"  # the CPU's model name, e.g. AMD EPYC 9654 96-Core Processor (not x86_64)
PLATFORM = "platform"
GPU_NAME = "gpu.name"
GPU_CAPABILITY = "gpu.capability"
GPU_MEMORY_GIB = "gpu.memory_gib"
GPU_DRIVER = "gpu.driver"
CUDA_AVAILABLE = "cuda.available"
VERSION_PREFIX = "version."


def version_tag(package: str) -> str:
    """The tag holding ``package``'s version, e.g. ``version.torch``."""
    return f"{VERSION_PREFIX}{package}"


def determinism_tag(flag: str) -> str:
    return f"determinism.{flag}"


# --- tags: the device lease a run held while it built, timed and verified (axoexp.lease)
LEASE_DEVICE = "lease.device"  # "cuda:0 GPU-<uuid>", or "cpu"
LEASE_CPUS = "lease.cpus"  # the CPUs the run was pinned to, e.g. "0,1" ("" when not pinned)
LEASE_WAITED_S = "lease.waited_s"  # seconds it waited for the lease
LEASE_ACQUIRED_AT = "lease.acquired_at"  # Unix time the lease was taken
LEASE_RELEASED_AT = "lease.released_at"  # Unix time it was given back


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
# Series: one value per update, warm-up included (step = update index). Their own section in the
# MLflow UI's charts ("per_update/"), so no one reads the last sample as the run's latency.
UPDATE_SERIES = "per_update/latency_ms"
LOSS_SERIES = "per_update/loss"
FIRST_UPDATE = "first_update_ms"
MEASURED_COMPLETED = "measured_updates_completed"
LOSS_INITIAL = "loss_initial"
LOSS_FINAL = "loss_final"
# the loss on held-out batches (never adapted on), before the first update and after the last
EVAL_LOSS_BEFORE = "eval_loss_before"
EVAL_LOSS_AFTER = "eval_loss_after"
UPDATE_STATS = ("count", "median", "p10", "p90", "mean", "min", "max", "rel_iqr")


def update_metric(stat: str) -> str:
    """The steady-state summary statistic ``stat`` of the measured updates, e.g. ``update_ms_median``."""
    return f"update_ms_{stat}"


UPDATE_MEDIAN = update_metric("median")
UNITLESS_STATS = ("count", "rel_iqr")  # of a latency summary: a count, and IQR / median (a ratio)


def is_milliseconds(metric: str) -> bool:
    """Whether ``metric`` is a duration in milliseconds: ``..._ms`` (``capture_ms``,
    ``per_update/latency_ms``) or a statistic ``..._ms_<stat>`` but a count or a ratio:
    ``update_ms_rel_iqr`` is IQR / median, whatever its name says."""
    _, statistic, stat = metric.rpartition("_ms_")
    return metric.endswith("_ms") or (bool(statistic) and stat not in UNITLESS_STATS)


STREAMS_PER_S = "streams_per_s"  # streams x updates per second: B * 1000 / update_ms_median


def phase_metric(phase: str) -> str:
    """A one-off phase's duration, e.g. ``capture_ms``."""
    return f"{phase}_ms"


CAPTURE = phase_metric("capture")


def bucket_phase(bucket: int) -> str:
    """The capture of one length bucket's graph, e.g. ``capture_bucket_64`` (its metric ``capture_bucket_64_ms``)."""
    return f"capture_bucket_{bucket}"


def bucket_update_metric(bucket: int, stat: str) -> str:
    """``stat`` of the measured updates whose batches fell in one length bucket, e.g. ``bucket_64_update_ms_median``
    (an eager run's buckets are its exact lengths)."""
    return f"bucket_{bucket}_{update_metric(stat)}"


def bucket_verify_metric(bucket: int, name: str) -> str:
    """One bucket's parity with exact-length eager updates, e.g. ``bucket_64_verify_max_abs_param_diff``."""
    return f"bucket_{bucket}_{name}"


_BUCKET_UPDATE = re.compile(r"bucket_(\d+)_update_ms_(\w+)")


def bucket_update_stat(metric: str) -> tuple[int, str] | None:
    """The bucket and statistic a :func:`bucket_update_metric` name spells, e.g. ``(64, "median")``, else ``None``."""
    match = _BUCKET_UPDATE.fullmatch(metric)
    return (int(match.group(1)), match.group(2)) if match else None


LENGTH_BUCKETS = "lengths.buckets"
"""Tag of a run whose batches' lengths differ: the buckets its executor padded them to (``32,48,64``), or
``exact`` where every batch ran at its own length (eager)."""
LENGTH_BUCKETS_EXACT = "exact"
RECAPTURES = "recaptures"
"""Graphs a capturing executor captured after ``prepare`` (warm-up and measured updates): 0 in the steady state."""
GRAPH_POOL_BYTES = "graph_pool_bytes"
"""Device memory the bucket graphs' shared pool reserved during capture."""
PADDING_OVERHEAD = "padding_overhead"
"""Padded steps over real steps of the measured updates (1.0: no padding)."""


# A single run's wall time from its process's start (axoexp.wallclock), in the order the phases happen:
# interpreter and imports; Hydra composing the config; planning; CUDA initialisation; the run's start
# (store opened in the background meanwhile, run created, its params and tags); lease, population and
# executor build; prepare; warm-up and measured updates; verify; the final logging.
PROCESS_PHASES = (
    "imports",
    "config",
    "planning",
    "cuda_init",
    "store",
    "build",
    "prepare",
    "measure",
    "verify",
    "logging",
)


def process_metric(phase: str) -> str:
    """The wall time of one phase of the run's process, e.g. ``process_imports_ms``."""
    return f"process_{phase}_ms"


PROCESS_TOTAL = process_metric("total")  # process start to the end of the final logging (exit not included)

# --- params
EXECUTOR_PARAM_PREFIX = "executor."
# where results go and how a run is watched, not what was measured
SWEEP_PREFIX = "sweep."  # the sweep's own settings and what it gives each job (parent run, repeat, trial)
NOT_MEASUREMENT_PARAM_PREFIXES = ("tracking.", SWEEP_PREFIX, "run.progress")


def is_bookkeeping(override: str) -> bool:
    """Whether an override (``key=value``, ``+key=...``, ``~key``) sets where results go or how a run is
    watched (:data:`NOT_MEASUREMENT_PARAM_PREFIXES`), not what it measures."""
    return override.lstrip("+~").startswith(NOT_MEASUREMENT_PARAM_PREFIXES)


def unescaped(override: str) -> str:
    """An override as its user wrote it: without the backslashes Hydra puts before a sweep value's
    special characters (``lengths=uniform\\:16\\:40`` -> ``lengths=uniform:16:40``)."""
    return re.sub(r"\\(.)", r"\1", override)


def job_label(overrides: Iterable[str]) -> str:
    """The one spelling of a sweep's job in its lines and its parent's tags: the job's overrides as
    Hydra hands them on, unescaped (:func:`unescaped`) and space-separated, less the sweep's own
    (:data:`SWEEP_PREFIX`: its parent run, the repeat, the trial), so that a job's repeats share it;
    ``defaults`` where none is left."""
    shown = [unescaped(item) for item in overrides if not item.lstrip("+~").startswith(SWEEP_PREFIX)]
    return " ".join(shown) or "defaults"


def shape_label(*dims: object) -> str:
    """The one spelling of a population's shape, one stream's input dimensions joined by ``x``:
    (population, time, channels), e.g. ``64x256x32``; batches of several lengths give their range of
    time steps, ``3x17..39x4``."""
    return "x".join(map(str, dims))


def shape_size(label: str) -> int:
    """The product of a :func:`shape_label`'s dimensions, a range by its upper end (``3x17..39x4``), for
    ordering (0 if unreadable)."""
    parts = [part.split("..")[-1] for part in label.split("x")]
    return math.prod(int(part) for part in parts) if all(part.isdigit() for part in parts) else 0


# --- timing you can defend: threads, device clock, contention, noise, repeats
RUN_THREADS_PARAM = "run.threads"  # logged resolved (the config's null means "auto")
RUNTIME_THREADS = "runtime.threads"  # how run.threads was chosen
RUNTIME_CPU_AFFINITY = "runtime.cpu_affinity"  # the CPUs this process may run on, e.g. 0-15


def threads_calibration_metric(threads: int) -> str:
    """The mean update time calibration measured with ``threads`` threads (``run.threads=null`` on the CPU)."""
    return f"threads_calibration/{threads}_threads_mean_ms"


TIMING_DEVICE_CLOCK = "timing.device_clock"  # what update_device_ms covers (CUDA runs only)
TIMING_CONTENTION = "timing.contention"  # "none" or a comma list: cpu, gpu-shared, gpu-throttled
TIMING_CONTENTION_DETAIL = "timing.contention.detail"  # what was seen, per window
TIMING_NOISE = "timing.noise"  # "low" or "high" (NOISE_SPREAD above axoexp.statistics.NOISE_THRESHOLD)
TIMING_ADAPTIVE = "timing.adaptive"  # why run.min_time_s stopped measuring
SWEEP_REPEAT_PARAM = "sweep.repeat"
UPDATE_DEVICE_SERIES = "update_device_ms"  # CUDA-event time of every update (step = update index)
UPDATE_REL_IQR = update_metric("rel_iqr")  # IQR / median of the measured updates
NOISE_SPREAD = "noise_spread"
"""What ``timing.noise`` judges (:func:`axoexp.statistics.noise_spread`): the IQR of each measured update's
latency over the time expected of its length (its bucket's median, or the line of time against length where
the bucket holds too few updates); ``update_ms_rel_iqr`` where every batch has one length."""
HOST_OVERHEAD_MEDIAN = "host_overhead_ms_median"  # median over measured updates of host - device time


DEVICE_STATS = ("median", "p10", "p90")
"""The statistics of the device clock a run logs (:func:`device_metric`)."""


def device_metric(stat: str) -> str:
    """A statistic of the measured updates' device clock, e.g. ``update_device_ms_median``."""
    return f"update_device_ms_{stat}"


def contention_metric(window: str, figure: str) -> str:
    """A contention figure of one window, e.g. ``contention_measured_cpu_other``."""
    return f"contention_{window}_{figure}"


def system_metric(figure: str) -> str:
    """A system figure under MLflow's own prefix, so the UI's system-metrics tab shows it."""
    return f"system/{figure}"


# --- every metric a run may log (what a search's objective may name)
METRIC_FAMILIES = ("bucket_", "contention_", "verify_", "threads_calibration/", "system/")
"""Prefixes of the metrics whose names depend on the run (its length buckets, timing windows, thread
counts, MLflow's system metrics), and of the executor's parity check."""
DURATION_SUFFIX = "_ms"
"""What every duration ends in, among them each one-off phase an executor times (``capture_ms``, a plugin's too)."""


def fixed_metrics() -> list[str]:
    """The metrics axoexp's runs log under names fixed up front: besides them, a run logs only
    metrics of :data:`METRIC_FAMILIES` and durations (:data:`DURATION_SUFFIX`)."""
    return [
        *(update_metric(stat) for stat in UPDATE_STATS),
        *(device_metric(stat) for stat in DEVICE_STATS),
        HOST_OVERHEAD_MEDIAN,
        NOISE_SPREAD,
        FIRST_UPDATE,
        MEASURED_COMPLETED,
        STREAMS_PER_S,
        LOSS_INITIAL,
        LOSS_FINAL,
        EVAL_LOSS_BEFORE,
        EVAL_LOSS_AFTER,
        RECAPTURES,
        GRAPH_POOL_BYTES,
        PADDING_OVERHEAD,
        CAPTURE,
        *(process_metric(phase) for phase in PROCESS_PHASES),
        PROCESS_TOTAL,
        UPDATE_SERIES,
        LOSS_SERIES,
        UPDATE_DEVICE_SERIES,
    ]


def may_be_logged(metric: str) -> bool:
    """Whether an axoexp run may log ``metric`` (:func:`fixed_metrics`, a family, a duration); a
    plugin's executor may log others (``Executor.prepared_metrics``)."""
    return metric in fixed_metrics() or metric.startswith(METRIC_FAMILIES) or metric.endswith(DURATION_SUFFIX)
