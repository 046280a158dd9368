"""Device leases: a job times only on a device that no other axoexp job uses at the same time.

A lease is an exclusive ``fcntl.flock`` on one lock file per device slot, in a directory that
every job on the host shares (``$AXOEXP_LEASE_DIR``, default ``/tmp/axoexp-leases``):

- ``device=cuda`` leases one free GPU of those this process sees and makes it the current
  device; ``device=cuda:N`` leases GPU N. A GPU's slot is named by its UUID, so two jobs
  that see it under different indexes (``CUDA_VISIBLE_DEVICES``) still exclude each other.
- ``device=cpu`` leases ``run.lease_cpus`` CPUs (default: every CPU this process may use)
  and pins the process to them, so parallel CPU jobs run on disjoint CPU sets or wait.

A job that finds its device held waits, says so once on stderr, and fails with
:class:`LeaseTimeoutError` after ``run.lease_timeout_s``. The kernel drops a lock when its
process dies, so a killed job never leaves a stale lease behind.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from axoexp import names
from axoexp.errors import LeaseError, LeaseTimeoutError
from axoexp.runtime import allowed_cpus

LEASE_DIR_ENV = "AXOEXP_LEASE_DIR"
DEFAULT_LEASE_DIR = Path(tempfile.gettempdir()) / "axoexp-leases"
POLL_S = 0.05


@dataclass
class Lease:
    """What a job holds: the device, the CPUs it is pinned to, and when it held them."""

    device: str
    cpus: tuple[int, ...]
    waited_s: float
    acquired_at: float
    released_at: float | None = None

    def tags(self) -> dict[str, str]:
        tags = {
            names.LEASE_DEVICE: self.device,
            names.LEASE_CPUS: ",".join(map(str, self.cpus)),
            names.LEASE_WAITED_S: f"{self.waited_s:.3f}",
            names.LEASE_ACQUIRED_AT: f"{self.acquired_at:.6f}",
        }
        if self.released_at is not None:
            tags[names.LEASE_RELEASED_AT] = f"{self.released_at:.6f}"
        return tags


@dataclass
class SlotRequest:
    """``need`` slots out of ``pool`` (lock-file names), all or nothing."""

    pool: list[str]
    need: int
    labels: dict[str, str] = field(default_factory=dict)  # slot -> what it stands for
    kind: str = "slot"  # what one slot is, for messages: "CPU", "GPU"


def lease_dir() -> Path:
    return Path(os.environ.get(LEASE_DIR_ENV) or DEFAULT_LEASE_DIR)


def gpu_identity(index: int) -> str:
    """A GPU's name that does not depend on ``CUDA_VISIBLE_DEVICES``: its UUID."""
    uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
    if not uuid:
        return f"{socket.gethostname()}-cuda{index}"
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"


def visible_gpus() -> list[tuple[int, str]]:
    """``(index, identity)`` of every GPU this process sees."""
    return [(index, gpu_identity(index)) for index in range(torch.cuda.device_count())]


def _cpu_request(count: int | None) -> SlotRequest:
    cpus = allowed_cpus()
    need = len(cpus) if count is None else count
    if need > len(cpus):
        raise LeaseError(
            f"run.lease_cpus={count}: this process may use only {len(cpus)} CPUs "
            f"({','.join(map(str, cpus))}); lease at most that many"
        )
    host = socket.gethostname()
    return SlotRequest(
        [f"cpu-{host}-{cpu}" for cpu in cpus], need, {f"cpu-{host}-{cpu}": str(cpu) for cpu in cpus}, "CPU"
    )


def _gpu_request(device: torch.device) -> SlotRequest:
    gpus = visible_gpus()
    if device.index is not None:
        gpus = [gpu for gpu in gpus if gpu[0] == device.index]
    if not gpus:
        raise LeaseError(f"device={device}: no such GPU here ({torch.cuda.device_count()} visible)")
    return SlotRequest(
        [f"gpu-{identity}" for _, identity in gpus],
        1,
        {f"gpu-{identity}": f"cuda:{index} {identity}" for index, identity in gpus},
        "GPU",
    )


@contextmanager
def device_lease(
    device: torch.device, *, cpus: int | None, timeout_s: float, directory: Path | None = None
) -> Iterator[Lease]:
    """Hold ``device`` alone for the duration of the block (see the module docstring).

    ``cpus`` is ``run.lease_cpus``: on CUDA, ``None`` leases no CPUs. The yielded
    :class:`Lease` gets ``released_at`` when the block ends; ``lease.cpus`` is the CPU set
    the process is pinned to, the size a job's thread count should match.
    """
    requests = []
    if device.type == "cuda":
        requests.append(_gpu_request(device))
    if device.type != "cuda" or cpus is not None:
        requests.append(_cpu_request(cpus))
    with hold(requests, timeout_s=timeout_s, directory=directory or lease_dir()) as (taken, waited_s):
        labels = {slot: request.labels.get(slot, slot) for request in requests for slot in taken}
        gpu = next((labels[slot] for slot in taken if slot.startswith("gpu-")), None)
        pinned = tuple(sorted(int(labels[slot]) for slot in taken if slot.startswith("cpu-")))
        lease = Lease(gpu or str(device), pinned, waited_s, time.time())
        with ExitStack() as restore:
            if gpu is not None:
                previous_device = torch.cuda.current_device()
                torch.cuda.set_device(int(gpu.split()[0].removeprefix("cuda:")))
                restore.callback(torch.cuda.set_device, previous_device)
            if pinned and set(pinned) != set(allowed_cpus()):
                restore.callback(_pin, allowed_cpus())
                _pin(pinned)
            try:
                yield lease
            finally:
                lease.released_at = time.time()


@contextmanager
def hold(requests: Sequence[SlotRequest], *, timeout_s: float, directory: Path) -> Iterator[tuple[list[str], float]]:
    """Lock every request's slots, all or nothing, polling until ``timeout_s``.

    Yields the slots taken and the seconds waited. Slots are never held while waiting
    for others, so jobs that need overlapping sets cannot deadlock.
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise LeaseError(f"cannot create the device lease directory {directory} (${LEASE_DIR_ENV}): {error}") from error
    start = time.monotonic()
    reported = False
    while True:
        held = _try_take(requests, directory)
        if held is not None:
            break
        waited = time.monotonic() - start
        if waited >= timeout_s or not reported:
            wanted = "; ".join(_describe(request, directory) for request in requests)
            if waited >= timeout_s:
                raise LeaseTimeoutError(
                    f"no device lease after {waited:.0f} s (run.lease_timeout_s={timeout_s:g}): {wanted}; "
                    "run fewer jobs at once, or wait longer"
                )
            print(
                f"axoexp: waiting up to {timeout_s:g} s (run.lease_timeout_s) for a device lease: {wanted}",
                file=sys.stderr,
                flush=True,
            )
            reported = True
        time.sleep(POLL_S)
    waited_s = time.monotonic() - start
    try:
        yield list(held), waited_s
    finally:
        for descriptor in held.values():
            os.close(descriptor)  # closing the only descriptor drops the flock


def _try_take(requests: Sequence[SlotRequest], directory: Path) -> dict[str, int] | None:
    """The locked slots (name -> descriptor) if every request could be met at once, else ``None``."""
    held: dict[str, int] = {}
    for request in requests:
        taken = 0
        for slot in request.pool:
            if taken == request.need:
                break
            descriptor = _lock(directory / f"{slot}.lock")
            if descriptor is not None:
                held[slot] = descriptor
                taken += 1
        if taken < request.need:
            for descriptor in held.values():
                os.close(descriptor)
            return None
    return held


def _lock(path: Path) -> int | None:
    """An open descriptor holding an exclusive flock on ``path``, or ``None`` if another holds it."""
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:  # another user's lock file: flock works on a read-only descriptor too
        descriptor = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        return None
    try:  # who holds it, for the messages of those who wait
        os.ftruncate(descriptor, 0)
        os.write(descriptor, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')}".encode())
    except OSError:
        pass
    return descriptor


def _describe(request: SlotRequest, directory: Path) -> str:
    """What a waiting job wants and who holds it, e.g. ``2 CPUs (0, 1), held by pid 22374 on vm since
    15:49:04`` or ``1 of 2 GPUs (cuda:0 GPU-..., cuda:1 GPU-...), held by pid 7 on vm since 15:49:04 (cuda:0),
    pid 9 on vm since 15:50:11 (cuda:1)``."""
    holders: dict[str, list[str]] = {}  # who holds (or "free") -> the slots' labels
    for slot in request.pool:
        holders.setdefault(_holder(directory / f"{slot}.lock"), []).append(request.labels.get(slot, slot))
    labels = [request.labels.get(slot, slot) for slot in request.pool]
    count = (
        f"{request.need} {request.kind}"
        if request.need == len(labels)
        else f"{request.need} of {len(labels)} {request.kind}"
    )
    wanted = f"{count}{'' if len(labels) == 1 else 's'} ({', '.join(labels)})"
    if len(holders) == 1:
        return f"{wanted}, {_held_by(next(iter(holders)))}"
    return f"{wanted}, " + ", ".join(f"{_held_by(holder)} ({', '.join(slots)})" for holder, slots in holders.items())


def _holder(path: Path) -> str:
    """Who holds a slot's lock (what its holder wrote: ``pid N on HOST since HH:MM:SS``), or ``free``."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return "free"
    try:
        try:  # a shared lock is granted only when no one holds the exclusive one
            fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.read(descriptor, 200).decode(errors="replace").strip() or "another process"
        fcntl.flock(descriptor, fcntl.LOCK_UN)
        return "free"
    finally:
        os.close(descriptor)


def _held_by(holder: str) -> str:
    return "free now" if holder == "free" else f"held by {holder}"


def _pin(cpus: Sequence[int]) -> None:
    """Pin every thread of this process (not only the caller, as ``sched_setaffinity(0)`` does)."""
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(task), cpus)
        except (ProcessLookupError, PermissionError):
            pass  # a thread that ended meanwhile


# --- resolvers for the launcher presets (conf/hydra/launcher/*.yaml)


def parallel_jobs(device: str, lease_cpus: int | None) -> int:
    """How many jobs this host can time at once for ``device``: its GPUs, or its CPU sets."""
    if device.startswith("cuda"):
        return 1 if ":" in device else max(1, torch.cuda.device_count())
    return max(1, len(allowed_cpus()) // lease_cpus) if lease_cpus else 1


def gpus_per_job(device: str) -> int:
    return 1 if device.startswith("cuda") else 0


def cpus_per_job(lease_cpus: int | None) -> int:
    return lease_cpus or 1


RESOLVERS: dict[str, Callable[..., Any]] = {
    "axoexp_parallel_jobs": parallel_jobs,
    "axoexp_gpus_per_job": gpus_per_job,
    "axoexp_cpus_per_job": cpus_per_job,
}


def register_resolvers() -> None:
    from omegaconf import OmegaConf

    for name, resolver in RESOLVERS.items():
        OmegaConf.register_new_resolver(name, resolver, replace=True)
