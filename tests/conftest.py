"""Shared fixtures: composed configs, a private sqlite MLflow store and the session's local Ray
instance (helpers: tests/helpers.py)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import torch
from helpers import PLUGINS, RAY_PORT_ENV, REPO, free_port, leftovers, registry_with_plugins
from hydra import compose, initialize_config_module
from hydra.core.plugins import Plugins
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig

from axoexp import lease
from axoexp.config import register_configs
from axoexp.plugins import load_plugins
from axoexp.registry import Registry

# Hydra's launcher plugins store their configs when first discovered. Discovered here, before any
# test runs: Hydra's launcher test suite (test_worker_pool) restores its singletons after each test,
# which dropped a plugin discovered during the test (the ray preset then missed hydra/launcher/ray).
Plugins.instance()

if not torch.cuda.is_available():  # before anything imports triton: it fixes the mode at import
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the fused kernels then run in Triton's CPU interpreter

SHARED_SESSION_FIXTURES = ("ray_cluster", "killed_runs")
"""Costly session fixtures: under pytest-xdist (``-n 2 --dist loadgroup``) the tests of each run on
one worker, which starts it once; so do the tests of one module that share a module-scoped fixture."""


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, each worker gets a temporary folder (``$TMPDIR``) and device leases of its
    own: a test that checks /tmp for what its processes left sees only its worker's, and the two
    workers' runs never wait for each other's lease."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return
    folder = tempfile.mkdtemp(prefix=f"ax-{worker}-")  # short: Ray's socket paths must fit 107 bytes
    os.chmod(folder, 0o755)  # as /tmp's folders are: the postgres user reaches its data directory (postgres)
    config.stash[WORKER_TMP] = folder
    os.environ["TMPDIR"] = folder
    tempfile.tempdir = None  # gettempdir() reads $TMPDIR again
    os.environ[lease.LEASE_DIR_ENV] = str(Path(folder) / "axoexp-leases")


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(WORKER_TMP, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


WORKER_TMP = pytest.StashKey[str]()


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups into the tests' ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        definitions = item._fixtureinfo.name2fixturedefs  # type: ignore[attr-defined]
        shared = [name for name in SHARED_SESSION_FIXTURES if name in definitions]
        if not shared and any(fixture.scope == "module" for defs in definitions.values() for fixture in defs):
            shared = [item.module.__name__]  # type: ignore[attr-defined]
        if shared:
            item.add_marker(pytest.mark.xdist_group(shared[0]))


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated, empty sqlite MLflow store: each test copies it, as migrating one takes seconds."""
    path = tmp_path_factory.mktemp("store") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def migrated_store(tmp_path: Path, empty_store: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``tmp_path/mlflow.db``, a copy of the empty store: the default store of a command run in
    ``tmp_path``, which then skips creating it (seconds). Tests of store creation do without. The
    test runs in ``tmp_path``: MLflow puts a sqlite store's artifacts under ``./mlruns`` of the
    process that creates its experiment (else the checkout's)."""
    shutil.copyfile(empty_store, tmp_path / "mlflow.db")
    monkeypatch.chdir(tmp_path)
    return tmp_path / "mlflow.db"


@pytest.fixture(scope="session")
def killed_runs(tmp_path_factory: pytest.TempPathFactory, empty_store: Path) -> dict[int, tuple[int, Path, Path]]:
    """Long runs killed -9 once they journaled 5, 15, 20 and 30 updates, for the tests of sync
    (test_faults.py, test_faults_store.py), each test its own: by updates, the run's pid, its
    journal and its folder. They start at once, each in a folder with a copy of the empty store
    and a lease folder of its own (else each waits for the CPU lease another holds)."""
    from test_faults import LONG_RUN, start_cli, wait_for_updates

    started = {}
    for updates in (5, 15, 20, 30):
        folder = tmp_path_factory.mktemp(f"killed{updates}")
        shutil.copyfile(empty_store, folder / "mlflow.db")
        started[updates] = folder, start_cli(*LONG_RUN, cwd=folder, env={lease.LEASE_DIR_ENV: str(folder / "leases")})
    killed = {}
    try:
        for updates, (folder, process) in started.items():
            (journal,) = wait_for_updates(folder / "outputs", updates, process)
            process.kill()
            process.communicate(timeout=60)
            killed[updates] = process.pid, journal, folder
    finally:
        for _, process in started.values():
            if process.poll() is None:
                process.kill()
                process.communicate()
    return killed


@pytest.fixture
def tracking_uri(migrated_store: Path) -> str:
    return f"sqlite:///{migrated_store}"


@pytest.fixture
def client(tracking_uri: str) -> MlflowClient:
    return MlflowClient(tracking_uri=tracking_uri)


@pytest.fixture(scope="session")
def loaded_registry() -> Registry:
    """The process registry with built-ins and the shipped plugins, their configs stored."""
    registry = load_plugins(REPO / "plugins")
    register_configs(registry)
    return registry


@pytest.fixture(scope="session")
def plugin_registry(loaded_registry: Registry) -> Registry:
    """The process registry plus the tests' own plugins (``helpers.PLUGINS``)."""
    return registry_with_plugins(PLUGINS)


@pytest.fixture
def registry(loaded_registry: Registry) -> Registry:
    """A copy for one test: components it registers do not leak into other tests."""
    return loaded_registry.copy()


@pytest.fixture
def make_config(tracking_uri: str, loaded_registry: Registry) -> Callable[..., DictConfig]:
    """Compose the real Hydra config with overrides, logging to this test's store."""

    def make(*overrides: str) -> DictConfig:
        with initialize_config_module(config_module="axoexp.conf", version_base="1.3"):
            return compose("config", overrides=[f"tracking.uri={tracking_uri}", *overrides])

    return make


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[tuple[str, Path, dict[str, str]]]:
    """A local Ray head (2 CPUs) the tests connect to, as to an existing cluster, started once for
    the session (the Ray sweep and the Ray kill test share it); its workers load plugins from the
    yielded directory, where each test writes its own. Stopped by its process group, checked gone."""
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")
    before = set(os.listdir(tempfile.gettempdir()))
    root = Path(tempfile.mkdtemp(prefix="axray"))  # short: Ray's socket paths must fit 107 bytes
    plugins = root / "plugins"
    for folder in (plugins, root / "home", root / "tmp"):
        folder.mkdir()
    port = free_port()
    # its own HOME and TMPDIR: another Ray's ~/.ray/auth_token once made every test here hang
    private = {"HOME": str(root / "home"), "TMPDIR": str(root / "tmp")}
    env = {
        **os.environ,
        **RAY_PORT_ENV,
        **private,
        "AXOEXP_PLUGINS_DIR": str(plugins),
        lease.LEASE_DIR_ENV: str(root / "leases"),
    }
    ray = str(Path(sys.executable).with_name("ray"))
    head = subprocess.Popen(
        [
            ray,
            "start",
            "--head",
            "--block",
            "--node-ip-address",
            "127.0.0.1",
            "--port",
            str(port),
            "--num-cpus",
            "2",
            "--include-dashboard=false",
            "--disable-usage-stats",
            "--temp-dir",
            str(root / "ray"),
        ],
        cwd=root,
        env=env,
        stdout=(root / "ray.log").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while subprocess.run([ray, "status", "--address", address], env=env, capture_output=True).returncode:
            assert head.poll() is None and time.monotonic() < deadline, (root / "ray.log").read_text()[-3000:]
            time.sleep(1)
        yield address, plugins, private
    finally:
        family = [psutil.Process(head.pid), *psutil.Process(head.pid).children(recursive=True)]
        os.killpg(head.pid, signal.SIGKILL)  # the head's process group: what this fixture started
        _, alive = psutil.wait_procs(family, timeout=30)
        assert alive == [] and leftovers(str(root)) == [], f"Ray processes outlived the session: {alive}"
        shutil.rmtree(root)
        created = set(os.listdir(tempfile.gettempdir())) - before
        assert not [name for name in created if name.startswith(("ray", "axray"))], f"left in /tmp: {created}"


PG_BIN = Path("/usr/lib/postgresql/15/bin")  # Debian's PostgreSQL 15 (.ci/run installs it)


def _as_postgres(command: list[str]) -> list[str]:
    """``command`` as the ``postgres`` user when this is root (PostgreSQL refuses to run as root)."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@pytest.fixture
def postgres() -> Iterator[str]:
    """A PostgreSQL 15 server of its own on 127.0.0.1 with an empty database, started as the
    ``postgres`` user on a data directory of the test's own, never the system's; its store URI."""
    if not (PG_BIN / "initdb").is_file():
        pytest.skip(f"PostgreSQL 15 is not installed ({PG_BIN}/initdb is absent): apt-get install -y postgresql")
    pytest.importorskip("psycopg2", reason="MLflow needs psycopg2 for PostgreSQL: pip install -e '.[dev]'")
    root = Path(tempfile.mkdtemp(prefix="axpg"))
    root.chmod(0o755)  # the postgres user reaches its data directory and socket through it
    data, sockets = root / "data", root / "sockets"
    for directory in (data, sockets):
        directory.mkdir()
        if os.geteuid() == 0:
            shutil.chown(directory, "postgres", "postgres")
    port = free_port()
    pg_ctl = _as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(data), "-w", "-t", "120"])
    try:
        subprocess.run(
            _as_postgres([str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"]),
            check=True,
            capture_output=True,
            timeout=300,
        )
        options = f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run(
            [*pg_ctl, "-l", str(sockets / "postgres.log"), "-o", options, "start"],
            check=True,
            capture_output=True,
            timeout=300,
        )
        subprocess.run(
            _as_postgres([str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "mlflow"]),
            check=True,
            capture_output=True,
            timeout=120,
        )
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/mlflow"  # SQLAlchemy 2.1 defaults to psycopg 3
    finally:
        subprocess.run([*pg_ctl, "-m", "immediate", "stop"], capture_output=True, timeout=300)
        assert leftovers(str(data)) == [], "PostgreSQL outlived the test"
        shutil.rmtree(root, ignore_errors=True)
