"""Experiments on the CPU, logged to a real sqlite MLflow store and read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient

from axoexp.executors.eager import EagerExecutor
from axoexp.experiment import ConfigError, plan_experiment, run_experiment
from axoexp.registry import REGISTRY, load_plugins
from axoexp.tracking import FAILURE_TAG
from axoexp.verification import VerificationError

load_plugins()


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


for name, cls in (("test_double_step", DoubleStepExecutor), ("test_fails", FailsOnFifthUpdate),
                  ("test_interrupted", InterruptedOnThirdUpdate)):
    REGISTRY.register("executor", name, cls, source="tests/test_experiment.py")


def only_run(client: MlflowClient):
    experiment = client.get_experiment_by_name("axoexp")
    (run,) = client.search_runs([experiment.experiment_id])
    return run


def test_eager_run_is_logged_to_sqlite_and_reads_back(make_config, client, tmp_path: Path) -> None:
    config = make_config("run.warmup_updates=2", "run.measured_updates=7", "loss=causal_mse")
    result = run_experiment(config, output_dir=tmp_path)

    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "eager lite-3x12x4 causal_mse adam cpu"
    metrics = run.data.metrics
    assert metrics["update_ms_count"] == 7 and metrics["measured_updates_completed"] == 7
    assert 0 < metrics["update_ms_p10"] <= metrics["update_ms_median"] <= metrics["update_ms_p90"]
    assert metrics["update_ms_median"] == pytest.approx(result.update.median)
    assert "capture_ms" not in metrics, "eager has nothing to capture"
    losses = [m.value for m in client.get_metric_history(result.run_id, "loss")]
    assert len(losses) == 9 and losses == pytest.approx(result.losses)
    assert losses[-1] < losses[0], "adapting to the teacher's targets lowers the loss"
    assert len(client.get_metric_history(result.run_id, "update_ms")) == 9

    params, tags = run.data.params, run.data.tags
    assert params["population.neurons"] == "3" and params["optimizer.name"] == "adam"
    assert tags["shape.inputs"] == "(3, 12, 4)" and tags["shape.targets"] == "(3, 12, 2)"
    assert tags["timing.update.includes"] == "zero_grad,forward,loss,backward,gradient_transform,optimizer_step,synchronize"
    assert tags["version.torch"] == torch.__version__ and tags["version.axosim"] == "0.1.0"
    assert tags["git.dirty"] in {"true", "false"} and tags["device"] == "cpu" and tags["seed"] == "0"
    assert tags["determinism.deterministic_algorithms"] == "false"

    logged = {a.path for a in client.list_artifacts(result.run_id)}
    assert logged == {"config.yaml", "result.json"}
    config_text = client.download_artifacts(result.run_id, "config.yaml", str(tmp_path / "dl"))
    assert yaml.safe_load(Path(config_text).read_text())["run"]["measured_updates"] == 7
    assert json.loads((tmp_path / "result.json").read_text())["run_id"] == result.run_id


def test_seeded_runs_repeat_their_losses_exactly(make_config) -> None:
    config = make_config("run.measured_updates=3")
    assert run_experiment(config).losses == run_experiment(config).losses


@pytest.mark.parametrize("overrides, message", [
    (["executor=cudagraph"], "executor=cudagraph needs CUDA, but device=cpu"),
    (["executor=cudagraph"], "use executor=eager"),
    (["executor=reduce_overhead"], "executor=reduce_overhead needs CUDA, but device=cpu"),
    (["optimizer.capturable=true"], "optimizer.capturable=true needs parameters on CUDA, but device=cpu"),
    (["dtype=float8"], "dtype='float8' is not supported; choose one of: float32, float64, bfloat16, float16"),
    (["device=tpu0"], "device='tpu0' is not a device; use cpu, cuda or cuda:N"),
    (["executor.name=graphs"], "unknown executor 'graphs'; valid executor names: compiled_cudagraph, cudagraph, eager, reduce_overhead"),
    (["+loss.gamma=2"], "loss=causal_mse does not accept 'gamma'"),
    (["run.measured_updates=0"], "run.measured_updates must be an integer of at least 1, got 0"),
])
def test_bad_config_fails_early_with_a_clear_message(make_config, client, overrides, message) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run_experiment(make_config(*overrides))
    assert client.get_experiment_by_name("axoexp") is None, "no MLflow run is started for a config error"


def test_cudagraph_needs_a_capturable_optimizer(make_config) -> None:
    with pytest.raises(ConfigError, match="optimizer.capturable=false, but executor=cudagraph captures"):
        run_experiment(make_config("executor=cudagraph", "optimizer.capturable=false"))


@pytest.mark.parametrize("executor_name", ["cudagraph", "compiled_cudagraph", "reduce_overhead"])
def test_executors_with_one_off_work_refuse_to_step_before_prepare(make_config, executor_name: str) -> None:
    plan = plan_experiment(make_config())  # built directly, bypassing the CUDA check; nothing runs
    setup = plan.build_population()
    executor = plan.build_executor(setup.module, REGISTRY.get("executor", executor_name))
    with pytest.raises(RuntimeError, match="step called before prepare"):
        executor.step(*setup.batches[0])


def test_verify_passes_for_eager_and_is_logged(make_config, client) -> None:
    result = run_experiment(make_config("verify.enabled=true", "verify.updates=4", "run.measured_updates=2"))
    assert result.verification is not None and result.verification.passed
    assert result.verification.max_abs_param_change > 1e-4, "the compared updates really moved the banks"
    metrics = client.get_run(result.run_id).data.metrics
    assert metrics["verify_passed"] == 1.0 and metrics["verify_max_abs_param_diff"] == 0.0


def test_verify_catches_a_wrong_executor_and_the_run_ends_failed(make_config, client) -> None:
    config = make_config("executor.name=test_double_step", "verify.enabled=true", "run.measured_updates=3")
    with pytest.raises(VerificationError, match="executor=test_double_step differs from eager after 5 updates"):
        run_experiment(config)
    run = only_run(client)
    assert run.info.status == "FAILED"
    assert run.data.tags[FAILURE_TAG].startswith("VerificationError: executor=test_double_step differs")
    assert run.data.metrics["verify_passed"] == 0.0
    assert run.data.metrics["update_ms_count"] == 3, "the timings measured before the failure are kept"


def test_failure_mid_measurement_keeps_what_was_measured(make_config, client) -> None:
    config = make_config("executor.name=test_fails", "run.warmup_updates=2", "run.measured_updates=10")
    with pytest.raises(RuntimeError, match="device lost on update 5"):
        run_experiment(config)
    run = only_run(client)
    assert run.info.status == "FAILED"
    assert run.data.tags[FAILURE_TAG] == "RuntimeError: device lost on update 5"
    assert run.data.tags["axoexp.partial"] == "2 of 10 measured updates"
    assert run.data.metrics["measured_updates_completed"] == 2
    assert len(client.get_metric_history(run.info.run_id, "loss")) == 4


def test_interrupt_ends_the_run_killed(make_config, client) -> None:
    with pytest.raises(KeyboardInterrupt):
        run_experiment(make_config("executor.name=test_interrupted"))
    run = only_run(client)
    assert run.info.status == "KILLED"
    assert run.data.metrics["first_update_ms"] > 0
