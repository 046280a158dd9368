"""The adapted banks, a run's result: saved weights-only, evaluated on held-out batches, and
loaded again to start another run (``population.init_from``).

The banks are the population's trainable adaptation parameters
(``module.trainable_adaptation_parameters()``, by their names in ``module.named_parameters()``).
They are saved as ``banks.safetensors`` (no code can run when it is read), with the population
option that made them in the file's metadata; the run's tags hold the file's SHA-256 and the
banks' shapes. ``docs/banks.md`` says when a run keeps them and how to start from them.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save

from axoexp import names
from axoexp.components.population import sha256_of
from axoexp.errors import BanksError
from axoexp.executors.base import batch_loss
from axoexp.interfaces import Batch, LossFn, RunLog, adaptation_parameters
from axoexp.redact import redacted
from axoexp.registry import INIT_FROM, INIT_FROM_SHA256
from axoexp.tracking import UNREACHABLE, answering_client, no_store_yet, run_or_none, store_reason
from axoexp.windows import Observer

BANKS_FILE = "banks.safetensors"
FORMAT = "axoexp-banks-1"
POPULATION_KEY = "population"  # metadata: the population option whose module the banks belong to
FORMAT_KEY = "format"
METADATA_KEY = "__metadata__"  # the safetensors header's entry of metadata
LENGTH_BYTES = 8  # a safetensors file starts with its header's length, an unsigned little-endian integer
HEADER_ALIGNMENT = 8  # its header (JSON) is padded with spaces to a multiple of this, then the data follow
RUN_ID = re.compile(r"[0-9a-f]{32}")


def adapted_banks(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's trainable adaptation banks by parameter name, in the module's order."""
    trainable = {id(parameter) for parameter in adaptation_parameters(module)}
    return {name: parameter for name, parameter in module.named_parameters() if id(parameter) in trainable}


def shapes_text(shapes: Mapping[str, tuple[int, ...]]) -> str:
    """``behavior_adapter=(3, 44) synaptic_log_efficacy=(3, 4)``: tag ``banks.shapes``."""
    return " ".join(f"{name}={tuple(shape)}" for name, shape in shapes.items())


class UpdateCount(Observer):
    """Counts the adaptation updates that completed (warm-up and measured)."""

    def __init__(self) -> None:
        self.updates = 0

    def update_finished(self, window: str, index: int, latency_ms: float, loss: float, bucket: int | None) -> None:
        self.updates += 1


@dataclass(frozen=True)
class SavedBanks:
    """Where a run's banks went and what identifies them."""

    artifact: str
    sha256: str
    shapes: dict[str, tuple[int, ...]]
    updates: int

    def tags(self) -> dict[str, str]:
        return {
            names.BANKS_ARTIFACT: self.artifact,
            names.BANKS_SHA256: self.sha256,
            names.BANKS_SHAPES: shapes_text(self.shapes),
            names.BANKS_UPDATES: str(self.updates),
        }


def save_banks(tensors: Mapping[str, torch.Tensor], population: str, path: Path) -> None:
    """Write ``tensors`` (contiguous, on the CPU) as a banks file of ``population`` at ``path``, the
    same bytes (so the same SHA-256) for the same banks: safetensors writes the metadata in the order
    of a Rust HashMap, which changes from call to call, so the header is written again with the
    metadata's keys sorted (the tensors' entries and data stay as safetensors wrote them)."""
    serialized = save(dict(tensors), metadata={FORMAT_KEY: FORMAT, POPULATION_KEY: population})
    length = int.from_bytes(serialized[:LENGTH_BYTES], "little")
    header = json.loads(serialized[LENGTH_BYTES : LENGTH_BYTES + length])
    header[METADATA_KEY] = dict(sorted(header[METADATA_KEY].items()))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % HEADER_ALIGNMENT)
    with path.open("wb") as stream:
        stream.write(len(text).to_bytes(LENGTH_BYTES, "little"))
        stream.write(text)
        stream.write(memoryview(serialized)[LENGTH_BYTES + length :])


def keep_banks(
    module: torch.nn.Module, population: str, updates: int, tracker: RunLog, directory: Path | None
) -> SavedBanks:
    """Save the module's adapted banks to ``directory/banks.safetensors`` (a temporary file where
    there is no directory or it cannot be written, e.g. a full disk), log the file as the run's
    artifact and its SHA-256 and shapes as tags."""
    tensors = {name: bank.detach().cpu().contiguous() for name, bank in adapted_banks(module).items()}
    with tempfile.TemporaryDirectory(prefix="axoexp-banks-") as scratch:
        path = None
        if directory is not None:
            with suppress(SafetensorError, OSError):  # e.g. a full disk: MLflow still gets a temporary copy
                save_banks(tensors, population, directory / BANKS_FILE)
                path = directory / BANKS_FILE
        if path is None:
            path = Path(scratch) / BANKS_FILE
            save_banks(tensors, population, path)
        saved = SavedBanks(BANKS_FILE, sha256_of(path), {name: tuple(t.shape) for name, t in tensors.items()}, updates)
        tracker.log_artifact(str(path))
    tracker.set_tags(saved.tags())
    return saved


@dataclass(frozen=True)
class InitialBanks:
    """Banks to start a run from (``population.init_from``), read and checked while planning."""

    origin: str  # as population.init_from gave it
    sha256: str
    population: str
    tensors: dict[str, torch.Tensor]  # on the CPU

    def tags(self) -> dict[str, str]:
        return {names.BANKS_INIT_FROM: self.origin, names.BANKS_INIT_SHA256: self.sha256}

    def kind_problem(self, population: str) -> str | None:
        """Why these banks cannot start a population of option ``population`` whatever it builds."""
        if self.population == population:
            return None
        given = f"population.{INIT_FROM}={self.origin}"
        return f"{given} holds banks of population {self.population}, not of population={population}"

    def problems(self, population: str, module: torch.nn.Module, dtype: torch.dtype) -> list[str]:
        """Why these banks cannot start ``population``'s ``module`` at ``dtype`` (empty when they can),
        e.g. a bank the module lacks, or one it trains that the banks lack (one it does not train may
        be absent: it keeps the value the population builds). ``module`` may live on the meta device:
        only names, shapes and dtypes are compared."""
        given = f"population.{INIT_FROM}={self.origin}"
        kind = self.kind_problem(population)
        if kind:
            return [kind]
        banks = {name: bank for name, bank in module.named_parameters() if name in self.tensors}
        extra = sorted(set(self.tensors) - set(banks))
        if extra:
            return [f"{given} holds banks this population lacks: {', '.join(extra)}"]
        absent = [name for name in adapted_banks(module) if name not in self.tensors]
        if absent:
            noun, them = ("bank", "it") if len(absent) == 1 else ("banks", "them")
            return [
                f"{given} holds no {', '.join(absent)} {noun}, but this population trains {them}; start from "
                f"banks of a run that trained {them} too, or do not train {them} in this run"
            ]
        saved = {name: tuple(tensor.shape) for name, tensor in self.tensors.items()}
        planned = {name: tuple(bank.shape) for name, bank in banks.items()}
        if saved != planned:
            return [
                f"{given} holds banks of shapes {shapes_text(saved)}, but this population's are "
                f"{shapes_text(planned)}; start from banks of the same population settings"
            ]
        other = sorted({_dtype_name(tensor.dtype) for tensor in self.tensors.values()} - {_dtype_name(dtype)})
        if other:
            return [f"{given} holds {', '.join(other)} banks, but this run is dtype={_dtype_name(dtype)}"]
        return []

    def load_into(self, population: str, module: torch.nn.Module, dtype: torch.dtype) -> None:
        """Copy the banks into ``module``'s parameters exactly (after checking them again against
        the real module; planning may have judged a module built on the meta device)."""
        problems = self.problems(population, module, dtype)
        if problems:
            raise BanksError(problems[0])
        parameters = dict(module.named_parameters())
        with torch.no_grad():
            for name, tensor in self.tensors.items():
                parameters[name].copy_(tensor)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def init_from_problems(settings: Mapping[str, object]) -> list[str]:
    """What the banks settings (``population.init_from``, ``population.init_from_sha256``) refuse
    before any banks are read: a pin without the banks it pins, which nothing would check."""
    pinned = settings.get(INIT_FROM_SHA256)
    if pinned is None or settings.get(INIT_FROM) is not None:
        return []
    return [
        f"population.{INIT_FROM_SHA256}={pinned} pins the banks of population.{INIT_FROM}, which is not set; "
        f"set population.{INIT_FROM} (a run id or banks file) too, or drop the pin"
    ]


def read_initial_banks(origin: str, pinned_sha256: str | None, tracking_uri: str) -> InitialBanks:
    """The banks ``population.init_from`` names: a banks file, or the MLflow run id of a run that
    kept its banks (read from ``tracking_uri``; its file must match the run's tag ``banks.sha256``).
    A pin (``population.init_from_sha256``) must match the file's SHA-256."""
    file = Path(origin).expanduser()
    if file.is_file():
        return _read(origin, file, pinned_sha256, recorded_sha256=None)
    if not RUN_ID.fullmatch(origin):
        raise BanksError(f"population.{INIT_FROM}={origin!r} is neither a file nor an MLflow run id (32 hex digits)")
    absent = no_store_yet(tracking_uri)
    if absent:
        raise BanksError(f"population.{INIT_FROM}={origin}: no such run, the store {redacted(tracking_uri)} {absent}")
    try:
        client = answering_client(tracking_uri)
        run = run_or_none(client, origin)
    except UNREACHABLE as error:
        raise BanksError(
            f"population.{INIT_FROM}={origin}: the run cannot be read from {redacted(tracking_uri)}: "
            + store_reason(error)
        ) from error
    if run is None:
        raise BanksError(f"population.{INIT_FROM}={origin}: no such run in {redacted(tracking_uri)}")
    recorded = run.data.tags.get(names.BANKS_SHA256)
    if recorded is None:
        raise BanksError(
            f"population.{INIT_FROM}={origin}: the run kept no adapted banks (it ended {run.info.status}; "
            "runs keep them when they end FINISHED, or KILLED after an update)"
        )
    with tempfile.TemporaryDirectory(prefix="axoexp-init-") as scratch:
        artifact = run.data.tags.get(names.BANKS_ARTIFACT, BANKS_FILE)
        try:
            with _no_progress_bar():
                path = Path(client.download_artifacts(origin, artifact, scratch))
        except UNREACHABLE as error:
            raise BanksError(
                f"population.{INIT_FROM}={origin}: its banks artifact {artifact} cannot be read: {error}"
            ) from error
        return _read(origin, path, pinned_sha256, recorded_sha256=recorded)


@contextmanager
def _no_progress_bar() -> Iterator[None]:
    """MLflow draws a download progress bar on stderr; planning prints nothing but refusals."""
    previous = os.environ.get(names.ARTIFACTS_PROGRESS_BAR_ENV)
    os.environ[names.ARTIFACTS_PROGRESS_BAR_ENV] = "false"
    try:
        yield
    finally:
        if previous is None:
            del os.environ[names.ARTIFACTS_PROGRESS_BAR_ENV]
        else:
            os.environ[names.ARTIFACTS_PROGRESS_BAR_ENV] = previous


def _read(origin: str, path: Path, pinned_sha256: str | None, recorded_sha256: str | None) -> InitialBanks:
    actual = sha256_of(path)
    given = f"population.{INIT_FROM}={origin}"
    if pinned_sha256 is not None and actual != str(pinned_sha256).lower():
        raise BanksError(
            f"{given}: its banks file has SHA-256 {actual}, but population.{INIT_FROM_SHA256} pins {pinned_sha256}"
        )
    if recorded_sha256 is not None and actual != recorded_sha256:
        raise BanksError(f"{given}: the banks artifact has SHA-256 {actual}, but the run recorded {recorded_sha256}")
    try:
        with safe_open(str(path), framework="pt") as opened:
            metadata = opened.metadata() or {}
            tensors = {name: opened.get_tensor(name) for name in opened.keys()}
    except (SafetensorError, OSError) as error:
        raise BanksError(f"{given} is not a banks file (safetensors): {str(error).splitlines()[0][:200]}") from error
    if metadata.get(FORMAT_KEY) != FORMAT or POPULATION_KEY not in metadata:
        raise BanksError(f"{given} is a safetensors file, but not one of axoexp's banks files ({FORMAT})")
    return InitialBanks(origin, actual, metadata[POPULATION_KEY], tensors)


def eval_loss(module: torch.nn.Module, loss_fn: LossFn, batches: list[Batch]) -> float | None:
    """The mean loss over held-out batches, without gradients (``None`` without any); a batch of
    B streams counts as the update counts it (:func:`axoexp.executors.base.batch_loss`)."""
    if not batches:
        return None
    with torch.no_grad():
        losses = [batch_loss(module, loss_fn, inputs, targets) for inputs, targets in batches]
        return float(torch.stack(losses).double().mean())
