"""Hydra configs for axoexp, installed as the package ``axoexp.conf`` (see pyproject.toml)."""
