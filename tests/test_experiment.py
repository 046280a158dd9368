"""Experiments on the CPU, logged to a real sqlite MLflow store and read back."""

from __future__ import annotations

import json
import platform
import re
from pathlib import Path

import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient

from axoexp import names
from axoexp.errors import ConfigError, VerificationError
from axoexp.executors.eager import EagerExecutor
from axoexp.experiment import run_experiment
from axoexp.metadata import source_tags
from axoexp.plan import plan_experiment
from axoexp.registry import Registry
from axoexp.windows import Observer


class DoubleStepExecutor(EagerExecutor):
    """Wrong on purpose: applies every update twice."""

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        super().step(inputs, targets)
        return super().step(inputs, targets)


class FailsOnFifthUpdate(EagerExecutor):
    calls = 0

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 5:
            raise RuntimeError("device lost on update 5")
        return super().step(inputs, targets)


class InterruptedOnThirdUpdate(EagerExecutor):
    calls = 0

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 3:
            raise KeyboardInterrupt
        return super().step(inputs, targets)


class BeginsSetupEarly(EagerExecutor):
    """Records when the run let it begin its one-off work, and whether that was before prepare."""

    events: list[tuple[str, object]] = []

    @classmethod
    def begin_setup(cls, device: torch.device, params) -> None:
        cls.events.append(("begin_setup", (device, dict(params))))

    def prepare(self, example_inputs: torch.Tensor, example_targets: torch.Tensor) -> dict[str, float]:
        self.events.append(("prepare", None))
        return {}


TEST_EXECUTORS = {
    "test_double_step": DoubleStepExecutor,
    "test_fails": FailsOnFifthUpdate,
    "test_interrupted": InterruptedOnThirdUpdate,
    "test_begins_setup": BeginsSetupEarly,
}


@pytest.fixture
def test_registry(registry: Registry) -> Registry:
    """This test's registry: the built-ins plus the deliberately wrong executors above."""
    for name, cls in TEST_EXECUTORS.items():
        registry.register("executor", name, cls, source="tests/test_experiment.py")
    return registry


def only_run(client: MlflowClient):
    experiment = client.get_experiment_by_name("axoexp")
    (run,) = client.search_runs([experiment.experiment_id])
    return run


def test_eager_run_is_logged_to_sqlite_and_reads_back(make_config, client, tmp_path: Path) -> None:
    config = make_config("run.warmup_updates=2", "run.measured_updates=7", "loss=causal_mse")
    result = run_experiment(config, output_dir=tmp_path)

    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert re.fullmatch(r"\d\d-\d\d \d\d:\d\d:\d\d eager 3x12x4 cpu", run.info.run_name), "short, sorts by time"
    metrics = run.data.metrics
    assert metrics[names.update_metric("count")] == 7 and metrics[names.MEASURED_COMPLETED] == 7
    assert (
        0 < metrics[names.update_metric("p10")] <= metrics[names.UPDATE_MEDIAN] <= metrics[names.update_metric("p90")]
    )
    assert metrics[names.UPDATE_MEDIAN] == round(result.update.median, 4), "to 0.1 microsecond"
    series = client.get_metric_history(result.run_id, names.UPDATE_SERIES)
    assert series and all(metric.value == round(metric.value, 4) for metric in series)
    assert names.CAPTURE not in metrics, "eager has nothing to capture"
    losses = [m.value for m in client.get_metric_history(result.run_id, names.LOSS_SERIES)]
    assert len(losses) == 9 and losses == pytest.approx(result.losses)
    assert losses[-1] < losses[0], "adapting to the teacher's targets lowers the loss"
    assert len(client.get_metric_history(result.run_id, names.UPDATE_SERIES)) == 9

    params, tags = run.data.params, run.data.tags
    assert params["population.neurons"] == "3" and params["optimizer.name"] == "adam"
    assert tags[names.SHAPE_INPUTS] == "(3, 12, 4)" and tags[names.SHAPE_TARGETS] == "(3, 12, 2)"
    assert (
        tags[names.TIMING_UPDATE_INCLUDES]
        == "zero_grad,forward,loss,backward,gradient_transform,optimizer_step,synchronize"
    )
    assert tags["version.torch"] == torch.__version__ and tags["version.axosim"] == "0.1.0"
    assert tags["git.dirty"] in {"true", "false"} and tags["device"] == "cpu" and tags["seed"] == "0"
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    models = set(re.findall(r"^model name\s*:\s*(.+?)\s*$", cpuinfo, re.MULTILINE))
    assert tags[names.CPU_MODEL] in (models or {platform.processor() or platform.machine()}), "the model, not x86_64"
    assert tags["determinism.deterministic_algorithms"] == "false"
    assert tags[names.SOURCE_GIT_COMMIT] == tags["git.commit"]
    assert tags[names.SOURCE_NAME] in {"python -m pytest", "pytest", "python -c"}, "python -c: pytest-xdist's workers"
    assert tags["mlflow.user"] and tags["mlflow.source.type"] == "LOCAL", "MLflow's own context tags"
    kind = client.get_experiment(run.info.experiment_id).tags[names.EXPERIMENT_KIND]
    assert kind == names.EXPERIMENT_KIND_TRAINING, "the MLflow UI opens the experiment on its training runs"

    (workload,) = run.inputs.dataset_inputs
    assert workload.dataset.name == "lite-3x12x4" and len(workload.dataset.digest) == 16
    assert [(tag.key, tag.value) for tag in workload.tags] == [(names.DATASET_CONTEXT, "training")]
    source = json.loads(workload.dataset.source)["tags"]
    assert (source["input_rate"], source["target_perturbation"], source["batches"], source["seed"]) == (
        "0.2",
        "0.1",
        "4",
        "0",
    )
    assert '"shape": [4, 3, 12, 4]' in workload.dataset.schema

    logged = {a.path for a in client.list_artifacts(result.run_id)}
    assert logged == {"banks.safetensors", "config.yaml", "result.json"}
    config_text = client.download_artifacts(result.run_id, "config.yaml", str(tmp_path / "dl"))
    assert yaml.safe_load(Path(config_text).read_text())["run"]["measured_updates"] == 7
    assert json.loads((tmp_path / "result.json").read_text())["run_id"] == result.run_id


@pytest.mark.slow
def test_seeded_runs_repeat_their_losses_exactly(make_config) -> None:
    config = make_config("run.measured_updates=3")
    assert run_experiment(config).losses == run_experiment(config).losses


@pytest.mark.slow
def test_thread_calibration_consumes_no_update(make_config, client) -> None:
    """run.threads=null times updates with each candidate thread count after warm-up, then restores
    the module and optimizer: the measured updates continue from the warm-up's state."""
    common = ("seed=5", "run.warmup_updates=2", "run.measured_updates=24", "run.lease_cpus=2")  # 24: calibrated on 2
    fixed = run_experiment(make_config(*common, "run.threads=1"))
    calibrated = run_experiment(make_config(*common))
    metrics = client.get_run(calibrated.run_id).data.metrics
    if not any(key.startswith("threads_calibration/") for key in metrics):
        pytest.skip("no thread calibration here (one CPU allowed)")
    # a different thread count may reorder float sums, never move the model
    assert calibrated.losses == pytest.approx(fixed.losses, rel=1e-5, abs=1e-9)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["executor=cudagraph"], "executor=cudagraph needs CUDA, but device=cpu"),
        (["executor=cudagraph"], "use executor=eager"),
        (["executor=reduce_overhead"], "executor=reduce_overhead needs CUDA, but device=cpu"),
        (["optimizer.capturable=true"], "optimizer.capturable=true needs parameters on CUDA, but device=cpu"),
        (["dtype=float8"], "dtype='float8' is not supported; choose one of: float32, float64, bfloat16"),
        (["device=tpu0"], "device='tpu0' is not a device; use cpu, cuda or cuda:N"),
        (
            ["executor.name=graphs"],
            "unknown executor 'graphs'; valid executor names: compiled_cudagraph, cudagraph, "
            "eager, fused_cudagraph, reduce_overhead, regional_cudagraph",
        ),
        (["+loss.gamma=2"], "loss=causal_mse does not accept 'gamma'; its parameters are: warmup_steps"),
        (["run.measured_updates=0"], "run.measured_updates=0: must be at least 1"),
        (["population.neurons=0"], "population.neurons=0: must be at least 1"),
        (["optimizer.lr=0"], "optimizer.lr=0.0: must be greater than 0"),
        (["population.input_rate=1.5"], "population.input_rate=1.5: must lie in [0, 1]"),
        (["optimizer.beta2=1"], "optimizer.beta2=1.0: must lie in [0, 1)"),
        (["optimizer.lr=inf"], "optimizer.lr=inf: must be a finite number, not inf"),
        (
            ["optimizer=sgd", "optimizer.nesterov=true"],
            "optimizer.nesterov=true needs momentum, but optimizer.momentum=0.0; set it above 0",
        ),
        (["seed=18446744073709551615"], "seed=18446744073709551615: must lie in [-9223372036854775808, 9223"),
        (
            ["determinism.float32_matmul_precision=low"],
            "determinism.float32_matmul_precision='low': choose one of highest, high, medium",
        ),
        (
            ["loss=mse", "population.lengths=[3,12]"],
            "population.lengths=[3, 12]: a batch may have 3 steps, but AxoSim-Lite's first 4 outputs are warm-up, "
            "with no gradient to adapt on, so every batch needs more than 4 time steps; use lengths of 5 or more",
        ),
        (["tracking.experiment="], "tracking.experiment='': name an MLflow experiment (default axoexp)"),
        (
            ["executor=fused_cudagraph", "dtype=float64"],
            "executor=fused_cudagraph cannot run this experiment: the fused kernel runs float32, not dtype=float64; "
            "executors that can: eager (with device=cuda: compiled_cudagraph, cudagraph, reduce_overhead, "
            "regional_cudagraph)",
        ),
        (["executor=fused_cudagraph"], "executor=fused_cudagraph needs CUDA, but device=cpu"),
    ],
)
def test_bad_config_fails_early_with_a_clear_message(make_config, client, overrides, message) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        run_experiment(make_config(*overrides))
    assert client.get_experiment_by_name("axoexp") is None, "no MLflow run is started for a config error"


def test_cudagraph_needs_a_capturable_optimizer(make_config) -> None:
    with pytest.raises(ConfigError, match="optimizer.capturable=false, but executor=cudagraph captures"):
        run_experiment(make_config("executor=cudagraph", "optimizer.capturable=false"))


@pytest.mark.parametrize(
    "executor_name", ["cudagraph", "compiled_cudagraph", "reduce_overhead", "regional_cudagraph", "fused_cudagraph"]
)
def test_executors_with_one_off_work_refuse_to_step_before_prepare(make_config, executor_name: str) -> None:
    plan = plan_experiment(make_config())  # built directly, bypassing the CUDA check; nothing runs
    setup = plan.build_population()
    executor = plan.build_executor(setup.module, executor_name)
    with pytest.raises(RuntimeError, match="step called before prepare"):
        executor.step(*setup.batches[0])


def test_verify_passes_for_eager_and_is_logged(make_config, client) -> None:
    result = run_experiment(make_config("verify.enabled=true", "verify.updates=4", "run.measured_updates=2"))
    assert result.verification is not None and result.verification.passed
    assert result.verification.max_abs_param_change > 1e-4, "the compared updates really moved the banks"
    metrics = client.get_run(result.run_id).data.metrics
    assert metrics["verify_passed"] == 1.0 and metrics["verify_max_abs_param_diff"] == 0.0


def test_the_executor_begins_its_setup_once_planned_before_anything_is_built(make_config, test_registry) -> None:
    BeginsSetupEarly.events.clear()
    run_experiment(make_config("executor.name=test_begins_setup", "run.measured_updates=2"), registry=test_registry)
    assert BeginsSetupEarly.events == [("begin_setup", (torch.device("cpu"), {})), ("prepare", None)]


def test_verify_catches_a_wrong_executor_and_the_run_ends_failed(make_config, client, test_registry) -> None:
    config = make_config("executor.name=test_double_step", "verify.enabled=true", "run.measured_updates=3")
    with pytest.raises(VerificationError, match="executor=test_double_step differs from eager after 5 updates"):
        run_experiment(config, registry=test_registry)
    run = only_run(client)
    assert run.info.status == "FAILED"
    assert run.data.tags[names.FAILURE].startswith("VerificationError: executor=test_double_step differs")
    assert run.data.metrics["verify_passed"] == 0.0
    assert run.data.metrics[names.update_metric("count")] == 3, "the timings measured before the failure are kept"


def test_failure_mid_measurement_keeps_what_was_measured(make_config, client, test_registry) -> None:
    # run.threads=1: no thread calibration, whose updates would count towards the failing one
    config = make_config("executor.name=test_fails", "run.warmup_updates=2", "run.measured_updates=10", "run.threads=1")
    with pytest.raises(RuntimeError, match="device lost on update 5"):
        run_experiment(config, registry=test_registry)
    run = only_run(client)
    assert run.info.status == "FAILED"
    assert run.data.tags[names.FAILURE] == "RuntimeError: device lost on update 5"
    assert run.data.tags[names.PARTIAL] == "2 of 10 measured updates"
    assert run.data.metrics[names.MEASURED_COMPLETED] == 2
    assert len(client.get_metric_history(run.info.run_id, names.LOSS_SERIES)) == 4


def test_interrupt_ends_the_run_killed(make_config, client, test_registry) -> None:
    with pytest.raises(KeyboardInterrupt):
        run_experiment(make_config("executor.name=test_interrupted"), registry=test_registry)
    run = only_run(client)
    assert run.info.status == "KILLED"
    assert run.data.metrics[names.FIRST_UPDATE] > 0


class Recorder(Observer):
    """Records what the run tells its observers."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def window_started(self, window: str, planned_updates: int) -> None:
        self.events.append(("start", window, planned_updates))

    def update_finished(self, window: str, index: int, latency_ms: float, loss: float, bucket: int | None) -> None:
        assert latency_ms > 0 and loss > 0
        self.events.append(("update", window, index))

    def window_finished(self, window: str, completed_updates: int) -> None:
        self.events.append(("end", window, completed_updates))


def test_observers_see_every_window_and_update_in_order(make_config) -> None:
    recorder = Recorder()
    run_experiment(
        make_config("run.warmup_updates=2", "run.measured_updates=3", "verify.enabled=true"), observers=[recorder]
    )
    assert recorder.events == [
        ("start", "prepare", 0),
        ("end", "prepare", 0),
        ("start", "warmup", 2),
        ("update", "warmup", 0),
        ("update", "warmup", 1),
        ("end", "warmup", 2),
        ("start", "measured", 3),
        *[("update", "measured", index) for index in (2, 3, 4)],
        ("end", "measured", 3),
        ("start", "verify", 0),
        ("end", "verify", 0),
    ]


def test_observers_hear_a_window_end_when_an_update_fails(make_config, test_registry) -> None:
    recorder = Recorder()
    # run.threads=1: no thread calibration, whose updates would count towards the failing one
    config = make_config("executor.name=test_fails", "run.warmup_updates=2", "run.measured_updates=10", "run.threads=1")
    with pytest.raises(RuntimeError, match="device lost on update 5"):
        run_experiment(config, registry=test_registry, observers=[recorder])
    assert recorder.events[-2:] == [("update", "measured", 3), ("end", "measured", 2)]


@pytest.mark.parametrize(
    ("argv0", "program"),
    [
        ("/venv/lib/pytest/__main__.py", "python -m pytest"),
        ("/venv/bin/pytest", "pytest"),
        ("-c", "python -c"),
        ("", "python"),
    ],
)
def test_the_source_names_the_program(argv0: str, program: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -c`` (also pytest-xdist's workers) was named ``-c``."""
    monkeypatch.setattr("sys.argv", [argv0])
    assert source_tags()[names.SOURCE_NAME] == program
