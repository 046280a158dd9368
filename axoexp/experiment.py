"""One experiment, start to end: plan, set up torch, open the MLflow run, measure, verify, log."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from axoexp import describe, metadata, names, signals
from axoexp.guard import FiniteGuard
from axoexp.journal import journaled_run
from axoexp.measure import PREPARE, VERIFY, Observer, measure_updates, window
from axoexp.plan import Plan, plan_experiment
from axoexp.registry import REGISTRY, Registry
from axoexp.runtime import configure_determinism
from axoexp.timing import LatencySummary
from axoexp.tracking import RunLog, configure_tracking, flatten
from axoexp.verification import Verification, verify_parity

RESULT_FILE = "result.json"


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
    verification: Verification | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str)


def run_experiment(
    config: DictConfig, output_dir: Path | None = None, *, run_name: str | None = None,
    registry: Registry = REGISTRY, observers: Sequence[Observer] = (),
) -> ExperimentResult:
    """Run the experiment ``config`` describes and log it as one MLflow run.

    In a sweep the run is a child of ``sweep.parent_run_id``. If the tracking store is
    unreachable the experiment still runs, logs to ``output_dir`` and then raises
    :class:`~axoexp.errors.TrackingUnavailableError`.
    """
    plan = plan_experiment(config, registry)
    configure_determinism(config.determinism)
    tracking_uri = configure_tracking(config.tracking)
    container = OmegaConf.to_container(config, resolve=True)
    assert isinstance(container, dict)
    run_name = config.tracking.run_name or run_name or describe.default_run_name(plan)
    tags = {**describe.run_tags(plan, container), names.RESULT_KEY: metadata.result_key(plan.device, container)}
    with signals.interruptible(), journaled_run(tracking_uri, config.tracking.experiment, run_name, tags,
                                                output_dir=output_dir) as tracker:
        tracker.log_params(flatten(container))
        tracker.log_text(OmegaConf.to_yaml(config, resolve=True), "config.yaml")
        tracker.set_tags(metadata.collect(plan.device))
        if output_dir is not None:
            tracker.set_tags({names.OUTPUT_DIR: str(output_dir)})
        result = _execute(plan, tracker, tracking_uri, [tracker, *observers])
        if output_dir is not None:
            path = output_dir / RESULT_FILE
            try:
                path.write_text(result.to_json())
            except OSError as error:  # e.g. a full disk: MLflow and the printed summary still have it
                tracker.set_tags({names.JOURNAL_LOST: f"writing {path} failed: {error}"})
            else:
                tracker.log_artifact(str(path))
        return result


def _execute(plan: Plan, tracker: RunLog, tracking_uri: str, observers: Sequence[Observer]) -> ExperimentResult:
    """Build, prepare, time, verify; log each as it completes."""
    config = plan.config
    setup = plan.build_population()
    tracker.set_tags(describe.workload_tags(setup, plan))
    pristine = copy.deepcopy(setup.module) if config.verify.enabled else None
    executor = plan.build_executor(setup.module)
    tracker.set_tags(describe.timing_tags(executor))
    observers = [*observers, FiniteGuard(setup.module, tracker)]

    with window(observers, PREPARE):
        prepare_ms = executor.prepare(*setup.batches[0])
    tracker.log_metrics({names.phase_metric(phase): value for phase, value in prepare_ms.items()})
    warmup, measured = measure_updates(executor, setup.batches, config.run.warmup_updates,
                                       config.run.measured_updates, tracker, observers)

    verification = None
    if pristine is not None:
        with window(observers, VERIFY):
            verification = verify_parity(
                plan.build_executor, plan.components["executor"].name, pristine, setup.batches,
                config.verify.updates, config.verify.loss_atol, config.verify.param_atol,
            )
        tracker.log_metrics(verification.metrics())
        verification.raise_if_failed()
    return ExperimentResult(
        run_id=tracker.run_id, tracking_uri=tracking_uri, experiment=config.tracking.experiment,
        prepare_ms=prepare_ms, update=LatencySummary.of(measured.latencies_ms),
        warmup_ms=warmup.latencies_ms, losses=warmup.losses + measured.losses,
        description=setup.description, verification=verification,
    )
