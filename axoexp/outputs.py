"""Output folders: one per run and per sweep, also when processes start in the same second,
and files in them written whole or not at all."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, open_dict, read_write

RUN_DIR_KEY = "hydra.run.dir"
HYDRA_DIR = ".hydra"
"""Hydra's record of a job in its folder: its config, its overrides, Hydra's own config."""


def claim_directory(base: Path) -> Path:
    """Create ``base``, or its first free sibling ``base-2``, ``base-3``...: ``mkdir`` either
    creates a folder or fails, so two processes never claim the same one."""
    base.parent.mkdir(parents=True, exist_ok=True)
    candidate, number = base, 1
    while True:
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            number += 1
            candidate = base.with_name(f"{base.name}-{number}")


def claim_run_dir(config: DictConfig) -> Path | None:
    """Give a single run a folder of its own: the default ``outputs/DATE/TIME`` becomes
    ``TIME-2``, ``TIME-3``... when another run has it. A folder named on the command line
    (``hydra.run.dir=DIR``) is used as given; ``None`` then."""
    if run_dir_given(config.hydra):
        return None
    claimed = claim_directory(Path(str(config.hydra.run.dir)))
    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.run.dir = str(claimed)
    return claimed


def run_dir_given(hydra: Any) -> bool:
    """Whether the command line names the run's folder (``hydra.run.dir=DIR``): it is then the user's."""
    return any(str(override).startswith(f"{RUN_DIR_KEY}=") for override in hydra.overrides.hydra)


class OutputDirCallback(Callback):
    """Claims each single run's output folder before Hydra writes into it (sweeps claim
    theirs in :class:`axoexp.sweep.MlflowSweepCallback`)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        claim_run_dir(config)


def remove_unused_run_dir(folder: Path) -> None:
    """Remove the folder claimed for a run refused or stopped before it began, where it holds only
    Hydra's record of the job and the log (nothing was measured; the log holds what the terminal
    showed, planning's lines, and the last line says why). A folder holding anything more is left,
    and so is its date folder, where another run may be claiming one; a folder that cannot be read
    or removed is left as it is."""
    with contextlib.suppress(OSError):
        record = folder / HYDRA_DIR
        kept = [path for path in folder.rglob("*") if not (path.is_relative_to(record) or path.suffix == ".log")]
        if not kept and folder.is_dir():
            shutil.rmtree(folder)


def write_atomically(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all: a full disk or a kill leaves the old file (or none),
    never an empty or cut one."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with temporary.open("w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
