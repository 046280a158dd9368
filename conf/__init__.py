"""Hydra configs for axoexp: the top-level ``conf/`` of the repository, linked into the package as
``axoexp/conf`` and shipped as package data, so Hydra finds ``pkg://axoexp.conf`` after any install."""
