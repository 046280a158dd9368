"""axoexp's Hydra sweeper on Optuna 4 or later: ``hydra/sweeper=optuna`` (the work is :mod:`axoexp.search`)."""
