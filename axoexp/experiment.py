"""One experiment, start to end: plan, set up torch, open the MLflow run, measure, verify, log."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from axoexp import collector, describe, metadata, names, signals, wallclock
from axoexp.banks import SavedBanks, UpdateCount, eval_loss, keep_banks
from axoexp.contention import ContentionGuard
from axoexp.errors import TrackingUnavailableError
from axoexp.guard import FiniteGuard
from axoexp.interfaces import RunLog, length_range
from axoexp.journal import JournaledLog, journaled_run
from axoexp.lease import device_lease
from axoexp.measure import length_metrics, length_tags, measure_updates
from axoexp.outputs import HYDRA_DIR, write_atomically
from axoexp.plan import Plan, plan_experiment
from axoexp.progress import noted_if_slow
from axoexp.redact import hide_passwords_in_logs
from axoexp.registry import REGISTRY, Registry
from axoexp.runtime import configure_determinism, configure_threads
from axoexp.statistics import LatencySummary
from axoexp.tracking import StoreOpening, configure_tracking, flatten, store_failure
from axoexp.verification import Verification, bucket_metrics, verify_buckets, verify_parity
from axoexp.windows import PREPARE, VERIFY, Observer, window

RESULT_FILE = "result.json"

log = logging.getLogger(__name__)


@dataclass
class ExperimentResult:
    """What a finished experiment measured, and where it was logged."""

    run_id: str
    tracking_uri: str
    experiment: str
    prepare_ms: dict[str, float]
    update: LatencySummary
    warmup_ms: list[float]
    losses: list[float]
    description: dict[str, Any]
    noise_spread: float  # what tag timing.noise judged: IQR / median, within length buckets where lengths differ
    verification: Verification | None = None
    device_update: LatencySummary | None = None  # CUDA-event clock of the measured updates (CUDA only)
    host_overhead_ms: float | None = None  # median of host minus device time per measured update
    contention: str = "none"  # tag timing.contention
    threads: int = 0  # torch intra-op threads (run.threads, resolved)
    streams: int = 1  # independent streams per update (B)
    process_ms: dict[str, float] | None = None  # process_<phase>_ms of a run started from the command line
    eval_loss_before: float | None = None  # loss on the held-out batches before the first update
    eval_loss_after: float | None = None  # and after the last
    eval_batches: int = 0
    banks: SavedBanks | None = None  # the adapted banks, the run's artifact
    lengths: tuple[int, int] | None = None  # the shortest and longest batch, where their lengths differ
    buckets: tuple[int, ...] | None = None  # what the executor padded them to (None: each at its exact length)
    padding_overhead: float | None = None  # padded steps / real steps of the measured updates
    recaptures: int | None = None  # graphs captured after prepare (None: the executor captures none)
    output_loss: str | None = None  # why the output folder's journal or result.json was not written (MLflow has all)
    tracking_lost: str | None = None  # why MLflow's copy of the run is not complete (its journal has it all)
    in_mlflow: bool = True  # MLflow has the run, perhaps not ended; else run_id names its journal, not an MLflow run

    @property
    def streams_per_s(self) -> float:
        return streams_per_s(self.streams, self.update.median)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str)


def streams_per_s(streams: int, update_ms_median: float) -> float:
    """Streams x updates per second: B streams adapted per update, at the median update latency."""
    return streams * 1000.0 / update_ms_median


def run_experiment(
    config: DictConfig,
    output_dir: Path | None = None,
    *,
    run_name: str | Callable[[Plan], str] | None = None,
    registry: Registry = REGISTRY,
    observers: Sequence[Observer] = (),
    on_planned: Callable[[Plan], None] | None = None,
) -> ExperimentResult:
    """Run the experiment ``config`` describes and log it as one MLflow run, named ``run_name``
    (or by ``run_name(plan)``) unless ``tracking.run_name`` names it; ``on_planned(plan)`` is
    called once planning has accepted it.

    In a sweep the run is a child of ``sweep.parent_run_id``. If the tracking store is
    unreachable the experiment still runs, logs to ``output_dir`` and then raises
    :class:`~axoexp.errors.TrackingUnavailableError`.
    """
    hide_passwords_in_logs()  # its lines name the store
    plan = plan_experiment(config, registry)
    if on_planned is not None:
        on_planned(plan)
    plan.begin_executor_setup()  # e.g. the compiler's start-up, overlapping the run's set-up below
    wallclock.mark("planning")
    tracking_uri = configure_tracking(config.tracking)
    store = StoreOpening(tracking_uri, config.tracking.experiment)  # overlaps the set-up up to the run's start
    if plan.device.type == "cuda":
        torch.cuda.init()
    wallclock.mark("cuda_init")
    configure_determinism(config.determinism)
    container = cast(dict[str, Any], OmegaConf.to_container(config, resolve=True))
    if callable(run_name):
        run_name = run_name(plan)
    run_name = config.tracking.run_name or run_name or describe.default_run_name(plan)
    components = plan.components.values()
    machine_tags = metadata.collect(plan.device, components)
    tags = {
        **describe.run_tags(plan, container),
        names.RESULT_KEY: metadata.result_key(plan.device, container, components, collected=machine_tags),
    }
    result = None  # what was measured: a store lost meanwhile does not take it from the summary
    try:
        with (
            signals.interruptible(),
            journaled_run(
                tracking_uri, config.tracking.experiment, run_name, tags, output_dir=output_dir, store=store
            ) as tracker,
        ):
            log.info("%s", _where_logged(tracker, run_name, config.tracking.experiment, tracking_uri))
            params = flatten(container)
            del params[names.RUN_THREADS_PARAM]  # logged once resolved, inside the lease
            tracker.log_params(params)
            tracker.log_text(OmegaConf.to_yaml(config, resolve=True), "config.yaml")  # MLflow's client hides a password
            tracker.set_tags(machine_tags)
            if output_dir is not None:
                tracker.set_tags({names.OUTPUT_DIR: str(output_dir)})
                if (output_dir / HYDRA_DIR).is_dir():
                    tracker.log_artifact(str(output_dir / HYDRA_DIR))
            collector.release()  # the command line's start-up done: the run's work runs with the collector on
            wallclock.mark("store")
            with device_lease(plan.device, cpus=config.run.lease_cpus, timeout_s=config.run.lease_timeout_s) as lease:
                # after the lease pinned this process's CPUs
                threads = configure_threads(config.run.threads, plan.device.type, config.run.measured_updates)
                # calibrated: the param says so (runs of one config stay one row); the count is in tag runtime.threads
                tracker.log_params({names.RUN_THREADS_PARAM: "calibrated" if threads.candidates else threads.count})
                tracker.set_tags({**lease.tags(), **threads.tags()})  # held alone from build through verify
                result = _execute(plan, tracker, tracking_uri, [tracker, *observers], output_dir, threads.candidates)
                result.threads = torch.get_num_threads()
            tracker.set_tags(lease.tags())
            if output_dir is not None:
                path = output_dir / RESULT_FILE
                result.output_loss = tracker.output_loss
                try:
                    write_atomically(path, result.to_json())
                except OSError as error:  # e.g. a full disk: MLflow and the printed summary still have it
                    tracker.output_lost(f"writing {path} failed: {error}")
                    result.output_loss = tracker.output_loss
                else:
                    tracker.log_artifact(str(path))
            wallclock.mark("logging")
            process_metrics = wallclock.take_phases()
            tracker.log_metrics(process_metrics)
            result.process_ms = process_metrics or None
            return result
    except TrackingUnavailableError as error:
        if result is not None:
            result.tracking_lost, result.in_mlflow = tracker.remote_lost, tracker.in_mlflow
            error.result = result
        raise


def _where_logged(tracker: JournaledLog, run_name: str, experiment: str, tracking_uri: str) -> str:
    """Where the run is logged: its MLflow run, or, where the store could not be reached, its journal only."""
    if tracker.remote_lost is None:
        return f"MLflow run {tracker.run_id} ({run_name}) in experiment {experiment!r} at {tracking_uri}"
    unreachable = f"MLflow tracking at {tracking_uri} {store_failure(tracker.remote_lost)} ({tracker.remote_lost})"
    journal = tracker.journal
    if journal is None or journal.lost is not None:
        return f"run {run_name} is kept in no store, only in what it returns: {unreachable}, and it has no journal"
    return f"run {run_name} is kept in its journal {journal.path} only: {unreachable}"


def _execute(
    plan: Plan,
    tracker: RunLog,
    tracking_uri: str,
    observers: Sequence[Observer],
    output_dir: Path | None,
    thread_candidates: Sequence[int] = (),
) -> ExperimentResult:
    """Build, evaluate, prepare, time, verify, evaluate and keep the adapted banks; log each as it
    completes. A run interrupted after an update keeps its banks too (not evaluated: it is stopping)."""
    config = plan.config
    population = plan.components["population"].name
    with noted_if_slow(f"build (population={population} on {plan.device}, its batches, and the held-out loss)"):
        setup = plan.build_population()
        tracker.set_tags(describe.workload_tags(setup, plan))
        if plan.initial_banks is not None:
            tracker.set_tags(plan.initial_banks.tags())
        tracker.log_dataset(describe.workload_dataset(setup, plan), names.WORKLOAD_CONTEXT)
        loss_fn = plan.build_loss()
        eval_before = eval_loss(setup.module, loss_fn, setup.eval_batches)  # not timed: no window is open
    if eval_before is not None:
        tracker.log_metrics({names.EVAL_LOSS_BEFORE: eval_before})
    pristine = copy.deepcopy(setup.module) if config.verify.enabled else None
    executor = plan.build_executor(setup.module)
    tracker.set_tags(describe.timing_tags(executor, plan.device))
    wallclock.mark("build")
    guard, adapted = ContentionGuard(plan.device), UpdateCount()
    observers = (*observers, adapted, FiniteGuard(setup.module, tracker), guard)  # the guard last: its
    # samples lie closest to the timed updates
    try:
        try:
            with window(observers, PREPARE):
                prepare_ms = executor.prepare_all(setup.batches)
            tracker.log_metrics({names.phase_metric(phase): value for phase, value in prepare_ms.items()})
            tracker.log_metrics(executor.prepared_metrics)
            tracker.set_tags({**executor.prepared_tags, **length_tags(executor.buckets(), setup.batches)})
            captured_in_prepare = executor.captures()
            if prepare_ms:
                log.info("prepare: %s", ", ".join(f"{phase} {ms:.1f} ms" for phase, ms in prepare_ms.items()))
            wallclock.mark("prepare")
            warmup, measured, spread = measure_updates(
                executor,
                setup.batches,
                config.run.warmup_updates,
                config.run.measured_updates,
                tracker,
                observers,
                config.run.min_time_s,
                config.run.max_time_s,
                thread_candidates,
            )
        finally:
            guard.log_to(tracker)
        update = LatencySummary.of(measured.latencies_ms)
        by_length = length_metrics(measured.latencies_ms, setup.batches, config.run.warmup_updates, executor.buckets())
        captured = executor.captures()
        recaptures = None if captured is None or captured_in_prepare is None else captured - captured_in_prepare
        tracker.log_metrics({**by_length, **({} if recaptures is None else {names.RECAPTURES: float(recaptures)})})
        tracker.log_metrics({names.STREAMS_PER_S: streams_per_s(setup.streams, update.median)})
        wallclock.mark("measure")
        if config.run.require_quiet:
            guard.raise_if_contended()

        verification = None
        if pristine is not None:
            with window(observers, VERIFY):
                verification = verify_parity(
                    plan.build_executor,
                    plan.components["executor"].name,
                    pristine,
                    setup.batches,
                    config.verify.updates,
                    config.verify.loss_atol,
                    config.verify.param_atol,
                )
                per_bucket = verify_buckets(
                    plan.build_executor,
                    plan.components["executor"].name,
                    pristine,
                    setup.batches,
                    config.verify.updates,
                    config.verify.loss_atol,
                    config.verify.param_atol,
                )
            tracker.log_metrics({**verification.metrics(), **bucket_metrics(per_bucket)})
            verification.raise_if_failed()
            for result in per_bucket.values():
                result.raise_if_failed()
            wallclock.mark("verify")
    except KeyboardInterrupt:  # ends KILLED: what the updates made is kept, as everything measured is
        if adapted.updates:
            keep_banks(setup.module, population, adapted.updates, tracker, output_dir)
        raise
    eval_after = eval_loss(setup.module, loss_fn, setup.eval_batches)
    if eval_after is not None:
        tracker.log_metrics({names.EVAL_LOSS_AFTER: eval_after})
    banks = keep_banks(setup.module, population, adapted.updates, tracker, output_dir)
    return ExperimentResult(
        run_id=tracker.run_id,
        tracking_uri=tracking_uri,
        experiment=config.tracking.experiment,
        prepare_ms=prepare_ms,
        update=update,
        streams=setup.streams,
        warmup_ms=warmup.latencies_ms,
        losses=warmup.losses + measured.losses,
        description=setup.description,
        verification=verification,
        device_update=LatencySummary.of(measured.device_ms) if measured.device_ms else None,
        host_overhead_ms=float(np.median(np.subtract(measured.latencies_ms, measured.device_ms)))
        if measured.device_ms
        else None,
        contention=guard.verdict(),
        noise_spread=spread,
        eval_loss_before=eval_before,
        eval_loss_after=eval_after,
        eval_batches=len(setup.eval_batches),
        banks=banks,
        lengths=length_range(setup.batches),
        buckets=executor.buckets(),
        padding_overhead=by_length.get(names.PADDING_OVERHEAD),
        recaptures=recaptures,
    )
