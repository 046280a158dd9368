"""``hydra/sweeper=optuna``: the settings of an Optuna search, stored in Hydra's ConfigStore."""

# no `from __future__ import annotations`: Hydra executes this module without registering it in
# sys.modules, and dataclasses then cannot resolve string annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional  # noqa: UP035 (OmegaConf reads typing's generics)

from hydra.core.config_store import ConfigStore


@dataclass
class OptunaSweeperConf:
    _target_: str = "hydra_plugins.axoexp_optuna_sweeper.optuna_sweeper.OptunaSweeper"

    # metric logged by each run -> minimize | maximize; several: a multi-objective study (Pareto front)
    objectives: Dict[str, str] = field(default_factory=lambda: {"update_ms_median": "minimize"})  # noqa: UP006

    # config key -> search space, in Hydra's sweep syntax: choice(a,b), range(1,9), interval(0.1,1),
    # tag(log,interval(1e-4,1e-1)), tag(int,interval(8,64)); sweeps among the overrides count too
    params: Dict[str, Any] = field(default_factory=dict)  # noqa: UP006

    # tpe (multi-objective too) | nsga2 | random, seeded by seed plus the trials already done
    sampler: str = "tpe"
    seed: int = 0

    # trials in the study in all: a rerun of the same command resumes the study and runs the rest
    n_trials: int = 8

    # trials handed to the launcher at once (hydra/launcher=parallel runs them side by side)
    n_jobs: int = 1

    # Optuna RDB URL; null: sqlite optuna.db beside the MLflow sqlite store (else in the cwd)
    storage: Optional[str] = None  # noqa: UP045

    # null: axoexp-<hash of the fixed overrides, the search space and the objectives>
    study_name: Optional[str] = None  # noqa: UP045

    # a trial timed under contention (timing.contention not none): fail (told FAIL) | keep (its values count)
    contended: str = "fail"


ConfigStore.instance().store(group="hydra/sweeper", name="optuna", node=OptunaSweeperConf, provider="axoexp")
