"""``python -m axoexp``: the Hydra application."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from axoexp.experiment import ConfigError, ExperimentResult, run_experiment
from axoexp.registry import load_plugins


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
def hydra_app(config: DictConfig) -> float:
    """Run one experiment; Hydra's multirun calls this once per job."""
    hydra_config = HydraConfig.get()
    try:
        result = run_experiment(config, Path(hydra_config.runtime.output_dir))
    except ConfigError as error:
        if hydra_config.mode == RunMode.RUN:  # a sweep records the failed job and goes on
            print(f"axoexp: {error}", file=sys.stderr)
            sys.exit(2)
        raise
    print(format_result(result), flush=True)
    return result.update.median


def main() -> None:
    """Load plugins first, so their components are Hydra config options, then run Hydra."""
    load_plugins()
    hydra_app()


if __name__ == "__main__":
    sys.exit(main())
