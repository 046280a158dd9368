"""axoexp's launcher for ``hydra/launcher=parallel``: a pool that outlives a worker's death (the work is
:mod:`axoexp.parallel_launcher`)."""
