"""Refused early, for real: a store that cannot be written or that MLflow refuses (a file store), a
checkpoint that cannot be read or fails its pin, a loss that fails on the population's predictions
and a population whose batches are empty are found while planning, before any MLflow run exists."""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import re
from collections.abc import Callable
from pathlib import Path

import mlflow
import pytest
import torch
from axosim.checkpoint import save_checkpoint
from helpers import DRIVERLESS, run_clis
from mlflow.environment_variables import MLFLOW_ALLOW_FILE_STORE, MLFLOW_TRACKING_URI
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from axoexp.compare import main as compare_main
from axoexp.components.population import lite, make_lite_model, sha256_of
from axoexp.config import register_configs, unchosen_group
from axoexp.errors import ConfigError, IncompatibleComponentsError
from axoexp.executors.eager import EagerExecutor
from axoexp.experiment import run_experiment
from axoexp.interfaces import LossFn, PopulationSetup
from axoexp.journal import JOURNAL_FILE
from axoexp.plan import plan_experiment, update_problems
from axoexp.registry import Registry
from axoexp.report.__main__ import main as report_main
from axoexp.sync import main as sync_main
from axoexp.tracking import file_store_problem, store_problem


def _no_runs(client: MlflowClient) -> bool:
    experiment = client.get_experiment_by_name("axoexp")
    return experiment is None or client.search_runs([experiment.experiment_id]) == []


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_a_store_in_a_pseudo_file_system_is_refused_while_planning(make_config: Callable) -> None:
    with pytest.raises(
        ConfigError, match=r"tracking.uri=sqlite:////proc/x.db: no file can be created in /proc; choose a writable"
    ):
        plan_experiment(make_config("tracking.uri=sqlite:////proc/x.db"))


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "lite.pt"
    path.write_bytes(b"planning reads and hashes the file, it does not unpickle it")
    return path


@pytest.mark.parametrize(
    "override, message",
    [
        ("population.checkpoint_sha256=00ff", r"has SHA-256 [0-9a-f]{64}, but population.checkpoint_sha256 pins 00ff"),
        ("population.checkpoint=/nonexistent/lite.pt", r"population.checkpoint='/nonexistent/lite.pt' is not a file"),
        ("population.checkpoint=/" + "x" * 100000, r"\(100001 characters\)' cannot be read: File name too long"),
    ],
)
def test_a_checkpoint_that_cannot_be_used_makes_no_run(
    make_config: Callable, client: MlflowClient, checkpoint: Path, override: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        run_experiment(make_config(f"population.checkpoint={checkpoint}", override, "run.measured_updates=1"))
    assert _no_runs(client), "the refusal left a run behind"


def test_a_pinned_checkpoint_passes_planning_and_a_pinned_file_that_is_none_is_refused(
    make_config: Callable, checkpoint: Path, tmp_path: Path
) -> None:
    saved = tmp_path / "saved.pt"
    save_checkpoint(
        make_lite_model(
            branches=8, route_features=5, token_dim=6, state_dim=3, morphologies=2, generator=torch.Generator()
        ),
        saved,
    )
    plan = plan_experiment(
        make_config(f"population.checkpoint={saved}", f"population.checkpoint_sha256={sha256_of(saved)}")
    )
    assert plan.device == torch.device("cpu")
    with pytest.raises(ConfigError, match=r"lite.pt' is pinned, but loading it as an axosim checkpoint failed"):
        plan_experiment(
            make_config(f"population.checkpoint={checkpoint}", f"population.checkpoint_sha256={sha256_of(checkpoint)}")
        )


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "population.checkpoint_sha256=abc",
            "population.checkpoint_sha256=abc pins the file of population.checkpoint, which is not set; "
            "set population.checkpoint too, or drop the pin",
        ),
        (
            "population.init_from_sha256=abc",
            "population.init_from_sha256=abc pins the banks of population.init_from, which is not set; "
            "set population.init_from (a run id or banks file) too, or drop the pin",
        ),
    ],
)
def test_a_pin_without_the_key_it_pins_makes_no_run(
    make_config: Callable, client: MlflowClient, override: str, message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        run_experiment(make_config(override, "run.measured_updates=1"))
    assert str(refused.value) == f"invalid experiment config: {message}"
    assert _no_runs(client), "the refusal left a run behind"


def test_lite_itself_refuses_a_checkpoint_pin_without_a_checkpoint() -> None:
    """As a plugin that wraps lite calls it, without planning's check of lite's settings."""
    with pytest.raises(ConfigError, match="population.checkpoint_sha256=abc pins the file of population.checkpoint"):
        lite(device=torch.device("cpu"), dtype=torch.float32, seed=0, checkpoint_sha256="abc")


FILE_STORES = ["afile/mlruns", "./mlruns", "file:rel/mlruns", "{tmp}/abs/mlruns", "file://{tmp}/uri/mlruns"]


@pytest.mark.parametrize("form", FILE_STORES)
def test_a_file_store_is_refused_while_planning_in_one_line(
    make_config: Callable, form: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(MLFLOW_ALLOW_FILE_STORE.name, raising=False)
    uri = form.format(tmp=tmp_path)
    with pytest.raises(ConfigError) as refused:
        run_experiment(make_config(f"tracking.uri={uri}", "run.measured_updates=1"))
    assert str(refused.value) == (
        f"invalid experiment config: tracking.uri={uri}: a file store, which MLflow {mlflow.__version__} refuses; "
        "use a database file, sqlite:///PATH (e.g. sqlite:///mlflow.db), or a tracking server, http(s)://HOST:PORT "
        "(mlflow migrate-filestore copies an existing file store into a database)"
    )
    assert [path.name for path in tmp_path.iterdir()] == ["mlflow.db"], "the refused run left a store behind"


def test_mlflow_refuses_a_file_store_unless_told_to_allow_it_and_planning_follows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refusal's premise, MLflow 3's own: were file stores usable again, this fails."""
    uri = f"file://{tmp_path}/mlruns"
    monkeypatch.delenv(MLFLOW_ALLOW_FILE_STORE.name, raising=False)
    with pytest.raises(MlflowException, match="filesystem tracking backend"):
        MlflowClient(tracking_uri=uri).search_experiments()
    assert store_problem(uri) is not None
    monkeypatch.setenv(MLFLOW_ALLOW_FILE_STORE.name, "yes")
    assert store_problem(uri) == (
        f"tracking.uri={uri}: a file store, and MLFLOW_ALLOW_FILE_STORE value must be one of ['true', 'false', "
        "'1', '0'] (case-insensitive), but got yes"
    )
    monkeypatch.setenv(MLFLOW_ALLOW_FILE_STORE.name, "true")
    assert store_problem(uri) is None
    assert [experiment.name for experiment in MlflowClient(tracking_uri=uri).search_experiments()] == ["Default"]


def test_a_file_store_from_the_environment_is_named_by_its_variable(
    make_config: Callable, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(MLFLOW_ALLOW_FILE_STORE.name, raising=False)
    monkeypatch.setenv(MLFLOW_TRACKING_URI.name, "mlruns")
    with pytest.raises(ConfigError, match=r"^invalid experiment config: \$MLFLOW_TRACKING_URI=mlruns: a file store"):
        plan_experiment(make_config("tracking.uri=null"))
    assert (
        file_store_problem("http://127.0.0.1:5000") is None and file_store_problem("postgresql://user@host/db") is None
    )


@pytest.mark.parametrize(
    ("uri", "guess"), [("postgres://u:p@dbhost/mlflow", "postgresql"), ("htp://127.0.0.1:5000", "http")]
)
def test_a_scheme_no_mlflow_store_has_is_refused_while_planning(
    uri: str, guess: str, make_config: Callable, capsys: pytest.CaptureFixture[str]
) -> None:
    """``postgres://`` (SQLAlchemy's old alias) or a typo ran, measured into its journal and then
    ended "unreachable" on MLflow's model-registry error, exit 1; it is refused while planning,
    with the scheme meant and MLflow's schemes, as sync and the readers refuse it."""
    scheme = uri.partition("://")[0]
    line = f"{uri.replace(':p@', ':***@')}: no MLflow store has the scheme {scheme}:// (did you mean {guess}://?); "
    with pytest.raises(ConfigError) as refused:
        plan_experiment(make_config(f"tracking.uri={uri}"))
    assert str(refused.value).startswith(f"invalid experiment config: tracking.uri={line}its schemes: ")
    assert "http, https, mssql, mysql, postgresql, sqlite" in str(refused.value)
    assert sync_main(["--tracking-uri", uri]) == 2
    assert capsys.readouterr().err.startswith(f"axoexp.sync: --tracking-uri={line}")


IN_MEMORY = "an in-memory store keeps nothing once the process ends; name a database file, e.g. sqlite:///mlflow.db"


@pytest.mark.parametrize(
    ("uri", "why"),
    [
        (
            "sqlite://x.db",
            "a sqlite URI has three slashes before a relative path and four before an absolute one: "
            "did you mean sqlite:///x.db (or sqlite:////x.db)?",
        ),
        ("sqlite:///:memory:", IN_MEMORY),
        ("sqlite://", IN_MEMORY),
    ],
)
def test_a_sqlite_uri_that_names_no_database_file_is_refused_while_planning(
    uri: str,
    why: str,
    make_config: Callable,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``sqlite://x.db`` (two slashes) left an empty journal and ended in SQLAlchemy's traceback (Invalid
    SQLite URL); an in-memory store ran the whole experiment, then failed "no such table", advised a
    sync into another in-memory store and left a ``:memory:.lock`` file. Each is refused while
    planning, and by sync, the report and compare, in one line (exit 2), and nothing is created."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    with pytest.raises(ConfigError) as refused:
        plan_experiment(make_config(f"tracking.uri={uri}"))
    assert str(refused.value) == f"invalid experiment config: tracking.uri={uri}: {why}"
    assert sync_main(["--tracking-uri", uri]) == 2
    for main, args in ((report_main, []), (compare_main, ["--latest", "2"])):
        with pytest.raises(SystemExit) as ended:
            main(["--tracking-uri", uri, *args])
        assert ended.value.code == 2
    commands = ("axoexp.sync", "axoexp.report", "axoexp.compare")
    assert capsys.readouterr().err.splitlines() == [f"{command}: --tracking-uri={uri}: {why}" for command in commands]
    assert list(cwd.iterdir()) == []


@pytest.mark.skipif(DRIVERLESS is None, reason="pyodbc, pymysql and pg8000 are all installed")
def test_a_database_store_without_its_driver_is_refused_while_planning(
    make_config: Callable, capsys: pytest.CaptureFixture[str]
) -> None:
    """A database URI whose driver is not installed ran, left an empty journal and ended in a traceback
    (ModuleNotFoundError from SQLAlchemy), exit 1; it is refused while planning, naming the driver,
    as is a driver or a database neither SQLAlchemy nor MLflow knows. An installed driver passes."""
    assert DRIVERLESS is not None
    uri, module = DRIVERLESS
    scheme = uri.partition("://")[0]
    line = (
        f"{uri.replace(':p@', ':***@')}: {scheme}:// needs the Python driver {module}, which is not installed; "
        f"install it (pip install {module}) or name an installed one ({scheme.split('+')[0]}+DRIVER://)"
    )
    with pytest.raises(ConfigError) as refused:
        plan_experiment(make_config(f"tracking.uri={uri}"))
    assert str(refused.value) == f"invalid experiment config: tracking.uri={line}"
    assert sync_main(["--tracking-uri", uri]) == 2
    assert capsys.readouterr().err == f"axoexp.sync: --tracking-uri={line}\n"
    assert store_problem("postgresql+nodriver://h/db") == (
        "tracking.uri=postgresql+nodriver://h/db: SQLAlchemy cannot use it (Can't load plugin: "
        "sqlalchemy.dialects:postgresql.nodriver)"
    )
    assert store_problem("postgresqlx://h/db") == (
        "tracking.uri=postgresqlx://h/db: Invalid database engine: 'postgresqlx'. Supported database engines are "
        "postgresql, mysql, sqlite, mssql"
    )
    installed = [name for name in ("psycopg", "psycopg2", "pymysql", "pg8000") if importlib.util.find_spec(name)]
    for name in installed:  # postgresql+psycopg2 where .[dev] is installed (the cluster recipe's)
        dialect = "mysql" if name == "pymysql" else "postgresql"
        assert store_problem(f"{dialect}+{name}://u:p@127.0.0.1:1/db") is None


def test_a_store_path_through_a_file_names_that_file(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    for uri in (f"sqlite:///{tmp_path}/afile/m.db", f"sqlite:///{tmp_path}/afile/deeper/m.db"):
        assert (
            store_problem(uri)
            == f"tracking.uri={uri}: {tmp_path / 'afile'} is a file, not a directory; choose another path"
        )
    uri = f"sqlite:///{tmp_path}/none/m.db"
    assert (
        store_problem(uri)
        == f"tracking.uri={uri}: directory {tmp_path / 'none'} does not exist; create it or choose another path"
    )


def _bare_lite(*, device: torch.device, dtype: torch.dtype, seed: int, neurons: int = 3) -> PopulationSetup:
    """``lite`` wrapped as a plugin might, with neither its bounds nor its memory estimate (so planning
    builds it on the meta device)."""
    return lite(device=device, dtype=dtype, seed=seed, neurons=neurons)


def _wrong_axis() -> LossFn:
    return lambda prediction, target: (prediction - target).pow(2).mean(dim=7)


def _unreduced() -> LossFn:
    return lambda prediction, target: (prediction - target).pow(2)


class _Fixed(torch.nn.Module):
    """A module that adapts nothing of its own accord: no ``trainable_adaptation_parameters()``."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = torch.nn.Parameter(torch.ones(2))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return inputs[..., :2] * self.gain


class _Frozen(_Fixed):
    def trainable_adaptation_parameters(self) -> list[torch.nn.Parameter]:
        return []


def _batches(device: torch.device, dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    inputs = torch.ones(3, 12, 4, device=device, dtype=dtype)
    return [(inputs, torch.zeros(3, 12, 2, device=device, dtype=dtype))]


def _a_tuple(*, device: torch.device, dtype: torch.dtype, seed: int) -> object:
    return _Fixed().to(device, dtype), _batches(device, dtype)


class _Unreached(_Fixed):
    """A bank its predictions never use (as every output of a batch all warm-up)."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return inputs[..., :2] * 1.0

    def trainable_adaptation_parameters(self) -> list[torch.nn.Parameter]:
        return [self.gain]


def _unreached(*, device: torch.device, dtype: torch.dtype, seed: int) -> PopulationSetup:
    return PopulationSetup(module=_Unreached().to(device, dtype), batches=_batches(device, dtype))


def _an_int(*, device: torch.device, dtype: torch.dtype, seed: int) -> object:
    return 3


def _no_banks(*, device: torch.device, dtype: torch.dtype, seed: int) -> PopulationSetup:
    return PopulationSetup(module=_Fixed().to(device, dtype), batches=_batches(device, dtype))


def _frozen(*, device: torch.device, dtype: torch.dtype, seed: int) -> PopulationSetup:
    return PopulationSetup(module=_Frozen().to(device, dtype), batches=_batches(device, dtype))


def _raises(*, device: torch.device, dtype: torch.dtype, seed: int) -> PopulationSetup:
    raise RuntimeError("no such recording")


_raises.memory_estimate = lambda params, dtype: 0  # type: ignore[attr-defined]  # small: planning builds it on the CPU


def _after_warmup() -> LossFn:
    return lambda prediction, target: (prediction[:, 12:] - target[:, 12:]).pow(2).mean()


def _targets_only() -> LossFn:
    return lambda prediction, target: (prediction.detach() - target).pow(2).mean()


def _strict_sgd(*, parameters: list[torch.nn.Parameter], capturable: bool, lr: float = 0.1) -> torch.optim.Optimizer:
    if lr > 1:
        raise ValueError(f"Invalid learning rate: {lr}")
    return torch.optim.SGD(parameters, lr=lr)


def _tensor_lr(*, parameters: list[torch.nn.Parameter], capturable: bool) -> torch.optim.Optimizer:
    return torch.optim.Adam(parameters, lr=torch.tensor(1e-3), foreach=True, capturable=capturable)


def _held_out(cut: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., PopulationSetup]:
    """``lite`` with its held-out batches cut (fewer time steps, fewer cells); built on the CPU."""

    def build(*, device: torch.device, dtype: torch.dtype, seed: int) -> PopulationSetup:
        setup = lite(device=device, dtype=dtype, seed=seed)
        return dataclasses.replace(setup, eval_batches=[(cut(i), cut(t)) for i, t in setup.eval_batches])

    build.memory_estimate = lambda params, dtype: 0  # type: ignore[attr-defined]
    return build


def _hooked(**hooks: Callable[..., object]) -> Callable[..., PopulationSetup]:
    """``lite`` whose factory has ``hooks`` (memory_estimate, config_problems) as a plugin's may."""

    def build(*, device: torch.device, dtype: torch.dtype, seed: int) -> PopulationSetup:
        return lite(device=device, dtype=dtype, seed=seed)

    for name, hook in hooks.items():
        setattr(build, name, hook)
    return build


class _YesRefuses(EagerExecutor):
    """An executor whose refusal answers ``True`` rather than a reason."""

    @classmethod
    def refusal(cls, *, module: torch.nn.Module, dtype: torch.dtype) -> str | None:
        return True  # type: ignore[return-value]


def _no_estimate(params: object, dtype: object) -> int:
    raise KeyError("cells")


@pytest.fixture
def wrapped(registry: Registry) -> Registry:
    registry.register("population", "short_held_out", _held_out(lambda t: t[..., :4, :]), source=__file__)
    registry.register("population", "six_steps_held_out", _held_out(lambda t: t[..., :6, :]), source=__file__)
    registry.register("population", "fewer_cells_held_out", _held_out(lambda t: t[..., :2, :, :]), source=__file__)
    registry.register("population", "estimate_none", _hooked(memory_estimate=lambda p, d: None), source=__file__)
    registry.register("population", "estimate_text", _hooked(memory_estimate=lambda p, d: "4 MiB"), source=__file__)
    registry.register("population", "estimate_nan", _hooked(memory_estimate=lambda p, d: float("nan")), source=__file__)
    registry.register("population", "estimate_raises", _hooked(memory_estimate=_no_estimate), source=__file__)
    registry.register("executor", "yes_refuses", _YesRefuses, source=__file__)
    registry.register("population", "problems_text", _hooked(config_problems=lambda p, c: "too short"), source=__file__)
    registry.register("population", "bare_lite", _bare_lite, source=__file__)
    registry.register("population", "a_tuple", _a_tuple, source=__file__)
    registry.register("population", "an_int", _an_int, source=__file__)
    registry.register("population", "no_banks", _no_banks, source=__file__)
    registry.register("population", "frozen", _frozen, source=__file__)
    registry.register("population", "raises", _raises, source=__file__)
    registry.register("population", "unreached", _unreached, source=__file__)
    registry.register("loss", "wrong_axis", _wrong_axis, source=__file__)
    registry.register("loss", "unreduced", _unreduced, source=__file__)
    registry.register("loss", "after_warmup", _after_warmup, source=__file__)
    registry.register("loss", "targets_only", _targets_only, source=__file__)
    registry.register("optimizer", "strict_sgd", _strict_sgd, source=__file__)
    registry.register("optimizer", "tensor_lr", _tensor_lr, source=__file__)
    register_configs(registry)
    return registry


@pytest.mark.parametrize(
    "population, message",
    [
        (
            "a_tuple",
            "population=a_tuple returns a tuple, not an axoexp.interfaces.PopulationSetup(module=..., batches=...)",
        ),
        ("an_int", "population=an_int returns an int, not an axoexp.interfaces.PopulationSetup("),
        ("no_banks", "population=no_banks builds a _Fixed without trainable_adaptation_parameters(), which names"),
        ("frozen", "population=frozen builds a _Frozen whose trainable_adaptation_parameters() is empty"),
        ("raises", "population=raises cannot be built: RuntimeError: no such recording"),
    ],
)
def test_a_population_that_is_no_population_to_adapt_is_refused_while_planning(
    make_config: Callable, wrapped: Registry, client: MlflowClient, population: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"invalid experiment config: {message}")):
        run_experiment(make_config(f"population={population}", "loss=mse"), registry=wrapped)
    assert _no_runs(client), "the refusal left a run behind"


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ("population=short_held_out", "loss=mse"),
            "population=short_held_out builds held-out batch 0 of 4 time steps: AxoSim-Lite's first 4 outputs are "
            "warm-up, with no gradient to adapt on, so every batch needs more than 4 time steps",
        ),
        (
            ("population=six_steps_held_out", "loss=causal_mse", "loss.warmup_steps=6"),
            "loss=causal_mse on held-out batch 0: ",
        ),
        (
            ("population=fewer_cells_held_out", "loss=mse"),
            "loss=mse: a forward and loss of this population's held-out batch 0 raise ValueError: ",
        ),
    ],
)
def test_held_out_batches_are_planned_as_the_training_ones_are(
    make_config: Callable, wrapped: Registry, overrides: tuple[str, ...], message: str
) -> None:
    """Held-out batches were never planned: all warm-up, they printed ``eval loss 0 -> 0``; too short
    for a causal loss, or of other cells, the run ended FAILED (a 70-line traceback for the latter)."""
    with pytest.raises(ConfigError, match="^" + re.escape(f"invalid experiment config: {message}")):
        plan_experiment(make_config(*overrides), wrapped)


@pytest.mark.parametrize(
    "population, message",
    [
        ("estimate_none", "memory_estimate hook ({source}) returns None, not a number of bytes (an int of 0 or more)"),
        ("estimate_text", "memory_estimate hook ({source}) returns a str ('4 MiB'), not a number of bytes"),
        ("estimate_nan", "memory_estimate hook ({source}) returns a float (nan), not a number of bytes"),
        ("estimate_raises", "memory_estimate hook ({source}) raised KeyError: 'cells'"),
        ("problems_text", "config_problems hook ({source}) returns a str, not a list of problems (a line each; []"),
    ],
)
def test_a_factory_hook_that_returns_no_answer_is_one_line_naming_it(
    make_config: Callable, wrapped: Registry, population: str, message: str
) -> None:
    """A memory_estimate returning None, text or NaN, or raising, was a 53-line traceback; a
    config_problems returning a string was one "problem" per character."""
    refused = f"invalid experiment config: population={population}'s {message.format(source=__file__)}"
    with pytest.raises(ConfigError, match="^" + re.escape(refused)):
        plan_experiment(make_config(f"population={population}"), wrapped)


def test_an_executor_whose_refusal_is_no_reason_says_so(make_config: Callable, wrapped: Registry) -> None:
    """``cannot run this experiment: True`` said nothing of why."""
    with pytest.raises(ConfigError) as refused:
        plan_experiment(make_config("executor=yes_refuses"), wrapped)
    assert str(refused.value).startswith(
        f"invalid experiment config: executor=yes_refuses cannot run this experiment: executor=yes_refuses's refusal "
        f"hook ({__file__}) returns a bool (True), not a reason (a str) or None; executors that can: eager"
    )


def test_a_loss_that_is_not_finite_before_any_update_is_refused_while_planning(
    make_config: Callable, wrapped: Registry
) -> None:
    with pytest.raises(ConfigError, match=r"loss=after_warmup is nan on this population's shortest batch before"):
        plan_experiment(make_config("loss=after_warmup"), wrapped)


@pytest.mark.parametrize(
    "overrides, cause",
    [
        (("loss=targets_only",), "the predictions carry one, and the loss drops it (.detach(), .item() or NumPy"),
        (("population=unreached", "loss=mse"), "the population's predictions carry none (e.g. every output is a"),
    ],
)
def test_a_loss_that_no_bank_reaches_is_refused_while_planning_naming_where_the_gradient_is_lost(
    make_config: Callable, wrapped: Registry, overrides: tuple[str, ...], cause: str
) -> None:
    """No gradient from the loss to the banks, the run's updates would adapt nothing: the loss detaches
    the predictions, or the predictions never reach a bank (a plugin population's too-short batches)."""
    loss = overrides[-1].partition("=")[2]
    refused = f"loss={loss} on this population's shortest batch (12 time steps) depends on none of the banks"
    with pytest.raises(ConfigError, match=re.escape(refused) + ".*: " + re.escape(cause)):
        plan_experiment(make_config(*overrides), wrapped)


def test_an_optimizer_that_refuses_its_settings_is_refused_while_planning(
    make_config: Callable, wrapped: Registry
) -> None:
    with pytest.raises(
        ConfigError, match=r"optimizer=strict_sgd refuses its settings: ValueError: Invalid learning rate"
    ):
        plan_experiment(make_config("optimizer=strict_sgd", "optimizer.lr=2"), wrapped)
    assert plan_experiment(make_config("optimizer=strict_sgd"), wrapped).shape == "3x12x4"


def test_the_optimizer_is_built_while_planning_as_capturable_as_the_run_builds_it(
    make_config: Callable, wrapped: Registry
) -> None:
    """A tensor learning rate with foreach is torch's ValueError unless capturable (a CUDA graph's):
    planning builds over the probe's parameters with the capturable the run resolves."""
    plan = plan_experiment(make_config(), wrapped)
    probe = plan.probe  # on the meta device, as planning leaves it
    assert probe is not None
    components, params = {**plan.components, "optimizer": wrapped.get("optimizer", "tensor_lr")}, dict(plan.params)
    params["optimizer"] = {}
    assert update_problems(components, params, probe, torch.device("cpu"), capturable=True) == []
    (refusal,) = update_problems(components, params, probe, torch.device("cpu"), capturable=False)
    assert refusal.startswith("optimizer=tensor_lr refuses its settings: ValueError: lr as a Tensor is not supported")


def test_a_checkpoint_that_is_not_one_is_refused_while_planning(
    make_config: Callable, client: MlflowClient, checkpoint: Path
) -> None:
    with pytest.raises(
        ConfigError,
        match=r"population.checkpoint='.*lite.pt' is not a weights-only checkpoint: loading it would run code",
    ):
        run_experiment(make_config(f"population.checkpoint={checkpoint}"))
    assert _no_runs(client), "the refusal left a run behind"


def test_a_loss_that_fails_on_the_cpu_built_population_is_refused_while_planning(
    make_config: Callable, wrapped: Registry
) -> None:
    with pytest.raises(ConfigError) as refused:
        plan_experiment(make_config("loss=wrong_axis"), wrapped)
    assert str(refused.value) == (
        "invalid experiment config: loss=wrong_axis: a forward and loss of this population's shortest batch raise "
        "IndexError: Dimension out of range (expected to be in range of [-3, 2], but got 7)"
    )


def test_a_loss_that_fails_on_the_meta_built_population_is_left_to_the_run(
    make_config: Callable, wrapped: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="axoexp.plan"):
        plan = plan_experiment(make_config("population=bare_lite", "loss=wrong_axis"), wrapped)
    assert plan.shape == "3x12x4"
    assert "loss wrong_axis cannot be evaluated on the meta-built population (Dimension out of range" in caplog.text


@pytest.mark.parametrize("population", ["lite", "bare_lite"])
def test_a_loss_that_is_not_a_scalar_is_refused_while_planning(
    make_config: Callable, wrapped: Registry, population: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        plan_experiment(make_config(f"population={population}", "loss=unreduced"), wrapped)
    assert str(refused.value) == (
        "invalid experiment config: loss=unreduced returns a tensor of shape (3, 12, 2), not a scalar: an update's "
        "backward needs one number; reduce it (e.g. .mean())"
    )


def test_empty_batches_are_refused_while_planning_naming_the_population_and_the_empty_axis(
    make_config: Callable, wrapped: Registry
) -> None:
    with pytest.raises(ConfigError) as refused:
        plan_experiment(make_config("population=bare_lite", "population.neurons=0"), wrapped)
    assert str(refused.value) == (
        "invalid experiment config: population=bare_lite builds empty batches: batch 0's inputs have shape "
        "(0, 12, 4) (population, time, channels): its population axis is empty, so every loss over them is NaN; "
        "check its population.* settings"
    )
    plan = plan_experiment(make_config("population=bare_lite"), wrapped)
    plan.params["population"]["neurons"] = 0  # as if planning could not build it: the run's build finds it
    with pytest.raises(IncompatibleComponentsError, match=r"population=bare_lite builds empty batches"):
        plan.build_population()


@pytest.mark.slow  # four commands, each a process
def test_bad_loss_values_a_file_store_and_a_driverless_database_exit_2_in_one_line_before_any_run(
    tmp_path: Path,
) -> None:
    commands = {
        ("loss.warmup_steps=abc",): "axoexp: loss.warmup_steps=abc: Value 'abc' of type 'str' could not be "
        "converted to Integer",
        ("loss=huber", "loss.delta=-1"): "axoexp: invalid experiment config: loss.delta=-1.0: must be greater than 0",
        ("tracking.uri=afile/mlruns",): "axoexp: invalid experiment config: tracking.uri=afile/mlruns: a file store,",
    }
    if DRIVERLESS is not None:  # it began a journal, then ended in a traceback
        uri, module = DRIVERLESS
        commands[(f"tracking.uri={uri}",)] = (
            f"axoexp: invalid experiment config: tracking.uri={uri.replace(':p@', ':***@')}: "
            f"{uri.partition('://')[0]}:// needs the Python "
            f"driver {module}, which is not installed"
        )
    folders = [tmp_path / str(index) for index in range(len(commands))]
    for folder in folders:
        folder.mkdir()
    env = {MLFLOW_ALLOW_FILE_STORE.name: "false", MLFLOW_TRACKING_URI.name: ""}
    results = run_clis([(arguments, folder, env) for arguments, folder in zip(commands, folders, strict=True)])
    for (arguments, expected), folder, result in zip(commands.items(), folders, results, strict=True):
        assert (result.returncode, result.stdout) == (2, ""), (arguments, result.stderr)
        assert result.stderr.startswith(expected) and result.stderr.count("\n") == 1, (arguments, result.stderr)
        assert [path.name for path in folder.iterdir()] in ([], ["outputs"]), "a store or a run was made"
        assert not list(folder.rglob(JOURNAL_FILE)), (arguments, "a journal was begun")


def test_keys_a_plus_override_added_are_refused_naming_the_valid_keys(make_config: Callable) -> None:
    """Hydra's ``+key=value`` adds any key; outside the components nothing would read it."""
    with pytest.raises(ConfigError) as refused:
        plan_experiment(make_config("+foo=3", "+tracking.urii=x"))
    message = str(refused.value)
    assert "foo: no such key; top-level keys: population, loss, optimizer," in message
    assert "tracking.urii: no such key in tracking (did you mean uri?); its keys: uri, experiment," in message
    plan_experiment(make_config("+experiment=sweep_cpu"))  # a group's option adds no key


@pytest.mark.parametrize("override", ["loss=null", "+loss=null", "~loss", "loss=mse,null"])
def test_a_group_left_without_an_option_is_one_line_naming_the_options(
    override: str, loaded_registry: Registry
) -> None:
    options = ", ".join(sorted(loaded_registry.names("loss")))
    assert unchosen_group(["-m", "seed=1", override], loaded_registry) == (
        f"{override}: every run needs a loss option; valid loss options: {options}"
    )
    assert unchosen_group(["loss=mse", "-m", "loss=mse,huber", "seed=null"], loaded_registry) is None
