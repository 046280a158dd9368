"""The adapted banks are the run's result: kept weights-only with their digest, evaluated on
held-out batches, and loaded exactly to start another run (population.init_from), or refused
before any run exists."""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import REPO, free_port, run_cli
from mlflow.tracking import MlflowClient
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from axoexp import names
from axoexp.banks import BANKS_FILE, FORMAT, adapted_banks, read_initial_banks
from axoexp.components.population import lite, sha256_of
from axoexp.console import format_result
from axoexp.errors import BanksError, ConfigError
from axoexp.executors.eager import EagerExecutor
from axoexp.experiment import run_experiment
from axoexp.interfaces import PopulationSetup
from axoexp.plan import plan_experiment
from axoexp.registry import Registry
from axoexp.tracking import runs_view

SHORT = ("run.warmup_updates=2", "run.measured_updates=6", "loss=causal_mse")


class InterruptedOnUpdate(EagerExecutor):
    """Ctrl-C arrives during update ``stop_at`` (counted from 1)."""

    stop_at = 3
    calls = 0

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        type(self).calls += 1
        if type(self).calls == self.stop_at:
            raise KeyboardInterrupt
        return super().step(inputs, targets)


@functools.wraps(lite)  # lite's signature, so lite's config node fits it
def not_on_meta(**params: Any) -> PopulationSetup:
    """lite, by a factory that cannot build on the meta device, and holds out no batches."""
    if params["device"].type == "meta":
        raise NotImplementedError("needs real tensors")
    setup = lite(**params)
    return PopulationSetup(setup.module, setup.batches, setup.description)


del not_on_meta.memory_estimate  # wraps copied lite's; without one, planning builds on meta (plan.probe_device)


@pytest.fixture
def banks_registry(registry: Registry) -> Registry:
    registry.register("executor", "test_interrupted", InterruptedOnUpdate, source="tests/test_banks.py")
    registry.register("population", "lite_twin", lite, source="tests/test_banks.py")  # same module, other kind
    registry.register("population", "not_on_meta", not_on_meta, source="tests/test_banks.py")
    return registry


def _runs(client: MlflowClient) -> list:
    experiment = client.get_experiment_by_name("axoexp")
    return client.search_runs([experiment.experiment_id]) if experiment else []


def _folder(path: Path) -> Path:
    path.mkdir()
    return path


def _artifact(client: MlflowClient, run_id: str, where: Path) -> Path:
    return Path(client.download_artifacts(run_id, BANKS_FILE, str(where)))


@pytest.mark.slow
def test_a_finished_run_keeps_its_banks_and_evaluates_them_on_held_out_batches(make_config, client, tmp_path) -> None:
    result = run_experiment(make_config(*SHORT), output_dir=_folder(tmp_path / "out"))
    run = client.get_run(result.run_id)
    tags, metrics = run.data.tags, run.data.metrics
    file = _artifact(client, result.run_id, tmp_path / "dl")
    assert tags[names.BANKS_ARTIFACT] == BANKS_FILE and tags[names.BANKS_SHA256] == sha256_of(file)
    assert (
        tags[names.BANKS_SHAPES] == "behavior_adapter=(3, 44) morphology_adapter=(2, 44) synaptic_log_efficacy=(3, 4)"
    )
    assert tags[names.BANKS_UPDATES] == "8"
    saved = load_file(file)
    assert list(saved) == ["behavior_adapter", "morphology_adapter", "synaptic_log_efficacy"]
    assert sha256_of(tmp_path / "out" / BANKS_FILE) == tags[names.BANKS_SHA256], "the local copy is the artifact"

    # the banks really moved, and the held-out loss says whether that generalised
    fresh = plan_experiment(make_config(*SHORT)).build_population()
    assert all(not torch.equal(saved[name], bank.detach()) for name, bank in adapted_banks(fresh.module).items())
    assert metrics[names.EVAL_LOSS_BEFORE] == result.eval_loss_before
    assert metrics[names.EVAL_LOSS_AFTER] == result.eval_loss_after < result.eval_loss_before
    assert result.eval_batches == 2
    held_out = {tensor.numpy().tobytes() for batch in fresh.eval_batches for tensor in batch}
    adapted_on = {tensor.numpy().tobytes() for batch in fresh.batches for tensor in batch}
    assert len(held_out) == 4 and not held_out & adapted_on, "no held-out batch is adapted on"

    summary = format_result(result)
    assert re.search(r"eval loss +[0-9.]+ -> [0-9.]+ +\(held-out, 2 batches never adapted on\)", summary), summary
    assert f"population.init_from={result.run_id}" in summary
    view = json.loads(runs_view())["selectedColumns"]
    assert "metrics.`eval_loss_before`" in view and "metrics.`eval_loss_after`" in view


def test_eval_batches_0_turns_the_held_out_evaluation_off(make_config, client, tmp_path) -> None:
    result = run_experiment(make_config(*SHORT, "population.eval_batches=0"), output_dir=_folder(tmp_path / "out"))
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED" and result.eval_batches == 0
    assert result.eval_loss_before is result.eval_loss_after is None
    assert not {names.EVAL_LOSS_BEFORE, names.EVAL_LOSS_AFTER} & run.data.metrics.keys(), "no eval loss is logged"
    assert run.data.tags[names.BANKS_SHA256], "the banks are still kept"
    summary = format_result(result)
    assert "eval loss" not in summary and re.search(r"\nloss +[0-9.]+ -> [0-9.]+", summary), summary


SAVE_BANKS = """
import sys
from pathlib import Path

import torch

from axoexp.banks import adapted_banks, save_banks
from axoexp.components.population import lite

banks = adapted_banks(lite(device=torch.device("cpu"), dtype=torch.float32, seed=0).module)
for copy in range(8):
    save_banks({name: bank.detach() for name, bank in banks.items()}, "lite", Path(sys.argv[1]) / f"{copy}.safetensors")
"""


@pytest.mark.slow
def test_the_same_banks_make_the_same_file_in_every_process(tmp_path) -> None:
    """safetensors orders a file's metadata anew on every save, in every process: the banks file must
    not depend on it (its SHA-256 is the banks' identity, and what a pin names)."""
    folders = [_folder(tmp_path / f"process{index}") for index in range(2)]
    started = [subprocess.Popen([sys.executable, "-c", SAVE_BANKS, str(folder)], cwd=REPO) for folder in folders]
    assert [process.wait(timeout=300) for process in started] == [0, 0]
    files = sorted(tmp_path.glob("process*/*.safetensors"))
    assert len(files) == 16
    assert len({sha256_of(file) for file in files}) == 1, "one file, whatever process wrote it and when"

    built = adapted_banks(lite(device=torch.device("cpu"), dtype=torch.float32, seed=0).module)
    with safe_open(str(files[0]), framework="pt") as opened:
        assert opened.metadata() == {"format": FORMAT, "population": "lite"}
        assert all(torch.equal(opened.get_tensor(name), bank.detach()) for name, bank in built.items())


@pytest.mark.slow
def test_identical_runs_record_the_same_banks_sha256(make_config, client, tmp_path) -> None:
    runs = [run_experiment(make_config(*SHORT), output_dir=_folder(tmp_path / name)) for name in ("a", "b")]
    assert runs[0].banks is not None and runs[1].banks is not None
    assert runs[0].banks.sha256 == runs[1].banks.sha256 == sha256_of(tmp_path / "b" / BANKS_FILE)
    assert {client.get_run(run.run_id).data.tags[names.BANKS_SHA256] for run in runs} == {runs[0].banks.sha256}


@pytest.mark.slow
def test_a_run_started_from_another_runs_banks_continues_exactly_where_it_ended(make_config, client, tmp_path) -> None:
    first = run_experiment(make_config(*SHORT), output_dir=_folder(tmp_path / "first"))
    saved = load_file(_artifact(client, first.run_id, tmp_path / "dl"))

    config = make_config(*SHORT, f"population.init_from={first.run_id}")
    loaded = plan_experiment(config).build_population()
    banks = adapted_banks(loaded.module)
    assert list(banks) == list(saved)
    assert all(torch.equal(banks[name].detach(), saved[name]) for name in saved), "loaded exactly"

    second = run_experiment(config, output_dir=_folder(tmp_path / "second"))
    assert second.eval_loss_before == first.eval_loss_after, "the same banks on the same held-out batches"
    assert second.losses[0] < first.losses[0], "it starts adapted"
    tags = client.get_run(second.run_id).data.tags
    assert tags[names.BANKS_INIT_FROM] == first.run_id
    assert tags[names.BANKS_INIT_SHA256] == client.get_run(first.run_id).data.tags[names.BANKS_SHA256]

    # from the file itself, pinned
    pin = sha256_of(tmp_path / "first" / BANKS_FILE)
    by_file = make_config(
        *SHORT, f"population.init_from={tmp_path / 'first' / BANKS_FILE}", f"population.init_from_sha256='{pin}'"
    )
    assert run_experiment(by_file).eval_loss_before == first.eval_loss_after


@pytest.mark.slow
def test_a_run_interrupted_after_updates_keeps_its_banks_and_one_before_them_keeps_none(
    make_config, client, banks_registry
) -> None:
    InterruptedOnUpdate.calls, InterruptedOnUpdate.stop_at = 0, 4
    with pytest.raises(KeyboardInterrupt):
        run_experiment(make_config("executor.name=test_interrupted"), registry=banks_registry)
    (run,) = _runs(client)
    assert run.info.status == "KILLED" and run.data.tags[names.BANKS_UPDATES] == "3"
    assert BANKS_FILE in {a.path for a in client.list_artifacts(run.info.run_id)}

    InterruptedOnUpdate.calls, InterruptedOnUpdate.stop_at = 0, 1
    with pytest.raises(KeyboardInterrupt):
        run_experiment(make_config("executor.name=test_interrupted"), registry=banks_registry)
    killed_early = next(r for r in _runs(client) if r.info.run_id != run.info.run_id)
    assert killed_early.info.status == "KILLED" and names.BANKS_SHA256 not in killed_early.data.tags
    assert names.EVAL_LOSS_BEFORE in killed_early.data.metrics


def _refusal_cases(tmp_path: Path, first_run: str, client: MlflowClient) -> list[tuple[list[str], str]]:
    file = tmp_path / "first" / BANKS_FILE
    not_banks = tmp_path / "plain.safetensors"
    save_file({"w": torch.zeros(2)}, str(not_banks))
    bare = client.create_run(client.get_experiment_by_name("axoexp").experiment_id).info.run_id
    client.set_terminated(bare, "FAILED")
    init = f"population.init_from={first_run}"
    return [
        (
            [init, "population.neurons=4"],
            f"{init} holds banks of shapes behavior_adapter=(3, 44) morphology_adapter=(2, 44) "
            "synaptic_log_efficacy=(3, 4), but this population's are behavior_adapter=(4, 44)",
        ),
        ([init, "population.name=lite_twin"], f"{init} holds banks of population lite, not of population=lite_twin"),
        ([init, "dtype=float64"], f"{init} holds float32 banks, but this run is dtype=float64"),
        (
            [f"population.init_from={file}", "population.init_from_sha256=00ff"],
            f"population.init_from={file}: its banks file has SHA-256 {sha256_of(file)}, "
            "but population.init_from_sha256 pins 00ff",
        ),
        ([init, "population.init_from_sha256=00ff"], "but population.init_from_sha256 pins 00ff"),
        ([f"population.init_from={not_banks}"], "is a safetensors file, but not one of axoexp's banks files"),
        ([f"population.init_from={tmp_path / 'first' / 'config.yaml'}"], "is not a banks file (safetensors)"),
        (["population.init_from=" + "0" * 32], f"population.init_from={'0' * 32}: no such run in sqlite:///"),
        ([f"population.init_from={bare}"], f"population.init_from={bare}: the run kept no adapted banks"),
        (["population.init_from=nowhere.safetensors"], "is neither a file nor an MLflow run id (32 hex digits)"),
        (
            [init, f"tracking.uri=http://127.0.0.1:{free_port()}", "tracking.http_max_retries=0"],
            f"{init}: the run cannot be read from http://127.0.0.1:",
        ),
    ]


def test_a_run_id_in_an_empty_store_file_is_no_such_run_and_the_file_stays_empty(tmp_path: Path) -> None:
    """MLflow created its tables in an empty file it was asked to read a run from."""
    empty = tmp_path / "mlflow.db"
    empty.touch()
    with pytest.raises(BanksError, match=r"no such run, the store sqlite:///.*mlflow\.db is an empty file$"):
        read_initial_banks("0" * 32, None, f"sqlite:///{empty}")
    assert empty.stat().st_size == 0


@pytest.mark.slow
def test_banks_that_cannot_start_the_run_are_refused_before_any_run_exists(
    make_config, client, banks_registry, tmp_path
) -> None:
    first = run_experiment(make_config(*SHORT), output_dir=_folder(tmp_path / "first")).run_id
    for overrides, message in _refusal_cases(tmp_path, first, client):
        before = len(_runs(client))
        with pytest.raises(ConfigError, match=re.escape(message)):
            run_experiment(make_config(*SHORT, *overrides), registry=banks_registry)
        assert len(_runs(client)) == before, f"{overrides} created a run"


@pytest.mark.slow
def test_the_command_refuses_banks_of_other_shapes_in_one_line_with_exit_2(tmp_path, tracking_uri, make_config) -> None:
    run_id = run_experiment(make_config(*SHORT), output_dir=tmp_path / "first").run_id  # the banks, in this process
    refused = run_cli(
        *SHORT, f"tracking.uri={tracking_uri}", f"population.init_from={run_id}", "population.neurons=5", cwd=tmp_path
    )
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith(f"axoexp: invalid experiment config: population.init_from={run_id} holds banks")
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert len(_runs(MlflowClient(tracking_uri=tracking_uri))) == 1


@pytest.mark.slow
def test_banks_lacking_one_the_population_trains_are_refused_and_a_bank_it_does_not_train_may_be_absent(
    make_config, client, tracking_uri, tmp_path
) -> None:
    frozen = "population.train_synaptic=false"
    partial = run_experiment(make_config(*SHORT, frozen), output_dir=_folder(tmp_path / "partial"))
    saved = load_file(tmp_path / "partial" / BANKS_FILE)
    assert list(saved) == ["behavior_adapter", "morphology_adapter"]

    by_file = f"population.init_from={tmp_path / 'partial' / BANKS_FILE}"
    with pytest.raises(ConfigError, match=re.escape(f"{by_file} holds no synaptic_log_efficacy bank, but this")):
        run_experiment(make_config(*SHORT, by_file))
    refused = run_cli(*SHORT, f"tracking.uri={tracking_uri}", f"population.init_from={partial.run_id}", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stdout == "" and len(refused.stderr.strip().splitlines()) == 1
    assert refused.stderr.strip() == (
        f"axoexp: invalid experiment config: population.init_from={partial.run_id} holds no synaptic_log_efficacy "
        "bank, but this population trains it; start from banks of a run that trained it too, or do not train it "
        "in this run"
    )
    assert [run.info.run_id for run in _runs(client)] == [partial.run_id], "refused before any run exists"

    # not trained here either: the absent bank keeps the value the population builds, the others are loaded
    config = make_config(*SHORT, frozen, f"population.init_from={partial.run_id}")
    loaded = plan_experiment(config).build_population().module
    built = plan_experiment(make_config(*SHORT, frozen)).build_population().module
    assert torch.equal(loaded.synaptic_log_efficacy, built.synaptic_log_efficacy)
    assert all(torch.equal(banks.detach(), saved[name]) for name, banks in adapted_banks(loaded).items())
    assert run_experiment(config).eval_loss_before == partial.eval_loss_after

    # banks this run does not train are loaded where the file holds them, and stay frozen there
    whole = run_experiment(make_config(*SHORT), output_dir=_folder(tmp_path / "whole")).run_id
    loaded = plan_experiment(make_config(*SHORT, frozen, f"population.init_from={whole}")).build_population().module
    trained = load_file(tmp_path / "whole" / BANKS_FILE)["synaptic_log_efficacy"]
    assert torch.equal(loaded.synaptic_log_efficacy, trained)
    assert not loaded.synaptic_log_efficacy.requires_grad


@pytest.mark.slow
def test_a_population_judged_only_once_built_ends_its_run_failed_on_banks_that_do_not_fit(
    make_config, client, banks_registry, tmp_path
) -> None:
    first = run_experiment(make_config(*SHORT, "population.name=not_on_meta"), registry=banks_registry)
    assert first.eval_loss_before is None and first.banks is not None, "no held-out batches: no evaluation"
    assert names.EVAL_LOSS_AFTER not in client.get_run(first.run_id).data.metrics

    refused = make_config(*SHORT, f"population.init_from={first.run_id}")  # the kind, known without building
    with pytest.raises(ConfigError, match="holds banks of population not_on_meta, not of population=lite"):
        run_experiment(refused, registry=banks_registry)

    config = make_config(
        *SHORT, "population.name=not_on_meta", "population.neurons=4", f"population.init_from={first.run_id}"
    )
    with pytest.raises(BanksError, match=re.escape("holds banks of shapes behavior_adapter=(3, 44)")):
        run_experiment(config, registry=banks_registry)
    failed = next(run for run in _runs(client) if run.info.run_id != first.run_id)
    assert failed.info.status == "FAILED" and "holds banks of shapes" in failed.data.tags[names.FAILURE]
