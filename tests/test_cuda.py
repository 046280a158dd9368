"""CUDA-Graph executors on a real GPU: capture, replay, errors, and parity with eager."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from helpers import requires_cuda, run_cli
from mlflow.tracking import MlflowClient

from axoexp import names
from axoexp.errors import ConfigError
from axoexp.executors.base import eager_update
from axoexp.executors.capture import ReplayShapeError
from axoexp.experiment import run_experiment
from axoexp.plan import plan_experiment

pytestmark = requires_cuda
CAPTURED = ("cudagraph", "compiled_cudagraph", "regional_cudagraph", "fused_cudagraph")
PREPARED = (*CAPTURED, "reduce_overhead")  # every executor whose prepare() does one-off work


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles its own module copy; start from empty caches, far from recompile limits."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _state(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    tensors = [value.detach().clone() for value in module.state_dict().values()]
    for state in optimizer.state.values():
        tensors += [value.detach().clone() for value in state.values() if isinstance(value, torch.Tensor)]
    return tensors


@pytest.fixture
def cuda_plan(make_config):
    def plan(*overrides: str):
        return plan_experiment(make_config("device=cuda", *overrides))

    return plan


@pytest.mark.parametrize("executor_name", PREPARED)
def test_prepare_consumes_no_update(cuda_plan, executor_name: str) -> None:
    plan = cuda_plan(f"executor={executor_name}", "optimizer.momentum=0.9", "optimizer=sgd")
    setup = plan.build_population()
    executor = plan.build_executor(setup.module)
    eager_update(
        setup.module, executor.optimizer, executor.loss_fn, executor.gradient_transform, *setup.batches[1]
    )  # an earlier update, so SGD has a momentum buffer to restore
    before = _state(setup.module, executor.optimizer)
    phases = executor.prepare(*setup.batches[0])
    assert phases and all(milliseconds > 0 for milliseconds in phases.values())
    after = _state(setup.module, executor.optimizer)
    assert len(before) == len(after)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.parametrize("executor_name", PREPARED)
def test_replay_equals_eager_updates_from_the_same_state(cuda_plan, executor_name: str) -> None:
    plan = cuda_plan(f"executor={executor_name}")
    setup = plan.build_population()
    reference_module = copy.deepcopy(setup.module)
    captured = plan.build_executor(setup.module)
    captured.prepare(*setup.batches[0])
    reference = plan.build_executor(reference_module, "eager")
    for index in range(6):
        inputs, targets = setup.batches[index % len(setup.batches)]
        assert torch.allclose(captured.step(inputs, targets), reference.step(inputs, targets), atol=1e-6)
    for a, b in zip(setup.module.parameters(), reference_module.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


@pytest.mark.parametrize("executor_name", CAPTURED)
def test_replay_rejects_other_shapes_and_dtypes(cuda_plan, executor_name: str) -> None:
    plan = cuda_plan(f"executor={executor_name}")
    setup = plan.build_population()
    executor = plan.build_executor(setup.module)
    executor.prepare(*setup.batches[0])
    inputs, targets = setup.batches[0]
    with pytest.raises(ReplayShapeError, match=re.escape("got inputs (3, 8, 4) torch.float32")) as error:
        executor.step(inputs[:, :8], targets[:, :8])
    assert "captured for inputs (3, 12, 4) torch.float32" in str(error.value)
    with pytest.raises(ReplayShapeError, match="inputs must have dtype torch.float32"):
        executor.step(inputs.double(), targets)


def test_cudagraph_refuses_a_non_capturable_optimizer(make_config) -> None:
    with pytest.raises(ConfigError, match="optimizer.capturable=false, but executor=cudagraph"):
        plan_experiment(make_config("device=cuda", "executor=cudagraph", "optimizer.capturable=false"))


OPTIMIZERS = {
    "adam": ["optimizer=adam"],
    "adamw": ["optimizer=adamw"],
    "sgd": ["optimizer=sgd"],
    "sgd_momentum": ["optimizer=sgd", "optimizer.momentum=0.9", "optimizer.nesterov=true"],
}
TRANSFORMS = {  # thresholds small enough that the transforms really act
    "none": ["gradient_transform=none"],
    "clip_norm": ["gradient_transform=clip_norm", "gradient_transform.max_norm=0.01"],
    "clip_value": ["gradient_transform=clip_value", "gradient_transform.clip_value=0.001"],
}
FULL_MATRIX = [
    (name, o, t)
    for name in ("cudagraph", "regional_cudagraph", "fused_cudagraph")
    for o in OPTIMIZERS
    for t in TRANSFORMS
]
TOLERANCE = {"fused_cudagraph": "1e-5"}  # its in-register sums run in another order than cuBLAS
# 8 blocks: regions of 3, 3 and 2 (a short last region: a second graph of the region)
EXECUTOR_OPTIONS = {
    "regional_cudagraph": ["executor.tokens_per_region=3"],
    # the torch step here: the fused step (default auto) has its own matrix below
    "fused_cudagraph": ["executor.fused_step=false"],
}
COMPILED = [
    (name, optimizer, transform)
    for name in ("compiled_cudagraph", "reduce_overhead")
    for optimizer, transform in (("adam", "clip_norm"), ("sgd_momentum", "clip_value"))
]


@pytest.mark.parametrize("executor_name, optimizer, transform", FULL_MATRIX + COMPILED)
def test_parity_with_eager_over_several_updates(
    make_config, executor_name: str, optimizer: str, transform: str
) -> None:
    config = make_config(
        "device=cuda",
        f"executor={executor_name}",
        *EXECUTOR_OPTIONS.get(executor_name, []),
        *OPTIMIZERS[optimizer],
        *TRANSFORMS[transform],
        "population.neurons=16",
        "population.time_steps=32",
        "population.contacts=8",
        "verify.enabled=true",
        "verify.updates=5",
        f"verify.param_atol={TOLERANCE.get(executor_name, '1e-6')}",
        f"verify.loss_atol={TOLERANCE.get(executor_name, '1e-6')}",
        "run.warmup_updates=1",
        "run.measured_updates=3",
    )
    result = run_experiment(config)
    assert result.verification is not None and result.verification.passed, result.verification
    assert result.verification.max_abs_param_change > 1e-5, "the compared updates must move the banks"


@pytest.mark.parametrize("executor_name", ("compiled_cudagraph", "regional_cudagraph", "reduce_overhead"))
def test_compiled_executors_report_the_compiler_startup_apart(make_config, client, executor_name: str) -> None:
    result = run_experiment(make_config("device=cuda", f"executor={executor_name}", "run.measured_updates=3"))
    assert {"compiler_startup", "compile"} <= set(result.prepare_ms)
    tags = client.get_run(result.run_id).data.tags
    assert tags[names.timing_includes_tag("compiler_startup")].startswith("wait_for_background_import")


FIRST_COMPILE = """
import json, sys, torch
from hydra import compose, initialize_config_module
from axoexp.config import register_configs
from axoexp.plan import plan_experiment
from axoexp.plugins import load_plugins
register_configs(load_plugins())
with initialize_config_module(config_module="axoexp.conf", version_base="1.3"):
    plan = plan_experiment(compose("config", overrides=sys.argv[1:]))
plan.begin_executor_setup()
setup = plan.build_population()
plan.build_executor(setup.module).prepare(*setup.batches[0])
print(json.dumps({"method": torch._inductor.config.worker_start_method,
                  "in_process": len(torch._dynamo.utils.compilation_time_metrics.get("async_compile.precompile", [])),
                  "compiled": torch._dynamo.utils.counters["inductor"]["async_compile_cache_miss"]}))
"""


def test_first_compile_of_a_process_compiles_every_kernel_in_the_forked_workers(tmp_path: Path) -> None:
    """A fresh process, a cold cache: the start-up forked inductor's workers and waited for
    them, so no kernel compiles serially in the process itself."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            FIRST_COMPILE,
            "device=cuda",
            "executor=regional_cudagraph",
            f"executor.cache_dir={tmp_path}",
            "population.neurons=16",
            "population.time_steps=32",
            "population.contacts=8",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_WORKER_START"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    kernels = json.loads(done.stdout.strip().splitlines()[-1])
    assert kernels["method"] == "fork" and kernels["compiled"] > 0 and kernels["in_process"] == 0, kernels


def test_cli_cudagraph_run_logs_capture_separately(tmp_path: Path) -> None:
    result = run_cli("executor=cudagraph", "device=cuda", "loss=causal_mse", "verify.enabled=true", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert re.search(r"capture\s+\d+\.\d+ ms", result.stdout)
    assert "AccumulateGrad" not in result.stderr, "no autograd graph outlives an update across streams"
    assert "verify        passed" in result.stdout
    run_id = re.search(r"mlflow run\s+([0-9a-f]{32})", result.stdout).group(1)
    run = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(run_id)
    assert run.data.metrics[names.CAPTURE] > 0 and run.data.metrics[names.update_metric("count")] == 50
    assert run.data.metrics[names.RECAPTURES] == 0 and names.LENGTH_BUCKETS not in run.data.tags  # one length
    assert run.data.tags[names.timing_includes_tag("capture")].startswith("static_buffer_copy,3x_warmup_update")
    assert run.data.tags[names.TIMING_UPDATE_INCLUDES].startswith("input_copy,graph_replay")
    assert run.data.tags["gpu.name"] == torch.cuda.get_device_name()
    assert run.data.tags[names.OPTIMIZER_CAPTURABLE] == "true"


@pytest.mark.parametrize("executor_name", CAPTURED)
def test_capture_warns_about_no_stream_mismatch(cuda_plan, executor_name: str) -> None:
    plan = cuda_plan(f"executor={executor_name}")
    setup = plan.build_population()
    executor = plan.build_executor(setup.module)
    eager_update(
        setup.module, executor.optimizer, executor.loss_fn, executor.gradient_transform, *setup.batches[1]
    )  # an eager update on the default stream first, as verify and users do
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        executor.prepare(*setup.batches[0])
        for index in range(3):
            executor.step(*setup.batches[index % len(setup.batches)])
        torch.cuda.synchronize()
    assert not [w for w in caught if "stream does not match" in str(w.message)], [str(w.message) for w in caught]


@pytest.mark.parametrize("executor_name", ("eager", "cudagraph"))
def test_every_cuda_run_logs_device_clock_and_host_overhead(make_config, executor_name: str) -> None:
    from axoexp.timing import DEVICE_CLOCK

    result = run_experiment(
        make_config("device=cuda", f"executor={executor_name}", "run.warmup_updates=3", "run.measured_updates=20")
    )
    client = MlflowClient(result.tracking_uri)
    run = client.get_run(result.run_id)
    metrics = run.data.metrics
    assert run.data.tags[names.TIMING_DEVICE_CLOCK] == DEVICE_CLOCK
    median, p10, p90 = (metrics[names.device_metric(stat)] for stat in ("median", "p10", "p90"))
    assert 0 < p10 <= median <= p90
    assert result.device_update is not None and round(result.device_update.median, 4) == median
    # the host clock encloses both events, so host minus device is non-negative up to clock granularity
    assert metrics[names.HOST_OVERHEAD_MEDIAN] >= -0.01
    host = {m.step: m.value for m in client.get_metric_history(run.info.run_id, names.UPDATE_SERIES)}
    device = {m.step: m.value for m in client.get_metric_history(run.info.run_id, names.UPDATE_DEVICE_SERIES)}
    assert sorted(device) == sorted(host) == list(range(23))
    assert all(device[step] <= host[step] + 0.01 for step in host)
    assert metrics[names.contention_metric("measured", "gpu_sm_clock_mhz")] > 0
    assert names.system_metric(f"gpu_{torch.cuda.current_device()}_memory_usage_megabytes") in metrics
    assert re.fullmatch(r"none|[a-z-]+(,[a-z-]+)*", run.data.tags[names.TIMING_CONTENTION])


# --- issue 25: a documented plugin population, batched streams --------------------------------------


@pytest.mark.parametrize("executor_name", ("cudagraph", "regional_cudagraph", "fused_cudagraph"))
def test_a_documented_plugin_population_runs_and_verifies_under_the_captured_executors(
    make_config, plugin_registry, executor_name: str
) -> None:
    """tests/plugins/doc_population.py, built as AxoSim's documentation builds a population."""
    tolerance = TOLERANCE.get(executor_name, "1e-6")
    config = make_config(
        "device=cuda",
        "population=doc_lite",
        f"executor={executor_name}",
        "verify.enabled=true",
        "verify.updates=5",
        f"verify.param_atol={tolerance}",
        f"verify.loss_atol={tolerance}",
        "run.warmup_updates=1",
        "run.measured_updates=3",
    )
    result = run_experiment(config, registry=plugin_registry)
    assert result.verification is not None and result.verification.passed, result.verification
    assert result.verification.max_abs_param_change > 1e-5, "the compared updates must move the banks"
    assert MlflowClient(result.tracking_uri).get_run(result.run_id).data.tags[names.SHAPE] == "6x16x5"


@pytest.mark.parametrize("executor_name", PREPARED)
def test_batched_streams_verify_under_every_executor(make_config, executor_name: str) -> None:
    """B = 4 streams per update through forward_batch (the fused kernel's rows: 4 x 16)."""
    tolerance = TOLERANCE.get(executor_name, "1e-6")
    config = make_config(
        "device=cuda",
        f"executor={executor_name}",
        *EXECUTOR_OPTIONS.get(executor_name, []),
        "population.batch_size=4",
        "population.neurons=16",
        "population.time_steps=32",
        "population.contacts=8",
        "verify.enabled=true",
        "verify.updates=5",
        f"verify.param_atol={tolerance}",
        f"verify.loss_atol={tolerance}",
        "run.warmup_updates=1",
        "run.measured_updates=3",
    )
    result = run_experiment(config)
    assert result.streams == 4
    assert result.verification is not None and result.verification.passed, result.verification
    assert result.verification.max_abs_param_change > 1e-5, "the compared updates must move the banks"


def test_a_batched_plugin_population_runs_in_the_fused_kernel(make_config, plugin_registry) -> None:
    config = make_config(
        "device=cuda",
        "population=doc_lite",
        "population.streams=3",
        "executor=fused_cudagraph",
        "verify.enabled=true",
        "verify.param_atol=1e-5",
        "verify.loss_atol=1e-5",
        "run.measured_updates=3",
    )
    result = run_experiment(config, registry=plugin_registry)
    assert result.streams == 3 and result.verification is not None and result.verification.passed


@pytest.mark.parametrize(
    "loss",
    [("loss=causal_mse",), ("loss=mse",), ("loss=huber", "loss.delta=0.05", "loss.warmup_steps=6")],
    ids=["causal_mse", "mse", "huber"],
)
@pytest.mark.parametrize("in_kernel", [True, False])
def test_the_fused_executor_computes_the_loss_in_its_kernels_and_verifies(
    make_config, client, loss: tuple[str, ...], in_kernel: bool
) -> None:
    config = make_config(
        "device=cuda",
        "executor=fused_cudagraph",
        f"executor.loss_in_kernel={str(in_kernel).lower()}",
        *loss,
        "population.time_steps=30",  # a partial last patch
        "verify.enabled=true",
        "verify.updates=5",
        "verify.param_atol=1e-5",
        "verify.loss_atol=1e-5",
        "run.measured_updates=3",
    )
    result = run_experiment(config)
    assert result.verification is not None and result.verification.passed, result.verification
    assert result.verification.max_abs_param_change > 1e-5, "the compared updates must move the banks"
    tags = client.get_run(result.run_id).data.tags
    assert tags[names.FUSED_LOSS] == ("kernel" if in_kernel else "torch")
    assert tags[names.FUSED_STEP] == "kernel", "auto (the default) fuses adam after no transform"


BUCKETED = ("cudagraph", "regional_cudagraph", "fused_cudagraph")
VARIED = ("population.lengths=[9,13,16,24,30]", "population.batches=6", "population.batch_size=2")


@pytest.mark.parametrize("executor_name", BUCKETED)
def test_bucket_graphs_equal_exact_length_eager_updates_and_capture_consumes_none(
    cuda_plan, executor_name: str
) -> None:
    from axoexp.lengths import DEFAULT_BUCKETS, bucket_of, buckets_for

    plan = cuda_plan(f"executor={executor_name}", *EXECUTOR_OPTIONS.get(executor_name, []), *VARIED)
    setup = plan.build_population()
    lengths = [int(inputs.shape[-2]) for inputs, _ in setup.batches]
    assert len(set(lengths)) > 1, lengths
    reference_module = copy.deepcopy(setup.module)
    captured = plan.build_executor(setup.module)
    reference = plan.build_executor(reference_module, "eager")
    for executor, module in ((captured, setup.module), (reference, reference_module)):
        eager_update(  # an earlier update, so Adam has state to restore (a captured step needs prepare)
            module, executor.optimizer, executor.loss_fn, executor.gradient_transform, *setup.batches[0]
        )
    before = _state(setup.module, captured.optimizer)
    phases = captured.prepare_all(setup.batches)
    assert all(torch.equal(a, b) for a, b in zip(before, _state(setup.module, captured.optimizer), strict=True))
    used = {bucket_of(length, buckets_for(DEFAULT_BUCKETS, lengths)) for length in lengths}
    assert captured.buckets() == tuple(sorted(used))
    assert {names.bucket_phase(bucket) for bucket in used} <= set(phases)
    assert captured.prepared_metrics[names.GRAPH_POOL_BYTES] > 0
    assert captured.captures() == len(used) and reference.captures() is None
    tolerance = float(TOLERANCE.get(executor_name, "1e-6"))
    for index in range(2 * len(setup.batches)):
        inputs, targets = setup.batches[index % len(setup.batches)]
        torch.testing.assert_close(
            captured.step(inputs, targets), reference.step(inputs, targets), atol=tolerance, rtol=0
        )
    assert captured.captures() == len(used), "every batch replays a graph captured in prepare: no recapture"
    captured.capture(captured.captured_forward(), *setup.batches[0], bucket=max(used))  # as a re-capture would
    assert captured.captures() == len(used) + 1
    for a, b in zip(setup.module.parameters(), reference_module.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=tolerance, rtol=0)


@pytest.mark.parametrize("executor_name", BUCKETED)
def test_a_bucketed_run_verifies_each_bucket_and_logs_its_metrics(make_config, executor_name: str) -> None:
    tolerance = TOLERANCE.get(executor_name, "1e-6")
    config = make_config(
        "device=cuda",
        f"executor={executor_name}",
        *EXECUTOR_OPTIONS.get(executor_name, []),
        *VARIED,
        "verify.enabled=true",
        "verify.updates=4",
        f"verify.param_atol={tolerance}",
        f"verify.loss_atol={tolerance}",
        "run.warmup_updates=2",
        "run.measured_updates=24",
    )
    result = run_experiment(config)
    assert result.verification is not None and result.verification.passed, result.verification
    metrics = MlflowClient(result.tracking_uri).get_run(result.run_id).data.metrics
    buckets = sorted(int(key.split("_")[1]) for key in metrics if key.endswith("_verify_passed"))
    assert len(buckets) > 1, metrics
    for bucket in buckets:
        assert metrics[names.bucket_verify_metric(bucket, "verify_passed")] == 1.0
        assert metrics[names.bucket_verify_metric(bucket, "verify_max_abs_param_change")] > 1e-5
        assert metrics[names.phase_metric(names.bucket_phase(bucket))] > 0
    assert any(names.bucket_update_metric(bucket, "median") in metrics for bucket in buckets)
    assert metrics[names.PADDING_OVERHEAD] > 1.0 and metrics[names.GRAPH_POOL_BYTES] > 0
    assert metrics[names.RECAPTURES] == 0 == result.recaptures, "the steady state captures nothing"
    tags = MlflowClient(result.tracking_uri).get_run(result.run_id).data.tags
    assert tags[names.LENGTH_BUCKETS] == ",".join(map(str, buckets)) == ",".join(map(str, result.buckets or ()))


def test_compiled_cudagraph_refuses_varying_lengths_while_planning(cuda_plan) -> None:
    with pytest.raises(ConfigError, match="executor=compiled_cudagraph cannot run batches of these lengths"):
        cuda_plan("executor=compiled_cudagraph", *VARIED)


def test_a_cuda_sweep_forks_each_job_from_a_process_without_cuda(tmp_path: Path) -> None:
    """Planning the sweep's jobs up front reads the GPU through NVML only: each job's forked
    process can still use CUDA (a process that initialised CUDA cannot fork one that does)."""
    result = run_cli(
        "-m", "device=cuda", "executor=eager,cudagraph", "run.measured_updates=5", "run.warmup_updates=2", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("axoexp").experiment_id])
    children = [run for run in runs if names.PARENT_RUN_ID in run.data.tags]
    assert sorted(run.info.status for run in children) == ["FINISHED", "FINISHED"]


def test_planning_a_cuda_run_leaves_cuda_uninitialised(tmp_path: Path) -> None:
    probe = (
        "import torch\n"
        "from hydra import compose, initialize_config_module\n"
        "from axoexp import load_plugins\n"
        "from axoexp.config import register_configs\n"
        "from axoexp.plan import plan_experiment\n"
        "registry = load_plugins()\n"
        "register_configs(registry)\n"
        "with initialize_config_module(config_module='axoexp.conf', version_base='1.3'):\n"
        "    config = compose('config', overrides=['device=cuda', 'executor=cudagraph'])\n"
        "plan_experiment(config, registry)\n"
        "print('INITIALISED', torch.cuda.is_initialized())\n"
        "import os\n"
        "child = os.fork()\n"  # what a sweep does next: is_available() before it would have poisoned this
        "if child == 0:\n"
        "    torch.zeros(1, device='cuda')\n"
        "    os._exit(0)\n"
        "print('CHILD', os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert "INITIALISED False" in out.stdout, out.stdout + out.stderr
    assert "CHILD 0" in out.stdout, "a process forked after planning uses CUDA: " + out.stdout + out.stderr


# --- issue 23, part 1: the fused gradient transform and optimizer step (executor.fused_step=true) -----------

FUSED_STEP = ("executor=fused_cudagraph", "executor.fused_step=true")


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("transform", TRANSFORMS)
def test_the_fused_step_keeps_parity_with_eager_over_several_updates(make_config, optimizer, transform) -> None:
    config = make_config(
        "device=cuda",
        *FUSED_STEP,
        *OPTIMIZERS[optimizer],
        *TRANSFORMS[transform],
        "population.neurons=16",
        "population.time_steps=32",
        "population.contacts=8",
        "verify.enabled=true",
        "verify.updates=5",
        "verify.param_atol=1e-5",
        "verify.loss_atol=1e-5",
        "run.warmup_updates=1",
        "run.measured_updates=3",
    )
    result = run_experiment(config)
    assert result.verification is not None and result.verification.passed, result.verification
    assert result.verification.max_abs_param_change > 1e-5, "the compared updates must move the banks"


@pytest.mark.parametrize("optimizer", ("adam", "sgd_momentum"))
def test_capture_with_the_fused_step_consumes_no_update(cuda_plan, optimizer: str) -> None:
    plan = cuda_plan(*FUSED_STEP, *OPTIMIZERS[optimizer], *TRANSFORMS["clip_norm"])
    setup = plan.build_population()
    executor = plan.build_executor(setup.module)
    assert executor.fused_step is not None
    eager_update(
        setup.module, executor.optimizer, executor.loss_fn, None, *setup.batches[1], fused_step=executor.fused_step
    )  # an earlier update, so the optimizer has state (and Adam a step count) to restore
    before = _state(setup.module, executor.optimizer)
    executor.prepare(*setup.batches[0])
    after = _state(setup.module, executor.optimizer)
    assert len(before) == len(after) and all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert int(executor.fused_step.tickets) == 0


def test_the_fused_step_replaces_the_optimizers_kernels_in_the_captured_update(cuda_plan) -> None:
    """One replay, profiled: the transform and step are the fused step's two launches; of torch's
    multi-tensor kernels only zero_grad's is left."""
    from axoexp.timing import gpu_activities

    counts = {}
    for fused in ("false", "true"):
        plan = cuda_plan("executor=fused_cudagraph", f"executor.fused_step={fused}", *TRANSFORMS["clip_norm"])
        setup = plan.build_population()
        executor = plan.build_executor(setup.module)
        executor.prepare(*setup.batches[0])
        counts[fused] = gpu_activities(lambda run=executor.step, batch=setup.batches[0]: run(*batch), plan.device)
    fused_names = {
        name: count for name, count in counts["true"].items() if name in ("step_kernel", "norm_partials_kernel")
    }
    assert fused_names == {"norm_partials_kernel": 1, "step_kernel": 1}, counts["true"]
    assert sum(count for name, count in counts["true"].items() if "multi_tensor_apply" in name) <= 1, counts["true"]
    assert counts["true"].total() <= counts["false"].total() - 10, (counts["true"], counts["false"])


def test_the_fused_update_at_its_defaults_is_at_most_eight_gpu_activities(cuda_plan) -> None:
    """Issue 23's count, one update profiled (the copies in, the replay, the loss out): the inputs'
    and the targets' copies, the gradients zeroed, the two recurrence kernels (the backward adding the
    banks' gradients and summing the loss, no autograd), the fused step and the loss's copy."""
    from axoexp.timing import gpu_activities

    counts = {}
    for in_kernel in ("true", "false"):
        plan = cuda_plan("executor=fused_cudagraph", f"executor.gradients_in_kernel={in_kernel}")
        setup = plan.build_population()
        executor = plan.build_executor(setup.module)
        executor.prepare(*setup.batches[0])
        assert executor.prepared_tags[names.FUSED_GRADIENTS] == ("kernel" if in_kernel == "true" else "autograd")
        counts[in_kernel] = gpu_activities(lambda run=executor.step, batch=setup.batches[0]: run(*batch), plan.device)
    kernels = ("_lite_forward_kernel", "_lite_backward_kernel", "step_kernel")
    assert all(counts["true"][name] == 1 for name in kernels), counts["true"]
    assert counts["true"].total() <= 8, counts["true"]
    assert counts["false"].total() > counts["true"].total(), (counts["false"], counts["true"])


def test_bucket_graphs_share_the_fused_step_and_equal_exact_length_eager_updates(cuda_plan) -> None:
    """Every length bucket's graph replays the same fused step over the same flat buffers."""
    plan = cuda_plan(*FUSED_STEP, *VARIED, *TRANSFORMS["clip_norm"])
    setup = plan.build_population()
    reference_module = copy.deepcopy(setup.module)
    captured = plan.build_executor(setup.module)
    reference = plan.build_executor(reference_module, "eager")
    captured.prepare_all(setup.batches)
    assert captured.buckets() is not None and len(captured.buckets()) > 1
    for index in range(2 * len(setup.batches)):
        inputs, targets = setup.batches[index % len(setup.batches)]
        torch.testing.assert_close(captured.step(inputs, targets), reference.step(inputs, targets), atol=1e-5, rtol=0)
    for a, b in zip(setup.module.parameters(), reference_module.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
