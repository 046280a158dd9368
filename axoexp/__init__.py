"""axoexp: plugin-driven experiments on inference-time adaptation of AxoSim populations."""

from axoexp.experiment import ConfigError, ExperimentResult, plan_experiment, run_experiment
from axoexp.registry import REGISTRY, component, load_plugins

__all__ = [
    "REGISTRY", "ConfigError", "ExperimentResult", "component", "load_plugins",
    "plan_experiment", "run_experiment",
]
