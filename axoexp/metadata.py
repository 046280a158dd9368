"""Reproducibility metadata: code version, software stack, hardware, determinism."""

from __future__ import annotations

import hashlib
import json
import platform
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from axoexp import names
from axoexp.registry import BUILTIN, Component
from axoexp.versions import version_tags

PACKAGE_DIR = Path(__file__).resolve().parent


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip()


def git_state(directory: Path) -> dict[str, str]:
    """Commit, dirty flag and root of the git work tree holding ``directory``."""
    root = _git(["rev-parse", "--show-toplevel"], directory)
    if root is None:
        return {names.GIT_COMMIT: "unknown", names.GIT_DIRTY: "unknown", names.GIT_ROOT: "not a git work tree"}
    commit = _git(["rev-parse", "HEAD"], directory) or "no commits"
    status = _git(["status", "--porcelain", "--untracked-files=no"], directory)
    dirty = "unknown" if status is None else str(bool(status)).lower()
    return {names.GIT_COMMIT: commit, names.GIT_DIRTY: dirty, names.GIT_ROOT: root}


def _sha256_of_files(files: Iterable[Path], root: Path | None = None) -> str:
    digest = hashlib.sha256()
    for file in sorted(files):
        digest.update(str(file.relative_to(root) if root else file).encode() + b"\0")
        try:
            digest.update(file.read_bytes())
        except OSError:
            digest.update(b"unreadable")
    return digest.hexdigest()


def _file_digests(files: Iterable[Path], root: Path | None = None) -> str:
    """``path=sha256[:12]`` of each file, space-separated: which file changed between two runs."""
    entries = []
    for file in sorted(files):
        try:
            digest = hashlib.sha256(file.read_bytes()).hexdigest()[:12]
        except OSError:
            digest = "unreadable"
        entries.append(f"{file.relative_to(root) if root else file}={digest}")
    return " ".join(entries)


def changed_files(before: str, after: str) -> list[str]:
    """The files whose digests differ between two :data:`~axoexp.names.CODE_FILES` tags
    (added, removed or edited), sorted."""
    old, new = (dict(entry.rpartition("=")[::2] for entry in tag.split()) for tag in (before, after))
    return sorted(path for path in old.keys() | new.keys() if old.get(path) != new.get(path))


def component_plugin_files(components: Iterable[Component]) -> list[Path]:
    """The loaded plugin files that ``components`` come from: the file each was registered from
    (a plugin file, or an entry point's module) and the file its factory is defined in, where
    that is a loaded plugin file. Built-in components come from axoexp's own sources."""
    from axoexp.plugins import loaded_plugin_files

    loaded = set(loaded_plugin_files())
    candidates = set()
    for component in components:
        if component.source == BUILTIN:
            continue
        # the source is a plugin file's path or "entry point NAME (module:attribute)"
        registering = component.source.partition(" (")[2].partition(":")[0].removesuffix(")")
        modules = (sys.modules.get(registering), sys.modules.get(getattr(component.factory, "__module__", "")))
        files = [component.source, *(getattr(module, "__file__", None) for module in modules)]
        candidates |= {Path(file).resolve() for file in files if file}
    return sorted(candidates & loaded)


CODE_STATE_TAGS = (names.CODE_HASH, names.PLUGINS_HASH, names.CODE_FILES, names.GIT_DIFF_SHA256)


def code_state(components: Iterable[Component] = ()) -> dict[str, str]:
    """What code computes a result: axoexp's own sources as they are on disk (a commit and
    its uncommitted changes alike), the uncommitted diff of the work tree holding them, and
    the plugin files that ``components`` (the run's components) come from
    (:func:`component_plugin_files`); and each file's own digest. Another plugin file, loaded
    or not, is no part of the run's code: it is left out of the diff too."""
    from axoexp.plugins import loaded_plugin_files

    bases = (PACKAGE_DIR, PACKAGE_DIR / "conf")  # a checkout links conf/ in, which rglob does not follow
    sources = {path for base in bases for pattern in ("*.py", "*.yaml") for path in base.rglob(pattern)}
    plugins = component_plugin_files(components)
    state = {
        names.CODE_HASH: _sha256_of_files(sources, PACKAGE_DIR),
        names.PLUGINS_HASH: _sha256_of_files(plugins),
        names.CODE_FILES: f"{_file_digests(sources, PACKAGE_DIR)} {_file_digests(plugins)}".strip(),
    }
    diff = _uncommitted_diff([file for file in loaded_plugin_files() if file not in plugins])
    state[names.GIT_DIFF_SHA256] = hashlib.sha256(diff.encode()).hexdigest() if diff is not None else "unknown"
    return state


def _uncommitted_diff(excluded: Iterable[Path]) -> str | None:
    """``git diff HEAD`` of the work tree holding axoexp, less the ``excluded`` files in it."""
    root = _git(["rev-parse", "--show-toplevel"], PACKAGE_DIR)
    if root is None:
        return None
    inside = [file for file in excluded if file.is_relative_to(Path(root).resolve())]
    return _git(["diff", "HEAD", "--binary", "--", *(f":(exclude){file}" for file in inside)], PACKAGE_DIR)


def cpu_model() -> str:
    """The CPU's model (``AMD EPYC 9654 96-Core Processor``): what tells two hosts' CPUs apart.
    ``platform.processor()`` names only the architecture on Linux (``x86_64``, ``aarch64``), so
    ``/proc/cpuinfo`` comes first (:func:`cpuinfo_model`), then macOS's brand string; the
    architecture only where neither names a model."""
    try:
        model = cpuinfo_model(Path("/proc/cpuinfo").read_text())
    except OSError:
        model = None
    if model is None and sys.platform == "darwin":
        try:
            found = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True)
            model = found.stdout.strip() or None  # Apple M2 Pro
        except OSError:
            model = None
    return model or platform.processor() or platform.machine()


def cpuinfo_model(cpuinfo: str) -> str | None:
    """The model ``/proc/cpuinfo`` names: its ``model name`` (x86), else, on Arm, which has none,
    the architecture with the first core's implementer and part (``aarch64 (CPU implementer 0x41,
    part 0xd4f)``, a Neoverse V2 of a Grace host), which tell Arm designs apart."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    if fields.get("model name"):
        return fields["model name"]
    if fields.get("CPU implementer") and fields.get("CPU part"):
        return f"{platform.machine()} (CPU implementer {fields['CPU implementer']}, part {fields['CPU part']})"
    return None


def device_identity(device: torch.device) -> dict[str, str]:
    """The hardware a timing belongs to: host, CPU and, on CUDA, the GPU model."""
    identity = {
        names.DEVICE: device.type,
        names.HOSTNAME: socket.gethostname(),
        names.CPU_MODEL: cpu_model(),
    }
    if device.type == "cuda" and torch.cuda.is_available():
        index = device.index if device.index is not None else torch.cuda.current_device()
        identity.update({names.DEVICE: f"cuda:{index}", names.GPU_NAME: torch.cuda.get_device_name(index)})
    return identity


def result_key(
    device: torch.device,
    resolved_config: Mapping[str, Any],
    components: Iterable[Component],
    collected: Mapping[str, str] | None = None,
) -> str:
    """SHA-256 of everything that determines a run's result: the config (less where results
    go), the code (axoexp's and the plugin files ``components`` come from: :func:`code_state`),
    the package versions and the device. Resume reuses a run only on a match. ``collected``:
    the run's :func:`collect` tags, whose code state and commit are then not read again."""
    from axoexp.tracking import config_digest

    if collected is None:
        collected = {**code_state(components), **git_state(PACKAGE_DIR)}
    key = {
        "config": config_digest(resolved_config),
        "code": {name: collected[name] for name in CODE_STATE_TAGS},
        names.GIT_COMMIT: collected[names.GIT_COMMIT],
        "versions": version_tags(torch.__version__),
        names.DEVICE: device_identity(device),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _nvidia_driver() -> str:
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return result.stdout.strip().splitlines()[0] if result.stdout.strip() else "unknown"


def device_info(device: torch.device) -> dict[str, str]:
    info = {
        names.DEVICE: str(device),
        names.HOSTNAME: socket.gethostname(),
        names.PLATFORM: platform.platform(),
        names.CPU_MODEL: cpu_model(),
        names.version_tag("cuda_runtime"): str(torch.version.cuda),
        names.CUDA_AVAILABLE: str(torch.cuda.is_available()).lower(),
    }
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        info.update(
            {
                names.GPU_NAME: properties.name,
                names.GPU_CAPABILITY: f"{properties.major}.{properties.minor}",
                names.GPU_MEMORY_GIB: f"{properties.total_memory / 2**30:.1f}",
                names.GPU_DRIVER: _nvidia_driver(),
                names.version_tag("cudnn"): str(torch.backends.cudnn.version()),
            }
        )
    return info


def determinism_flags() -> dict[str, str]:
    return {
        names.determinism_tag("deterministic_algorithms"): str(torch.are_deterministic_algorithms_enabled()).lower(),
        names.determinism_tag("cudnn_benchmark"): str(torch.backends.cudnn.benchmark).lower(),
        names.determinism_tag("cudnn_deterministic"): str(torch.backends.cudnn.deterministic).lower(),
        names.determinism_tag("tf32_matmul"): str(torch.backends.cuda.matmul.allow_tf32).lower(),
        names.determinism_tag("float32_matmul_precision"): torch.get_float32_matmul_precision(),
    }


HYDRA_APP_SOURCE = "python -m axoexp"


def command_line() -> str:
    """This process's arguments, as the ``command`` tag keeps them (MLflow's client hides a password)."""
    return " ".join(sys.argv)


def _program(argv0: str) -> str:
    """``python -m PACKAGE`` for a package's ``__main__.py``, ``python -c`` (also pytest-xdist's
    workers), ``python`` for an interactive session, else the script's name."""
    if argv0 == "-c":
        return "python -c"
    if not argv0:
        return "python"
    path = Path(argv0)
    return f"python -m {path.parent.name}" if path.name == "__main__.py" else path.name


def source_tags(program: str | None = None) -> dict[str, str]:
    """MLflow's source tags, naming axoexp's code: the program (``program``, else ``python -m
    axoexp`` in a job of the Hydra app, also in a launcher's worker, else the command, e.g.
    ``python -m pytest``) and axoexp's git commit."""
    from hydra.core.hydra_config import HydraConfig

    if program is None:
        program = HYDRA_APP_SOURCE if HydraConfig.initialized() else _program(sys.argv[0] if sys.argv else "")
    tags = {names.SOURCE_NAME: program}
    commit = _git(["rev-parse", "HEAD"], PACKAGE_DIR)
    if commit:
        tags[names.SOURCE_GIT_COMMIT] = commit
    return tags


def collect(device: torch.device, components: Iterable[Component]) -> dict[str, str]:
    """All metadata tags for a run of ``components`` on ``device``."""
    return {
        **git_state(PACKAGE_DIR),
        **code_state(components),
        **version_tags(torch.__version__),
        **device_info(device),
        **determinism_flags(),
        names.COMMAND: command_line(),
    }


def provenance(device: str = "cuda") -> dict[str, str]:
    """What a result written outside MLflow (a benchmark's JSON or markdown) records beside its
    numbers: axoexp's commit and dirty flag, the command line, the device and the UTC date."""
    return {
        names.DATE: datetime.now(UTC).isoformat(timespec="seconds"),
        names.COMMAND: shlex.join(["python", *sys.argv]),
        **git_state(PACKAGE_DIR),
        **device_identity(torch.device(device)),
        **version_tags(torch.__version__),
    }


def provenance_line(record: Mapping[str, str]) -> str:
    """:func:`provenance` as one markdown line, for the head of a result table."""
    device = record.get(names.GPU_NAME, record[names.DEVICE])
    return (
        f"axoexp {record[names.GIT_COMMIT][:12]} (dirty: {record[names.GIT_DIRTY]}), {device}, "
        f"{record[names.DATE]}; command: `{record[names.COMMAND]}`"
    )
