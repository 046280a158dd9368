"""``hydra/launcher=axoexp_parallel``, which the preset ``hydra/launcher=parallel`` sizes; in Hydra's ConfigStore."""

# no `from __future__ import annotations`: Hydra executes this module without registering it in
# sys.modules, and dataclasses then cannot resolve string annotations

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore


@dataclass
class ParallelLauncherConf:
    _target_: str = "hydra_plugins.axoexp_parallel_launcher.parallel_launcher.ParallelLauncher"

    # worker processes, each running one job at a time; the preset parallel sizes it from the
    # host's devices (${axoexp_parallel_jobs:${device},${run.lease_cpus}})
    n_jobs: int = 1


ConfigStore.instance().store(
    group="hydra/launcher", name="axoexp_parallel", node=ParallelLauncherConf, provider="axoexp"
)
