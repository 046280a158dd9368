#!/usr/bin/env python3
"""Which compiled region makes a captured AxoSim-Lite update fast *and* quick to compile?

    python benchmarks/explore/compile_regions.py --skip whole                      # H200, about 5-6 min
    python benchmarks/explore/compile_regions.py --strategies token blocks-4+edges@mmdecomp
    python benchmarks/explore/compile_regions.py --self-check                      # CPU, no CUDA graph

``compiled_cudagraph`` compiles the whole population module, and dynamo unrolls AxoSim-Lite's
Python loop over the T/4 P4 tokens (100 s at 64x256x32). This script compiles smaller
regions of the same forward and reuses them on every token instead:

  whole          torch.compile(population) exactly as the compiled_cudagraph executor does
  token          torch.compile(neuron.step_token, fullgraph) on the instance; axosim's own
                 forward and loop are unchanged (the earlier scout)
  blocks-K       one compiled region that runs K consecutive step_token calls, called
                 T/(4K) times on ``tokens.split(K, dim=1)``; a shorter last chunk (when K
                 does not divide T/4) compiles a second graph of the same region
  scan           the token loop as torch._higher_order_ops.scan inside one compiled region
                 (not in the default list: inductor lowers scan to a while_loop that reads
                 its counter with .item() every iteration, which a CUDA graph cannot capture)
  ...+edges      also compile what runs before the loop (contact summaries, runtime
                 coefficients, input projection) and after it (concatenation and the
                 4-step warm-up padding) as two more regions
  ...+zerostate  the re-expressed forwards start the recurrence from zeros that require
                 grad (a leaf whose gradient is dropped), so every region call sees the same
                 requires_grad and the region compiles one graph, not two; +zerostate keeps
                 axosim's constant zeros (the first call then compiles its own graph, as
                 ``token`` does)
  ...+unbound    blocks-K gets its K tokens as K separate tensors and returns K separate
                 forecasts (not a chunk and a stacked result), so every token's kernels are
                 the same source (no token offsets baked in) and inductor compiles them once
  ...@P1,P2      inductor option presets, see PRESETS (mmdecomp turns the tiny matmuls into
                 pointwise code that fuses; cdt = coordinate descent tuning; ...)
  best...        resolved at run time to the best region measured so far for the shape
                 (lowest replay / bare ratio among cold runs that compiled within
                 --compile-budget-s), e.g. ``best@mmdecomp`` = that region plus mmdecomp

Everything but ``whole`` and ``token`` re-expresses AxoSimPopulation.forward (same ops, same
order) around the compiled regions, without modifying axosim; ``--self-check`` verifies on
CPU that each re-expression equals the original forward and gradients (uncompiled: exactly)
and that each compiled strategy compiles with inductor and matches eager updates.

Every (shape, strategy) runs in a fresh subprocess with a fresh TORCHINDUCTOR_CACHE_DIR and
TRITON_CACHE_DIR (``cold``), then in a second subprocess reusing those caches (``warm``).
Each subprocess builds the population as axoexp does (population ``lite``, seed 0, float32,
Adam lr 1e-3 capturable, causal MSE, no gradient transform) and measures:

  startup_s   the wait, right before compiling, for what is left of inductor's one-off
              start-up (imports, compile workers), begun in the background at the worker's
              start as axoexp's compiled executors do (axoexp.executors.compiler_startup)
  compile_s   one forward and backward (gradients zeroed after, no update) on a side stream,
              as the compiled_cudagraph executor's prepare does
  kernels     Triton kernels inductor generated (replayed from its cache when warm), and
              the cubins in the strategy's TRITON_CACHE_DIR (one per autotuning config; a
              warm process finds the cold one's)
  capture_s   axosim.CudaGraphAdaptationStep.capture of the whole update (3 warm-up updates)
  replay      host clock around each captured update and a device synchronise, over
              --rounds x --updates updates after --warmup, interleaved round by round with
              the bare helper (CudaGraphAdaptationStep on the uncompiled module) in the
              same process; ratio = median / bare median
  parity      max |parameter difference| to eager updates of the uncompiled module after 5
              updates from the same initial state (also for the bare helper)
  pipelined   CUDA-event time per update over back-to-back replays (no host sync between)
  device      (cold only) summed GPU activity and number of GPU operations per update
              recorded by torch.profiler over a few replays

Failures (exceptions, timeouts, crashes) are recorded as rows, never abort the run. One JSON
line per row goes to stdout; ``--out X.json`` also gets X.jsonl (appended as rows arrive),
X.md (a table) and X-logs/ (each subprocess's output).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, replace
from datetime import date
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve()

DEFAULT_SHAPES = ("64x256x32",)
SELF_CHECK_SHAPES = ("3x12x4", "4x32x4")
DEFAULT_STRATEGIES = (
    "token",
    "blocks-2",
    "blocks-4",
    "blocks-8",
    "blocks-16",
    "token+edges",
    "best+edges",
    "best@mmdecomp",
    "best@cdt",
    "whole",
)
SELF_CHECK_STRATEGIES = (
    "whole",
    "token",
    "token+edges",
    "blocks-1",
    "blocks-2",
    "blocks-4",
    "blocks-16",
    "blocks-2+edges",
    "blocks-3+edges+unbound",
    "blocks-4+edges@mmdecomp",
    "blocks-2@aggr",
    "scan",
)
PARITY_UPDATES = 5
GOAL = {"compile_s": 10.0, "ratio_vs_bare": 0.37, "parity": 1e-6}

# Inductor options every strategy gets (as the compiled_cudagraph executor): no cudagraph trees.
BASE_OPTIONS: dict[str, Any] = {"triton.cudagraphs": False}
PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    "mmdecomp": {},  # axoexp.executors.matmul_decomposition's options, added in apply_strategy
    "cdt": {"coordinate_descent_tuning": True},
    "combo": {"combo_kernels": True},
    "aggr": {"aggressive_fusion": True},
    "unroll32": {"unroll_reductions_threshold": 32},
    "maxat": {"max_autotune": True},  # autotunes every mm: slow to compile
    "noalign": {"assume_aligned_inputs": False},
}
BASES = ("whole", "token", "blocks", "scan", "best")


# --------------------------------------------------------------------------- strategies


@dataclass(frozen=True)
class Spec:
    """A strategy: BASE[-K][+edges][@PRESET,PRESET...]."""

    base: str
    k: int = 0
    edges: bool = False
    presets: tuple[str, ...] = ()
    grad_state: bool = True  # +zerostate: axosim's initial state (no grad), as the first call sees it
    unbound: bool = False  # +unbound: a region's tokens and forecasts are separate tensors

    @property
    def name(self) -> str:
        text = f"blocks-{self.k}" if self.base == "blocks" else self.base
        if self.edges:
            text += "+edges"
        if not self.grad_state:
            text += "+zerostate"
        if self.unbound:
            text += "+unbound"
        if self.presets:
            text += "@" + ",".join(self.presets)
        return text

    def options(self) -> dict[str, Any]:
        options = dict(BASE_OPTIONS)
        for preset in self.presets:
            options.update(PRESETS[preset])
        return options


def parse_spec(text: str) -> Spec:
    match = re.fullmatch(
        r"(whole|token|scan|best|blocks-(\d+))(\+edges)?(\+zerostate)?(\+unbound)?(?:@([\w,]+))?", text.strip()
    )
    if not match:
        raise ValueError(
            f"strategy {text!r} is not BASE[+edges][+zerostate][+unbound][@PRESET,...] with BASE one of "
            "whole, token, blocks-K, scan, best"
        )
    base = "blocks" if match.group(2) else match.group(1)
    k = int(match.group(2) or 0)
    if base == "blocks" and k < 1:
        raise ValueError(f"strategy {text!r}: K must be at least 1")
    presets = tuple(p for p in (match.group(6) or "").split(",") if p)
    unknown = [p for p in presets if p not in PRESETS]
    if unknown:
        raise ValueError(f"strategy {text!r}: unknown preset(s) {unknown}; known: {sorted(PRESETS)}")
    if base == "whole" and (match.group(3) or match.group(4)):
        raise ValueError("whole has no separate edges or state: it compiles the whole forward")
    if base == "token" and match.group(4) and not match.group(3):
        raise ValueError("token keeps axosim's own loop; token+edges+zerostate re-expresses it")
    if match.group(5) and base != "blocks":
        raise ValueError(f"strategy {text!r}: +unbound applies to blocks-K only")
    return Spec(
        base=base,
        k=k,
        edges=bool(match.group(3)),
        presets=presets,
        grad_state=not match.group(4),
        unbound=bool(match.group(5)),
    )


def parse_shape(text: str) -> tuple[int, int, int]:
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"shape {text!r} is not NEURONSxTIME_STEPSxCONTACTS")
    return int(parts[0]), int(parts[1]), int(parts[2])


def shape_label(shape: tuple[int, int, int]) -> str:
    return "x".join(map(str, shape))


def apply_strategy(population: Any, spec: Spec, *, compiled: bool = True) -> Any:
    """Return the module to capture: ``population`` with ``spec``'s compiled regions.

    With ``compiled=False`` the same re-expressed forward runs uncompiled (self-check).
    """
    import torch

    options = spec.options()
    if "mmdecomp" in spec.presets:
        from axoexp.executors import matmul_decomposition

        matmul_decomposition.widen_thresholds()
        options.update(matmul_decomposition.OPTIONS)

    def compile_region(fn: Any) -> Any:
        if not compiled:
            return fn
        return torch.compile(fn, backend="inductor", dynamic=False, fullgraph=True, options=options)

    if spec.base == "whole":
        if not compiled:
            return population
        # exactly as axoexp.executors.compiled.CompiledCudaGraphExecutor
        return torch.compile(population, backend="inductor", dynamic=False, options=options)

    neuron = population.neuron
    if spec.base == "token" and not spec.edges:
        # the scout: axosim's forward and loop unchanged, step_token compiled on the instance
        neuron.step_token = compile_region(neuron.step_token)
        return population

    forward = regioned_forward(population, spec, compile_region)

    class Regioned(torch.nn.Module):
        """The population (a submodule, so state_dict and capture see it), its forward
        re-expressed around the compiled regions."""

        def __init__(self) -> None:
            super().__init__()
            self.population = population

        def forward(self, contact_inputs: torch.Tensor) -> torch.Tensor:
            return forward(contact_inputs)

    return Regioned()


def regioned_forward(population: Any, spec: Spec, compile_region: Any) -> Any:
    """AxoSimPopulation.forward (via AxoSimLite._rollout_feature_summaries), the same ops in
    the same order, with the token loop (and optionally its edges) as compiled regions."""
    import torch

    neuron = population.neuron
    config = neuron.config
    patch = neuron.patch_size
    state_dim = config.state_dim

    def before_loop(contact_inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        summaries = population._contact_summaries(contact_inputs)
        cache = population._runtime_coefficients()
        neurons, steps = summaries.shape[0], summaries.shape[1]
        full_steps = steps - steps % patch
        tokens = neuron.input_projection(
            summaries[:, :full_steps].reshape(neurons, full_steps // patch, patch * config.route_feature_dim)
        )
        return tokens, cache

    def after_loop(steps: int, *forecasts: torch.Tensor) -> torch.Tensor:
        forecast = torch.cat(forecasts, dim=1)
        available = steps - patch
        # axosim: cat(zeros[:, :patch], forecast[:, :available], zeros[:, patch+available:]);
        # the last piece is empty whenever steps >= patch
        head = forecast.new_zeros(forecast.shape[0], patch, config.output_dim)
        return torch.cat((head, forecast[:, :available]), dim=1)

    def block(chunk: torch.Tensor, state: torch.Tensor, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        predictions = []
        for index in range(chunk.shape[1]):
            prediction, state = neuron.step_token(chunk[:, index], state, adaptation_cache=cache)
            predictions.append(prediction)
        return torch.cat(predictions, dim=1), state

    def block_unbound(state: torch.Tensor, cache: torch.Tensor, *tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
        predictions = []
        for token in tokens:
            prediction, state = neuron.step_token(token, state, adaptation_cache=cache)
            predictions.append(prediction)
        return state, *predictions

    def scanned(tokens: torch.Tensor, state: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        from torch._higher_order_ops import scan

        def combine(carry: torch.Tensor, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            prediction, next_state = neuron.step_token(token, carry, adaptation_cache=cache)
            return next_state, prediction.clone()  # a scan output must not be a view

        _, predictions = scan(combine, state, tokens.movedim(1, 0))
        blocks = predictions.shape[0]
        return predictions.movedim(0, 1).reshape(tokens.shape[0], blocks * patch, config.output_dim)

    pre = compile_region(before_loop) if spec.edges else before_loop
    post = compile_region(after_loop) if spec.edges else after_loop
    step = compile_region(neuron.step_token) if spec.base == "token" else None
    region = compile_region(block_unbound if spec.unbound else block) if spec.base == "blocks" else None
    scan_region = compile_region(scanned) if spec.base == "scan" else None

    def forward(contact_inputs: torch.Tensor) -> torch.Tensor:
        steps = contact_inputs.shape[1]
        if steps < patch:  # no full P4 block: axosim returns zeros; nothing to compile
            return population(contact_inputs)
        tokens, cache = pre(contact_inputs)
        state = tokens.new_zeros(tokens.shape[0], state_dim)  # AxoSimLite.initial_state
        if spec.grad_state and torch.is_grad_enabled():
            # the same zeros, as a leaf that requires grad: every region call then sees a
            # state that requires grad, so the region compiles one graph, not two (the first
            # call's state would otherwise differ). Its gradient is computed and dropped.
            state.requires_grad_(True)
        forecasts = []
        if spec.base == "token":
            for index in range(tokens.shape[1]):
                prediction, state = step(tokens[:, index], state, adaptation_cache=cache)
                forecasts.append(prediction)
        elif spec.unbound:
            for chunk in tokens.split(spec.k, dim=1):
                state, *predictions = region(state, cache, *chunk.unbind(1))
                forecasts += predictions
        elif spec.base == "blocks":
            for chunk in tokens.split(spec.k, dim=1):
                prediction, state = region(chunk, state, cache)
                forecasts.append(prediction)
        else:
            forecasts.append(scan_region(tokens, state, cache))
        output = post(steps, *forecasts)
        neuron.base_soma_prediction = output[..., 1:2]  # as axosim keeps it
        return output

    return forward


# --------------------------------------------------------------------------- shared pieces


def import_axoexp() -> dict[str, Any]:
    """The axoexp pieces this script uses (``import axoexp`` loads neither mlflow nor hydra)."""
    from axoexp.components.losses import causal_mse
    from axoexp.components.population import lite
    from axoexp.executors.base import eager_update
    from axoexp.executors.capture import release_autograd_graphs

    return {
        "lite": lite,
        "causal_mse": causal_mse,
        "release_autograd_graphs": release_autograd_graphs,
        "eager_update": eager_update,
    }


def make_optimizer(module: Any, device_type: str) -> Any:
    import torch

    return torch.optim.Adam(list(module.trainable_adaptation_parameters()), lr=1e-3, capturable=device_type == "cuda")


def trainable(module: Any) -> list[Any]:
    return [p.detach() for p in module.trainable_adaptation_parameters()]


def max_abs_diff(a: list[Any], b: list[Any]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def percentiles(samples: list[float]) -> dict[str, float]:
    import numpy as np

    values = np.asarray(samples, dtype=np.float64)
    p10, median, p90 = np.percentile(values, [10, 50, 90])
    return {
        "median": float(median),
        "p10": float(p10),
        "p90": float(p90),
        "mean": float(values.mean()),
        "min": float(values.min()),
        "max": float(values.max()),
        "count": int(values.size),
    }


def dynamo_counters() -> dict[str, Any]:
    try:
        from torch._dynamo.utils import counters

        return {
            "frames_ok": int(counters["frames"].get("ok", 0)),
            "frames_total": int(counters["frames"].get("total", 0)),
            "unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
            "graph_breaks": int(sum(counters["graph_break"].values())),
            "decompose_mm": {k: int(v) for k, v in counters["inductor"].items() if k.startswith("decompose_")},
        }
    except Exception as error:
        return {"error": repr(error)}


def count_triton_kernels() -> int:
    """Cubins in TRITON_CACHE_DIR (one per kernel and autotuning config)."""
    root = os.environ.get("TRITON_CACHE_DIR")
    return sum(1 for _ in Path(root).rglob("*.cubin")) if root and Path(root).is_dir() else 0


def raise_recompile_limit() -> None:
    """A region may compile a few graphs (first call, short last chunk); never fall back to eager."""
    import torch

    for name in ("recompile_limit", "cache_size_limit"):
        try:
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 16))
        except Exception:
            pass


def environment(device: Any) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "cuda_runtime": torch.version.cuda,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:
        info["triton"] = None
    try:
        import axosim

        info["axosim"] = getattr(axosim, "__version__", None) or _dist_version("axosim")
    except Exception:
        pass
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        try:
            info["driver"] = torch.cuda.driver_version() if hasattr(torch.cuda, "driver_version") else None
        except Exception:
            info["driver"] = None
    return info


def _dist_version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


# --------------------------------------------------------------------------- worker


class Reporter:
    """The worker's row: PARTIAL lines as stages finish (kept if it later times out), RESULT at the end."""

    def __init__(self, row: dict[str, Any]) -> None:
        self.row = row
        self.start = time.perf_counter()

    def stage(self, name: str, **values: Any) -> None:
        self.row.update(values)
        self.row["stage"] = name
        self.row["wall_s"] = round(time.perf_counter() - self.start, 3)
        shown = ", ".join(f"{k}={_short(v)}" for k, v in values.items() if not isinstance(v, dict))
        print(f"# {self.row['wall_s']:7.2f}s {name}{': ' + shown if shown else ''}", flush=True)
        print("PARTIAL " + json.dumps(self.row, default=str), flush=True)

    def finish(self) -> None:
        self.row["wall_s"] = round(time.perf_counter() - self.start, 3)
        print("RESULT " + json.dumps(self.row, default=str), flush=True)


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def run_worker(args: argparse.Namespace) -> int:
    shape = parse_shape(args.shape)
    spec = parse_spec(args.strategy)
    row: dict[str, Any] = {
        "shape": shape_label(shape),
        "strategy": args.requested or spec.name,
        "resolved": spec.name,
        "phase": args.phase,
        "ok": False,
        "error": None,
        "options": spec.options(),
        "cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
    }
    report = Reporter(row)
    try:
        _worker_body(args, shape, spec, report)
        row["ok"] = True
    except BaseException as error:
        row["error"] = f"{type(error).__name__}: {error}"[:2000]
        row["traceback"] = traceback.format_exc()[-6000:]
        print(row["traceback"], file=sys.stderr, flush=True)
    report.finish()
    return 0


def _worker_body(args: argparse.Namespace, shape: tuple[int, int, int], spec: Spec, report: Reporter) -> None:
    import torch

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but torch.cuda.is_available() is False")
    raise_recompile_limit()
    from axoexp.executors import compiler_startup

    compiler_startup.begin(device)
    axoexp = import_axoexp()
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    report.stage("imports", env=environment(device))

    neurons, time_steps, contacts = shape
    setup = axoexp["lite"](
        device=device, dtype=torch.float32, seed=0, neurons=neurons, time_steps=time_steps, contacts=contacts
    )
    pristine = copy.deepcopy(setup.module)
    batches = setup.batches
    loss_fn = axoexp["causal_mse"]()
    eager_update = axoexp["eager_update"]
    release = axoexp["release_autograd_graphs"]
    sync()
    report.stage("population", batches=len(batches))

    # eager reference: PARITY_UPDATES updates of the uncompiled module from the same state
    reference = copy.deepcopy(pristine)
    reference_optimizer = make_optimizer(reference, device.type)
    reference_losses = [
        eager_update(reference, reference_optimizer, loss_fn, None, *batches[i % len(batches)])
        for i in range(PARITY_UPDATES)
    ]
    reference_params = trainable(reference)
    initial_params = trainable(pristine)
    sync()

    def parity(step: Any, module: Any) -> dict[str, float]:
        losses = [step(*batches[i % len(batches)]) for i in range(PARITY_UPDATES)]
        sync()
        return {
            "max_abs_param_diff": max_abs_diff(reference_params, trainable(module)),
            "max_abs_loss_diff": max(abs(float(a) - float(b)) for a, b in zip(reference_losses, losses, strict=True)),
            "max_abs_param_change": max_abs_diff(reference_params, initial_params),
        }

    def capture(model: Any, module: Any, optimizer: Any) -> Any:
        if not cuda:  # CPU pipeline test: eager updates of the (compiled) model, no graph
            return lambda inputs, targets: eager_update(model, optimizer, loss_fn, None, inputs, targets)
        from axosim import CudaGraphAdaptationStep

        release(module)
        return CudaGraphAdaptationStep.capture(model, optimizer, *batches[0], loss_fn, warmup_steps=3)

    # the bare helper: CudaGraphAdaptationStep around the uncompiled module
    bare_module = copy.deepcopy(pristine)
    bare_optimizer = make_optimizer(bare_module, device.type)
    sync()
    start = time.perf_counter()
    bare_step = capture(bare_module, bare_module, bare_optimizer)
    sync()
    bare_capture_s = time.perf_counter() - start
    report.stage("bare_capture", bare_capture_s=round(bare_capture_s, 4), bare_parity=parity(bare_step, bare_module))

    # the strategy
    module = copy.deepcopy(pristine)
    model = apply_strategy(module, spec)
    optimizer = make_optimizer(module, device.type)
    report.stage("applied")
    phases: dict[str, float] = {}
    compiler_startup.wait_into(phases, device)
    report.stage("startup", startup_s=round(phases.get(compiler_startup.PHASE, 0.0) / 1e3, 4))
    from torch._inductor import metrics

    generated_before = metrics.generated_kernel_count
    sync()
    start = time.perf_counter()
    inputs, targets = batches[0]
    if cuda:  # as axoexp.executors.compiled._forward_backward_without_update
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            loss_fn(model(inputs), targets).backward()
            optimizer.zero_grad(set_to_none=False)
        torch.cuda.current_stream(device).wait_stream(stream)
    else:
        loss_fn(model(inputs), targets).backward()
        optimizer.zero_grad(set_to_none=False)
    sync()
    compile_s = time.perf_counter() - start
    report.stage(
        "compile",
        compile_s=round(compile_s, 4),
        counters_after_compile=dynamo_counters(),
        kernels_generated=metrics.generated_kernel_count - generated_before,
        kernels_compiled=count_triton_kernels(),
    )

    sync()
    start = time.perf_counter()
    step = capture(model, module, optimizer)
    sync()
    capture_s = time.perf_counter() - start
    counters = dynamo_counters()
    report.stage(
        "capture",
        capture_s=round(capture_s, 4),
        counters_after_capture=counters,
        recompiled_during_capture=counters.get("frames_ok") != report.row["counters_after_compile"].get("frames_ok"),
    )

    checked = parity(step, module)
    report.stage("parity", parity=checked, parity_max_abs_param_diff=checked["max_abs_param_diff"])

    # steady state, the two variants interleaved round by round
    variants = {"bare": bare_step, "strategy": step}
    samples: dict[str, list[float]] = {name: [] for name in variants}
    counter = [0]

    def one(call: Any) -> float:
        batch = batches[counter[0] % len(batches)]
        counter[0] += 1
        sync()
        begin = time.perf_counter_ns()
        call(*batch)
        sync()
        return (time.perf_counter_ns() - begin) / 1e6

    for call in variants.values():
        for _ in range(args.warmup):
            one(call)
    order = list(variants)
    for _ in range(args.rounds):
        order = order[1:] + order[:1]
        for name in order:
            samples[name] += [one(variants[name]) for _ in range(args.updates)]
    replay = percentiles(samples["strategy"])
    bare = percentiles(samples["bare"])
    report.stage(
        "replay",
        replay_ms=replay,
        bare_ms=bare,
        replay_median_ms=replay["median"],
        bare_median_ms=bare["median"],
        ratio_vs_bare=replay["median"] / bare["median"],
    )

    if cuda and args.pipelined > 0:
        pipelined = {}
        for name, call in variants.items():
            first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            sync()
            first.record()
            for index in range(args.pipelined):
                call(*batches[index % len(batches)])
            last.record()
            sync()
            pipelined[name] = first.elapsed_time(last) / args.pipelined
        report.stage("pipelined", pipelined_ms=pipelined["strategy"], bare_pipelined_ms=pipelined["bare"])
    if cuda and args.profile > 0:
        try:
            report.stage("profile", **profile_variants(variants, batches, sync, args.profile))
        except Exception as error:
            report.stage("profile", profile_error=f"{type(error).__name__}: {error}")


def profile_variants(variants: dict[str, Any], batches: list[Any], sync: Any, count: int) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    result: dict[str, Any] = {}
    for name, call in variants.items():
        sync()
        with profile(activities=[ProfilerActivity.CUDA]) as profiler:
            for index in range(count):
                call(*batches[index % len(batches)])
            sync()
        averages = [event for event in profiler.key_averages() if event.self_device_time_total > 0]
        prefix = "" if name == "strategy" else "bare_"
        result[prefix + "device_ms"] = sum(e.self_device_time_total for e in averages) / 1e3 / count
        result[prefix + "device_ops"] = sum(e.count for e in averages) / count
    return result


# --------------------------------------------------------------------------- driver


def run_phase(
    args: argparse.Namespace,
    shape: tuple[int, int, int],
    requested: str,
    spec: Spec,
    phase: str,
    cache_dir: Path,
    timeout: float,
    log_dir: Path | None,
) -> dict[str, Any]:
    """One subprocess; its row, or a failure row built from its last PARTIAL line."""
    env = dict(os.environ)
    env.update(
        {
            "TORCHINDUCTOR_CACHE_DIR": str(cache_dir / "inductor"),
            "TRITON_CACHE_DIR": str(cache_dir / "triton"),
            "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
            "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    command = [
        sys.executable,
        str(SCRIPT),
        "--worker",
        "--shape",
        shape_label(shape),
        "--strategy",
        spec.name,
        "--requested",
        requested,
        "--phase",
        phase,
        "--device",
        args.device,
        "--warmup",
        str(args.warmup),
        "--rounds",
        str(args.rounds),
        "--updates",
        str(args.updates if phase == "cold" else args.warm_updates),
        "--pipelined",
        str(args.pipelined),
        "--profile",
        str(args.profile if phase == "cold" else 0),
    ]
    tag = f"[{shape_label(shape)} {spec.name} {phase}]"
    log_path = None
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"{shape_label(shape)}-{re.sub(r'[^A-Za-z0-9._-]+', '_', spec.name)}-{phase}.log"
    tail: deque[str] = deque(maxlen=60)
    holder: dict[str, Any] = {}
    start = time.perf_counter()
    print(f"# {tag} start (timeout {timeout:.0f} s)", flush=True)
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=str(REPO),
        start_new_session=True,
        bufsize=1,
    )

    def pump() -> None:
        with open(log_path, "w") if log_path else open(os.devnull, "w") as log:
            assert process.stdout is not None
            for line in process.stdout:
                if line.startswith("RESULT "):
                    holder["result"] = json.loads(line[7:])
                elif line.startswith("PARTIAL "):
                    holder["partial"] = json.loads(line[8:])
                else:
                    log.write(line)
                    log.flush()
                    tail.append(line.rstrip())
                    if args.verbose or line.startswith("#"):
                        print(f"  {tag} {line.rstrip()}", flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(process)
    if not timed_out:
        _kill_group(process, signals=(signal.SIGKILL,))  # compile workers a crashed worker left behind
    reader.join(timeout=10)
    elapsed = time.perf_counter() - start
    row = holder.get("result")
    if row is None:
        row = dict(
            holder.get("partial")
            or {"shape": shape_label(shape), "strategy": requested, "resolved": spec.name, "phase": phase}
        )
        row["ok"] = False
        reached = row.get("stage", "start")
        row["error"] = (
            f"timeout after {timeout:.0f} s (last stage reached: {reached})"
            if timed_out
            else f"exit code {process.returncode} (last stage reached: {reached})"
        )
        row["output_tail"] = "\n".join(tail)[-4000:]
    row["subprocess_s"] = round(elapsed, 3)
    row["log"] = str(log_path) if log_path else None
    status = "ok" if row.get("ok") else f"FAILED: {row.get('error')}"
    print(f"# {tag} done in {elapsed:.1f} s: {status}", flush=True)
    return row


def _kill_group(process: subprocess.Popen, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGKILL)) -> None:
    """Signal the worker's process group (it and the inductor compile workers it started)."""
    for sig in signals:
        try:
            os.killpg(process.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            process.wait(timeout=5)
            if sig == signal.SIGTERM:
                time.sleep(0.5)
                os.killpg(process.pid, signal.SIGKILL)
            return
        except subprocess.TimeoutExpired:
            continue
        except (ProcessLookupError, PermissionError):
            return


def resolve_best(spec: Spec, rows: list[dict[str, Any]], shape: str, budget: float) -> tuple[Spec | None, str]:
    """``best...``: the best region measured so far for ``shape``, with spec's edges and presets added."""
    candidates = [
        r
        for r in rows
        if r.get("shape") == shape
        and r.get("phase") == "cold"
        and r.get("ok")
        and r.get("ratio_vs_bare") is not None
        and not r["resolved"].startswith(("whole", "scan"))
        and (r.get("parity_max_abs_param_diff") or 0.0) <= 1e-4
    ]
    within = [r for r in candidates if (r.get("compile_s") or 1e9) <= budget]
    pool = within or candidates
    if not pool:
        return None, "no successful region measured yet"
    best = min(pool, key=lambda r: r["ratio_vs_bare"])
    chosen = parse_spec(best["resolved"])
    presets = tuple(dict.fromkeys(chosen.presets + spec.presets))
    why = (
        f"best so far: {best['resolved']} (ratio {best['ratio_vs_bare']:.3f}, compile "
        f"{best['compile_s']:.1f} s{'' if within else ', none within the compile budget'})"
    )
    return replace(chosen, edges=chosen.edges or spec.edges, presets=presets), why


def meets_goal(row: dict[str, Any]) -> bool:
    return (
        (row.get("compile_s") or 1e9) <= GOAL["compile_s"]
        and row["ratio_vs_bare"] <= GOAL["ratio_vs_bare"]
        and (row.get("parity_max_abs_param_diff") or 0.0) <= GOAL["parity"]
    )


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    from axoexp import names

    env = meta.get("environment") or {}
    lines = [
        f"# Compiled regions — {env.get('gpu', meta['args']['device'])}, {meta['provenance'][names.DATE][:10]}",
        "",
        f"torch {env.get('torch', '?')}, triton {env.get('triton', '?')}, CUDA {env.get('cuda_runtime', '?')}, "
        f"axosim {env.get('axosim', '?')}, axoexp {meta['provenance'][names.GIT_COMMIT][:12]} "
        f"(dirty: {meta['provenance'][names.GIT_DIRTY]}); command: `{meta['provenance'][names.COMMAND]}`. Population lite seed 0 float32, Adam lr 1e-3 capturable, causal MSE. "
        f"Replay: {meta['args']['rounds']} rounds x {meta['args']['updates']} updates after {meta['args']['warmup']} "
        f"warm-up, interleaved with the bare helper in the same process. Cold = fresh inductor/triton cache dir; "
        f"warm = a second process on that cache. Goal: compile <= {GOAL['compile_s']:g} s cold, ratio <= "
        f"{GOAL['ratio_vs_bare']:g}, parity <= {GOAL['parity']:g}.",
        "",
        "| shape | strategy | resolved | phase | start-up s | compile s | kernels generated / compiled "
        "| capture s | median ms | p10 | p90 | bare ms "
        "| / bare | pipelined ms | device ms | device ops | parity dparam | graphs | goal | error / notes |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]

    def cell(value: Any, spec: str) -> str:
        return "" if value is None else format(value, spec)

    for r in rows:
        replay = r.get("replay_ms") or {}
        counters = r.get("counters_after_capture") or {}
        met = ""
        if r.get("phase") == "cold" and r.get("ok") and r.get("ratio_vs_bare") is not None:
            met = "yes" if meets_goal(r) else "no"
        error = (r.get("error") or "").replace("|", "/").replace("\n", " ")[:120]
        decomposed = (r.get("counters_after_compile") or {}).get("decompose_mm") or {}
        if decomposed:  # mmdecomp: how many mm/addmm/bmm the pass rewrote
            error = (error + " " + ", ".join(f"{k}={v}" for k, v in sorted(decomposed.items()))).strip()
        lines.append(
            f"| {r.get('shape')} | {r.get('strategy')} | {r.get('resolved')} | {r.get('phase')} "
            f"| {cell(r.get('startup_s'), '.2f')} | {cell(r.get('compile_s'), '.2f')} "
            f"| {r.get('kernels_generated', '')} / {r.get('kernels_compiled', '')} | {cell(r.get('capture_s'), '.2f')} "
            f"| {cell(replay.get('median'), '.3f')} | {cell(replay.get('p10'), '.3f')} | {cell(replay.get('p90'), '.3f')} "
            f"| {cell(r.get('bare_median_ms'), '.3f')} | {cell(r.get('ratio_vs_bare'), '.3f')} "
            f"| {cell(r.get('pipelined_ms'), '.3f')} | {cell(r.get('device_ms'), '.3f')} "
            f"| {cell(r.get('device_ops'), '.0f')} | {cell(r.get('parity_max_abs_param_diff'), '.1e')} "
            f"| {cell(counters.get('unique_graphs'), 'd')} | {met} | {error} |"
        )
    cold = [r for r in rows if r.get("phase") == "cold" and r.get("ok") and r.get("ratio_vs_bare") is not None]
    for shape in dict.fromkeys(r["shape"] for r in cold):
        mine = [r for r in cold if r["shape"] == shape]
        fast = min(mine, key=lambda r: r["ratio_vs_bare"])
        quick = [r for r in mine if (r.get("compile_s") or 1e9) <= GOAL["compile_s"]]
        lines += [
            "",
            f"{shape}: lowest ratio {fast['ratio_vs_bare']:.3f} ({fast['resolved']}, compile "
            f"{fast['compile_s']:.1f} s cold)"
            + (
                f"; lowest ratio within {GOAL['compile_s']:g} s cold compile: "
                f"{min(quick, key=lambda r: r['ratio_vs_bare'])['ratio_vs_bare']:.3f} "
                f"({min(quick, key=lambda r: r['ratio_vs_bare'])['resolved']})"
                if quick
                else f"; none compiled within {GOAL['compile_s']:g} s cold"
            )
            + f"; meeting the whole goal: {', '.join(r['resolved'] for r in mine if meets_goal(r)) or 'none'}.",
        ]
    notes = [
        f"{r['strategy']} -> {r['resolved']}: {r['best_note']}"
        for r in rows
        if r.get("best_note") and r.get("phase") == "cold"
    ]
    if notes:
        lines += ["", "Resolved: " + "; ".join(notes) + "."]
    bare = [r for r in rows if r.get("bare_device_ms") is not None]
    if bare:
        lines += [
            "",
            "Bare helper device ms / device ops per update (cold rows): "
            + ", ".join(f"{r['resolved']}: {r['bare_device_ms']:.3f} / {r['bare_device_ops']:.0f}" for r in bare),
        ]
    return "\n".join(lines) + "\n"


def run_driver(args: argparse.Namespace) -> int:
    shapes = [parse_shape(s) for s in (args.shapes or DEFAULT_SHAPES)]
    requested = [s for s in (args.strategies or DEFAULT_STRATEGIES) if s not in set(args.skip)]
    for text in requested:
        parse_spec(text)  # fail fast on a typo
    out = Path(args.out) if args.out else REPO / "benchmarks" / "results" / f"compile-regions-{date.today()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    jsonl = out.with_suffix(".jsonl")
    jsonl.write_text("")
    log_dir = out.parent / f"{out.stem}-logs"
    from axoexp import metadata

    meta: dict[str, Any] = {"provenance": metadata.provenance(), "args": vars(args), "environment": None}
    rows: list[dict[str, Any]] = []
    begin = time.perf_counter()
    cache_root = Path(args.cache_root) if args.cache_root else None

    def emit(row: dict[str, Any]) -> None:
        rows.append(row)
        if meta["environment"] is None and row.get("env"):
            meta["environment"] = row["env"]
        print(json.dumps(row, default=str), flush=True)
        with jsonl.open("a") as stream:
            stream.write(json.dumps(row, default=str) + "\n")
        out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, default=str))
        out.with_suffix(".md").write_text(markdown(rows, meta))

    print(
        f"# compile_regions: shapes {[shape_label(s) for s in shapes]}, strategies {requested}, "
        f"device {args.device}, out {out}",
        flush=True,
    )
    for shape in shapes:
        label = shape_label(shape)
        done: dict[str, str] = {}
        for text in requested:
            spec = parse_spec(text)
            note = None
            if args.deadline_s and time.perf_counter() - begin > args.deadline_s:
                emit(
                    {
                        "shape": label,
                        "strategy": text,
                        "resolved": None,
                        "phase": "cold",
                        "ok": False,
                        "error": f"skipped: --deadline-s {args.deadline_s:g} passed",
                    }
                )
                continue
            if spec.base == "best":
                resolved, note = resolve_best(spec, rows, label, args.compile_budget_s)
                if resolved is None:
                    emit(
                        {
                            "shape": label,
                            "strategy": text,
                            "resolved": None,
                            "phase": "cold",
                            "ok": False,
                            "error": f"skipped: {note}",
                        }
                    )
                    continue
                spec = resolved
                print(f"# {text} -> {spec.name} ({note})", flush=True)
            if spec.name in done:
                emit(
                    {
                        "shape": label,
                        "strategy": text,
                        "resolved": spec.name,
                        "phase": "cold",
                        "ok": False,
                        "error": f"skipped: same as {done[spec.name]}, measured above",
                    }
                )
                continue
            done[spec.name] = text
            timeout = args.timeout_whole if spec.base == "whole" else args.timeout_per_strategy
            cache_dir = Path(tempfile.mkdtemp(prefix="compile-regions-", dir=cache_root))
            try:
                cold = run_phase(args, shape, text, spec, "cold", cache_dir, timeout, log_dir)
                cold["best_note"] = note
                emit(cold)
                if not args.no_warm and cold.get("ok"):
                    warm = run_phase(args, shape, text, spec, "warm", cache_dir, timeout, log_dir)
                    warm["best_note"] = note
                    emit(warm)
            finally:
                if not args.keep_caches:
                    shutil.rmtree(cache_dir, ignore_errors=True)
    total = time.perf_counter() - begin
    meta["total_s"] = round(total, 1)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, default=str))
    out.with_suffix(".md").write_text(markdown(rows, meta))
    print(f"# done in {total:.0f} s: {out}, {out.with_suffix('.md')}, {jsonl}", flush=True)
    print(markdown(rows, meta), flush=True)
    return 0


# --------------------------------------------------------------------------- self-check (CPU)


def run_self_check(args: argparse.Namespace) -> int:
    """On CPU: each re-expressed forward equals axosim's (uncompiled: exactly; compiled:
    to float32 rounding), gradients too, and 5 compiled Adam updates match 5 eager ones."""
    cache = tempfile.mkdtemp(prefix="compile-regions-selfcheck-")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(cache, "inductor"))
    import torch

    raise_recompile_limit()
    axoexp = import_axoexp()
    device = torch.device("cpu")
    shapes = [parse_shape(s) for s in (args.shapes or SELF_CHECK_SHAPES)]
    texts = [s for s in (args.strategies or SELF_CHECK_STRATEGIES) if s not in set(args.skip)]
    loss_fn = axoexp["causal_mse"]()
    failures = []
    begin = time.perf_counter()
    print(f"# self-check on CPU, torch {torch.__version__}: shapes {[shape_label(s) for s in shapes]}", flush=True)
    print(
        f"{'shape':>8} {'strategy':<28} {'uncompiled dout/dgrad':>22} {'compiled dout/dgrad':>20} "
        f"{'5-update dparam':>15} {'compile s':>9}  result",
        flush=True,
    )
    for shape in shapes:
        neurons, steps, contacts = shape
        setup = axoexp["lite"](
            device=device, dtype=torch.float32, seed=0, neurons=neurons, time_steps=steps, contacts=contacts
        )
        pristine = copy.deepcopy(setup.module)
        inputs, targets = setup.batches[0]

        def forward_backward(model: Any, module: Any) -> tuple[Any, list[Any], Any]:
            output = model(inputs)
            loss_fn(output, targets).backward()
            grads = [p.grad.detach().clone() for p in module.trainable_adaptation_parameters()]
            soma = module.neuron.base_soma_prediction.detach().clone()
            return output.detach(), grads, soma

        reference = copy.deepcopy(pristine)
        ref_out, ref_grads, ref_soma = forward_backward(reference, reference)
        eager = copy.deepcopy(pristine)
        eager_optimizer = make_optimizer(eager, "cpu")
        for index in range(PARITY_UPDATES):
            axoexp["eager_update"](eager, eager_optimizer, loss_fn, None, *setup.batches[index % len(setup.batches)])
        ref_params = trainable(eager)

        def diffs(out: Any, grads: list[Any], soma: Any) -> tuple[float, float]:
            return (
                max(float((out - ref_out).abs().max()), float((soma - ref_soma).abs().max())),
                max_abs_diff(ref_grads, grads),
            )

        for text in texts:
            spec = parse_spec(text)
            label = shape_label(shape)
            torch._dynamo.reset()
            try:
                module = copy.deepcopy(pristine)
                plain = diffs(*forward_backward(apply_strategy(module, spec, compiled=False), module))
                torch._dynamo.reset()
                module = copy.deepcopy(pristine)
                model = apply_strategy(module, spec, compiled=True)
                before = dynamo_counters()
                start = time.perf_counter()
                compiled = diffs(*forward_backward(model, module))
                compile_s = time.perf_counter() - start
                # 5 Adam updates of the compiled model from the pristine state
                module.load_state_dict(pristine.state_dict())
                optimizer = make_optimizer(module, "cpu")
                optimizer.zero_grad(set_to_none=False)
                for index in range(PARITY_UPDATES):
                    axoexp["eager_update"](model, optimizer, loss_fn, None, *setup.batches[index % len(setup.batches)])
                dparam = max_abs_diff(ref_params, trainable(module))
                counters = dynamo_counters()
                graphs = counters.get("unique_graphs", 0) - before.get("unique_graphs", 0)
                decomposed = {
                    k: v - before.get("decompose_mm", {}).get(k, 0) for k, v in counters.get("decompose_mm", {}).items()
                }
                ok = (
                    plain[0] <= 1e-6
                    and plain[1] <= 1e-6
                    and compiled[0] <= 1e-5
                    and compiled[1] <= 1e-5
                    and dparam <= 1e-6
                )
                extra = f" decomposed {decomposed}" if "mmdecomp" in spec.presets else ""
                print(
                    f"{label:>8} {text:<28} {plain[0]:10.1e}/{plain[1]:9.1e}  {compiled[0]:9.1e}/{compiled[1]:9.1e}"
                    f" {dparam:15.1e} {compile_s:9.1f}  {'ok' if ok else 'FAIL'}"
                    f" (graphs {graphs}){extra}",
                    flush=True,
                )
                if not ok:
                    failures.append(f"{label} {text}: tolerance")
            except Exception as error:
                print(f"{label:>8} {text:<28} FAIL {type(error).__name__}: {str(error)[:300]}", flush=True)
                traceback.print_exc(limit=3)
                failures.append(f"{label} {text}: {type(error).__name__}")
    shutil.rmtree(cache, ignore_errors=True)
    total = time.perf_counter() - begin
    print(f"# self-check {'passed' if not failures else 'FAILED: ' + '; '.join(failures)} in {total:.0f} s", flush=True)
    return 1 if failures else 0


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--shapes",
        nargs="+",
        help=f"NxTxC (default {' '.join(DEFAULT_SHAPES)}; self-check: {' '.join(SELF_CHECK_SHAPES)})",
    )
    parser.add_argument(
        "--strategies", nargs="+", help=f"default: {' '.join(DEFAULT_STRATEGIES)}; presets for @: {', '.join(PRESETS)}"
    )
    parser.add_argument("--skip", nargs="+", default=[], help="strategies to leave out of the list, e.g. whole")
    parser.add_argument(
        "--out",
        help="JSON path (default benchmarks/results/compile-regions_HARDWARE_DATE_ENTITY.json); also writes .jsonl, .md and -logs/",
    )
    parser.add_argument("--device", default="cuda", help="cuda, or cpu to test the pipeline without CUDA graphs")
    parser.add_argument(
        "--timeout-per-strategy", type=float, default=150.0, help="seconds per subprocess (cold and warm each)"
    )
    parser.add_argument("--timeout-whole", type=float, default=420.0, help="seconds per subprocess for whole")
    parser.add_argument(
        "--deadline-s", type=float, default=0.0, help="start no new strategy after this many seconds (0: no deadline)"
    )
    parser.add_argument(
        "--compile-budget-s",
        type=float,
        default=GOAL["compile_s"],
        help="best... picks among regions whose cold compile took at most this",
    )
    parser.add_argument("--warmup", type=int, default=20, help="untimed updates per variant before timing")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--updates", type=int, default=50, help="timed updates per variant per round")
    parser.add_argument("--warm-updates", type=int, default=25, help="--updates for the warm-cache subprocess")
    parser.add_argument("--pipelined", type=int, default=50, help="back-to-back updates for the CUDA-event time")
    parser.add_argument("--profile", type=int, default=5, help="updates profiled per variant, cold only (0: off)")
    parser.add_argument("--no-warm", action="store_true", help="skip the warm-cache subprocess")
    parser.add_argument("--keep-caches", action="store_true")
    parser.add_argument("--cache-root", help="where the per-strategy cache dirs go (default: system temp)")
    parser.add_argument("--verbose", action="store_true", help="echo all subprocess output, not only progress")
    parser.add_argument("--self-check", action="store_true", help="CPU equality and compile checks, no CUDA")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", help=argparse.SUPPRESS)
    parser.add_argument("--requested", help=argparse.SUPPRESS)
    parser.add_argument("--phase", default="cold", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return run_worker(args)
    if args.self_check:
        return run_self_check(args)
    return run_driver(args)


if __name__ == "__main__":
    sys.exit(main())
