"""Reproducibility metadata: code version, software stack, hardware, determinism."""

from __future__ import annotations

import platform
import socket
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

from axoexp import names

PACKAGES = ("axoexp", "axosim", "torch", "numpy", "hydra-core", "omegaconf", "mlflow", "mlflow-skinny")


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        result = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip()


def git_state(directory: Path) -> dict[str, str]:
    """Commit, dirty flag and root of the git work tree holding ``directory``."""
    root = _git(["rev-parse", "--show-toplevel"], directory)
    if root is None:
        return {"git.commit": "unknown", "git.dirty": "unknown", "git.root": "not a git work tree"}
    commit = _git(["rev-parse", "HEAD"], directory) or "no commits"
    status = _git(["status", "--porcelain", "--untracked-files=no"], directory)
    dirty = "unknown" if status is None else str(bool(status)).lower()
    return {"git.commit": commit, "git.dirty": dirty, "git.root": root}


def package_versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[f"version.{name}"] = version(name)
        except PackageNotFoundError:
            versions[f"version.{name}"] = "not installed"
    versions["version.torch"] = torch.__version__  # names the build too, e.g. 2.11.0+cu130
    versions["version.python"] = platform.python_version()
    return versions


def _nvidia_driver() -> str:
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return result.stdout.strip().splitlines()[0] if result.stdout.strip() else "unknown"


def device_info(device: torch.device) -> dict[str, str]:
    info = {
        "device": str(device),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "version.cuda_runtime": str(torch.version.cuda),
        "cuda.available": str(torch.cuda.is_available()).lower(),
    }
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        info.update({
            "gpu.name": properties.name,
            "gpu.capability": f"{properties.major}.{properties.minor}",
            "gpu.memory_gib": f"{properties.total_memory / 2**30:.1f}",
            "gpu.driver": _nvidia_driver(),
            "version.cudnn": str(torch.backends.cudnn.version()),
        })
    return info


def determinism_flags() -> dict[str, str]:
    return {
        "determinism.deterministic_algorithms": str(torch.are_deterministic_algorithms_enabled()).lower(),
        "determinism.cudnn_benchmark": str(torch.backends.cudnn.benchmark).lower(),
        "determinism.cudnn_deterministic": str(torch.backends.cudnn.deterministic).lower(),
        "determinism.tf32_matmul": str(torch.backends.cuda.matmul.allow_tf32).lower(),
        "determinism.float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


PACKAGE_DIR = Path(__file__).resolve().parent
HYDRA_APP_SOURCE = "python -m axoexp"


def _program(argv0: Path) -> str:
    return f"python -m {argv0.parent.name}" if argv0.name == "__main__.py" else argv0.name or "python"


def source_tags(program: str | None = None) -> dict[str, str]:
    """MLflow's source tags, naming axoexp's code: the program (``program``, else ``python -m
    axoexp`` in a job of the Hydra app, also in a launcher's worker, else the command, e.g.
    ``python -m pytest``) and axoexp's git commit."""
    from hydra.core.hydra_config import HydraConfig

    if program is None:
        program = HYDRA_APP_SOURCE if HydraConfig.initialized() else _program(Path(sys.argv[0]))
    tags = {names.SOURCE_NAME: program}
    commit = _git(["rev-parse", "HEAD"], PACKAGE_DIR)
    if commit:
        tags[names.SOURCE_GIT_COMMIT] = commit
    return tags


def collect(device: torch.device) -> dict[str, str]:
    """All metadata tags for a run on ``device``."""
    return {
        **git_state(PACKAGE_DIR),
        **package_versions(),
        **device_info(device),
        **determinism_flags(),
        "command": " ".join(sys.argv),
    }
