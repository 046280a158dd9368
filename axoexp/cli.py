"""``python -m axoexp``: the Hydra application."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from axoexp import sweep
from axoexp.experiment import ConfigError, ExperimentResult, configure_tracking, run_experiment
from axoexp.registry import load_plugins
from axoexp.tracking import TrackingUnavailableError


def format_result(result: ExperimentResult) -> str:
    """The human-readable summary printed at the end of a run."""
    update = result.update
    lines = [f"{phase:<14}{milliseconds:10.3f} ms" for phase, milliseconds in result.prepare_ms.items()]
    if result.warmup_ms:
        lines.append(f"{'first update':<14}{result.warmup_ms[0]:10.3f} ms  (cold, warm-up)")
    lines.append(
        f"{'update':<14}{update.median:10.3f} ms  median of {update.count}  "
        f"(p10 {update.p10:.3f}, p90 {update.p90:.3f}, mean {update.mean:.3f})"
    )
    lines.append(f"{'loss':<14}{result.losses[0]:10.4g} -> {result.losses[-1]:.4g}")
    if result.verification is not None:
        check = result.verification
        lines.append(
            f"{'verify':<14}{'passed' if check.passed else 'FAILED'}: {check.updates} updates vs eager, "
            f"max |loss diff| {check.max_abs_loss_diff:.2e}, max |param diff| {check.max_abs_param_diff:.2e}"
        )
    lines.append(f"{'mlflow run':<14}{result.run_id}  (experiment {result.experiment!r} at {result.tracking_uri})")
    return "\n".join(lines)


@hydra.main(version_base="1.3", config_path="pkg://axoexp.conf", config_name="config")
def hydra_app(config: DictConfig) -> float | None:
    """Run one experiment; Hydra's multirun calls this once per job."""
    hydra_config = HydraConfig.get()
    parent_run_id = job_name = None
    if hydra_config.mode == RunMode.MULTIRUN:
        parent_run_id = os.environ.get(sweep.PARENT_ENV)
        job_name = hydra_config.job.override_dirname or "defaults"
        if config.sweep.resume:
            tracking_uri = configure_tracking(config)
            previous = sweep.reusable_run(config, tracking_uri)
            if previous is not None:
                sweep.note_reuse(tracking_uri, parent_run_id, hydra_config.job.num, previous)
                print(f"skipped {job_name}: its resolved config already FINISHED as MLflow run "
                      f"{previous} (sweep.resume=false runs it again)", flush=True)
                return None
    try:
        result = run_experiment(config, Path(hydra_config.runtime.output_dir),
                                parent_run_id=parent_run_id, run_name=job_name)
    except (ConfigError, TrackingUnavailableError) as error:
        if hydra_config.mode == RunMode.RUN:  # a sweep records the failed job and goes on
            print(f"axoexp: {error}", file=sys.stderr)
            sys.exit(2 if isinstance(error, ConfigError) else 1)
        raise
    print(format_result(result), flush=True)
    return result.update.median


def main() -> None:
    """Load plugins first, so their components are Hydra config options, then run Hydra."""
    load_plugins()
    hydra_app()


if __name__ == "__main__":
    sys.exit(main())
