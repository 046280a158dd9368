"""The software stack's versions as installed: run tags, ``--version`` of every command."""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from axoexp import names

NOT_INSTALLED = "not installed"
PACKAGES = ("axoexp", "axosim", "torch", "numpy", "hydra-core", "omegaconf", "mlflow", "mlflow-skinny")


def installed_versions() -> dict[str, str]:
    """Each of :data:`PACKAGES` and ``python``, with its installed version or :data:`NOT_INSTALLED`,
    read from the installed distributions (nothing imported)."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = NOT_INSTALLED
    versions["python"] = platform.python_version()
    return versions


def version_tags(torch_version: str) -> dict[str, str]:
    """:func:`installed_versions` as run tags (``versions.torch``); ``torch_version``, the imported
    torch's, names its build too (``2.11.0+cu130``), where a distribution's may not."""
    versions = {**installed_versions(), "torch": torch_version}
    return {names.version_tag(name): value for name, value in versions.items()}


def versions_line() -> str:
    """``axoexp 0.1.0 (axosim ..., torch ..., python ...)``: what every command's ``--version`` prints."""
    versions = installed_versions()
    own = versions.pop("axoexp")
    stack = ", ".join(f"{name} {value}" for name, value in versions.items() if value != NOT_INSTALLED)
    return f"axoexp {own} ({stack})"


class VersionAction(argparse.Action):
    """``--version`` for a command's argument parser: :func:`versions_line`, read only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print axoexp's version and its stack's, and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(versions_line())
        sys.exit(0)
