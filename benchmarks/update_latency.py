"""Update latency per shape and streams: eager, bare axosim helper, axoexp executors; JSON + markdown out.

    python benchmarks/update_latency.py --shapes 3x12x4 64x256x32 --out benchmarks/results \
        --label update-latency_h200_DATE_all
    python benchmarks/update_latency.py --shapes 64x256x32 --batch-sizes 1 8 64 \
        --label update-latency_h200_DATE_batch

For each shape (neurons x time_steps x contacts) and each ``--batch-sizes`` B (independent
streams per update, ``population.batch_size``) every variant adapts its own copy of one
population on the same batches. With B > 1 the bare helper captures the same batched update:
``CudaGraphAdaptationStep.capture`` of a module whose forward is the population's
``forward_batch``, with axoexp's loss (the mean over streams of each stream's loss).
Steady-state latency is the host clock around each update
and a device synchronise (as in ``python -m axoexp``), over ``--rounds`` interleaved rounds
of ``--updates`` updates (in rotating order) after ``--warmup`` untimed ones. The device
clock is the median of CUDA-event time around the same updates (as ``update_device_ms`` in
``python -m axoexp``: from the update's first to its last GPU work on the stream, gaps
included), and host overhead the median of host minus device time per update. GPU busy time
per update is the sum of all GPU activity (kernels, copies, memsets) that torch.profiler
records over 20 updates. ``kernels_per_update`` counts the GPU activities of one update (kernels,
memory copies and memsets, each launch once; for a captured executor: the input copies, the graph
replay's every node and the loss clone), from torch.profiler around one update after the timing;
the JSON keeps them by kind and by name. Parity is max |parameter difference| to eager after 5 updates from
one state, taken from each axoexp executor right after its preparation, so the compiled
executors compile once per shape. ``--variants`` measures a subset.

Variable lengths (docs/lengths.md): ``--lengths uniform:32:256`` draws each of
``--length-batches`` batches' length from that spec (the shape's time_steps is then ignored),
the captured executors keep one graph per length bucket (``cudagraph@buckets=256`` pads every
batch to 256) and the bare helper keeps one graph per distinct length, each batch run at its
exact length. ``--fixed-variants`` also measures those variants at the shape's own fixed
time_steps, in the same process (give the workload's mean length: 64x144x32).

    python benchmarks/update_latency.py --shapes 64x144x32 --lengths uniform:32:256 \
        --variants bare_helper eager cudagraph regional_cudagraph fused_cudagraph cudagraph@buckets=256 \
        regional_cudagraph@buckets=256 fused_cudagraph@buckets=256 --fixed-variants fused_cudagraph \
        --label update-latency_h200_DATE_lengths
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from axosim import CudaGraphAdaptationStep
from hydra import compose, initialize_config_module
from torch.profiler import ProfilerActivity, profile

from axoexp import metadata, names
from axoexp.config import register_configs
from axoexp.experiment import streams_per_s
from axoexp.interfaces import STREAM_AXIS_RANK
from axoexp.lengths import by_bucket, padding_overhead
from axoexp.measure import run_updates
from axoexp.names import shape_label
from axoexp.plan import Plan, plan_experiment
from axoexp.plugins import load_plugins
from axoexp.statistics import LatencySummary
from axoexp.timing import activity_kinds, gpu_activities, stopwatch, synchronizer
from axoexp.verification import verify_parity
from axoexp.windows import UpdateTrace

BARE = "bare_helper"
CHECKED = (
    "cudagraph",
    "compiled_cudagraph",
    "reduce_overhead",
    "regional_cudagraph",
    "fused_cudagraph",
)  # parity to eager is measured
VARIANTS = (BARE, "eager", *CHECKED)
OPTION_SEPARATOR = (
    "@"  # a variant NAME@key=value,key=value sets executor options, e.g. regional_cudagraph@tokens_per_region=4
)
PROFILED_UPDATES = 20
PARITY_UPDATES = 5


@dataclass
class Row:
    shape: str
    variant: str
    streams: int
    median_ms: float
    p10_ms: float
    p90_ms: float
    device_ms: float  # GPU busy: profiler-summed activity per update
    device_clock_ms: float  # median CUDA-event time around each timed update
    host_overhead_ms: float  # median of host minus device-clock time per timed update
    prepare_ms: dict[str, float]
    speedup_vs_eager: float | None = None
    ratio_vs_bare: float | None = None
    parity_max_abs_param_diff: float | None = None
    tags: dict[str, str] = field(default_factory=dict)  # what prepare learned, e.g. compile.cache
    lengths: str = "fixed"  # the population.lengths spec, or fixed (the shape's time_steps)
    mean_ms: float | None = None
    padding_overhead: float | None = None  # padded steps / real steps over the timed updates
    bucket_median_ms: dict[int, float] = field(default_factory=dict)  # by length bucket (eager, bare: exact length)
    kernels_per_update: int | None = None  # GPU activities of one update: kernels, memcpys, memsets
    activities_per_update: dict[str, int] = field(default_factory=dict)  # the same by kind
    activity_names: dict[str, int] = field(default_factory=dict)  # the same by kernel (or copy) name

    @property
    def streams_per_s(self) -> float:
        """Streams x updates per second, at the median update latency."""
        return streams_per_s(self.streams, self.median_ms)


class BatchedForward(torch.nn.Module):
    """The population with ``forward_batch`` as its forward, for the bare helper (which calls ``module(inputs)``)."""

    def __init__(self, population: torch.nn.Module) -> None:
        super().__init__()
        self.population = population

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.population.forward_batch(inputs)


def make_plan(variant: str, shape: tuple[int, int, int], streams: int, overrides: list[str]) -> Plan:
    """The plan of one variant; executor options after ``@`` (a comma-free value each)."""
    neurons, time_steps, contacts = shape
    executor, _, options = variant.partition(OPTION_SEPARATOR)
    executor_options = [f"executor.{option}" for option in options.split(",") if option]
    with initialize_config_module(config_module="axoexp.conf", version_base="1.3"):
        config = compose(
            "config",
            overrides=[
                "device=cuda",
                f"executor={executor}",
                *executor_options,
                f"population.neurons={neurons}",
                f"population.time_steps={time_steps}",
                f"population.contacts={contacts}",
                f"population.batch_size={streams}",
                *overrides,
            ],
        )
    return plan_experiment(config)


def prepare_bare_helper(plan: Plan, module: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]):
    """``axosim.CudaGraphAdaptationStep`` as its README shows it, with no axoexp executor around it;
    for batched streams around ``forward_batch`` and axoexp's loss of B streams (``batch_loss``).
    Batches of different lengths: one helper captured per distinct length (its README's advice:
    recapture after changing shapes), each batch replayed at its exact length."""
    template = plan.build_executor(module)  # the same optimizer, loss and transform as cudagraph
    batched = batches[0][0].dim() == STREAM_AXIS_RANK
    phases: dict[str, float] = {}
    helpers = {}
    with stopwatch(synchronizer(plan.device), phases, "capture"):
        for batch in batches:
            if batch[0].shape[-2] in helpers:
                continue
            helpers[batch[0].shape[-2]] = CudaGraphAdaptationStep.capture(
                BatchedForward(module) if batched else module,
                template.optimizer,
                *batch,
                (lambda prediction, targets: torch.vmap(template.loss_fn)(prediction, targets).mean())
                if batched
                else template.loss_fn,
                gradient_transform=template.gradient_transform,
            )
    bare = SimpleNamespace(
        step=lambda inputs, targets: helpers[inputs.shape[-2]](inputs, targets),
        buckets=lambda: None,  # as run_updates asks an executor: each batch replayed at its exact length
    )
    return bare, phases


def device_ms_per_update(variant: Any, setup: Any) -> float:
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        run_updates(variant, setup.batches, PROFILED_UPDATES, 0, UpdateTrace())
    total_us = sum(event.self_device_time_total for event in profiler.key_averages())
    return total_us / 1e3 / PROFILED_UPDATES


def bench_shape(shape: tuple[int, int, int], streams: int, args: argparse.Namespace) -> list[Row]:
    chosen = list(dict.fromkeys(args.variants))
    overrides = [*args.override]
    if args.lengths:
        overrides += [f"population.lengths={args.lengths}", f"population.batches={args.length_batches}"]
    plans = {
        name: make_plan("cudagraph" if name == BARE else name, shape, streams, overrides) for name in {"eager", *chosen}
    }
    setup = plans["eager"].build_population()
    pristine = copy.deepcopy(setup.module)
    variants: dict[str, Any] = {}
    prepared: dict[str, dict[str, float]] = {}
    parity: dict[str, float] = {}
    for name in chosen:
        module = copy.deepcopy(pristine)
        if name == BARE:
            variants[name], prepared[name] = prepare_bare_helper(plans[name], module, setup.batches)
        else:
            variants[name] = plans[name].build_executor(module)
            prepared[name] = variants[name].prepare_all(setup.batches)
        if name.partition(OPTION_SEPARATOR)[0] in CHECKED:  # from the prepared executor: compiled once
            check = verify_parity(
                plans[name].build_executor,
                name,
                pristine,
                setup.batches,
                PARITY_UPDATES,
                1e-6,
                1e-6,
                prepared=variants[name],
            )
            parity[name] = check.max_abs_param_diff
        run_updates(variants[name], setup.batches, args.warmup, 0, UpdateTrace())
    samples: dict[str, list[float]] = {name: [] for name in chosen}
    device_samples: dict[str, list[float]] = {name: [] for name in chosen}
    order = list(chosen)
    for _ in range(args.rounds):  # the order rotates each round, so drift hits every variant alike
        order = order[1:] + order[:1]
        for name in order:
            trace = UpdateTrace()
            run_updates(variants[name], setup.batches, args.updates, 0, trace)
            samples[name] += trace.latencies_ms
            device_samples[name] += trace.device_ms
    label = shape_label(*shape)
    lengths = [int(setup.batches[index % len(setup.batches)][0].shape[-2]) for index in range(args.updates)]
    lengths *= args.rounds  # each round's updates start at the first batch
    rows = {}
    for name in chosen:
        activities = gpu_activities(lambda variant=variants[name]: variant.step(*setup.batches[0]), plans[name].device)
        summary = LatencySummary.of(samples[name])
        buckets = variants[name].buckets() or tuple(sorted(set(lengths)))
        overhead = np.subtract(samples[name], device_samples[name])
        rows[name] = Row(
            label,
            name,
            streams,
            summary.median,
            summary.p10,
            summary.p90,
            device_ms_per_update(variants[name], setup),
            float(np.median(device_samples[name])),
            float(np.median(overhead)),
            prepared[name],
            parity_max_abs_param_diff=parity.get(name),
            tags=dict(getattr(variants[name], "prepared_tags", {})),
            lengths=args.lengths or "fixed",
            mean_ms=summary.mean,
            padding_overhead=padding_overhead(lengths, buckets),
            bucket_median_ms={
                bucket: float(np.median(values))
                for bucket, values in by_bucket(samples[name], lengths, buckets).items()
            },
            kernels_per_update=activities.total(),
            activities_per_update=activity_kinds(activities),
            activity_names=dict(activities.most_common()),
        )
    for row in rows.values():
        if "eager" in rows:
            row.speedup_vs_eager = rows["eager"].median_ms / row.median_ms
        if BARE in rows:
            row.ratio_vs_bare = row.median_ms / rows[BARE].median_ms
    return list(rows.values())


def _cell(value: float | None, spec: str) -> str:
    """A table cell: blank where the variant has no such number."""
    return "" if value is None else format(value, spec)


def markdown(rows: list[Row], environment: dict[str, str], args: argparse.Namespace) -> str:
    lines = [
        f"# Update latency — {environment.get(names.GPU_NAME, environment[names.DEVICE])}, {date.today()}",
        "",
        f"torch {environment[names.version_tag('torch')]}, CUDA {environment[names.version_tag('cuda_runtime')]}, "
        f"driver {environment.get(names.GPU_DRIVER, '?')}, axosim {environment[names.version_tag('axosim')]}, "
        f"axoexp {environment[names.GIT_COMMIT][:12]} (dirty: {environment[names.GIT_DIRTY]}). "
        f"{args.rounds} rounds (rotating order) x {args.updates} updates per variant after {args.warmup} warm-up; "
        f"overrides: {' '.join(args.override) or 'none'}.",
        "",
        metadata.provenance_line(environment),
        "",
        "| shape (n x t x c) | lengths | B | variant | mean ms | pad overhead | median ms | streams x updates/s "
        "| p10 | p90 | device clock ms "
        "| host overhead ms "
        "| GPU busy ms | kernels per update | compiler start-up ms | compile ms | capture ms | vs eager | / bare "
        "| parity max abs dparam | compile cache |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        speedup = _cell(row.speedup_vs_eager, ".2f") + ("x" if row.speedup_vs_eager else "")
        lines.append(
            f"| {row.shape} | {row.lengths} | {row.streams} | {row.variant} | {_cell(row.mean_ms, '.3f')} "
            f"| {_cell(row.padding_overhead, '.3f')} | {row.median_ms:.3f} | {row.streams_per_s:,.0f} "
            f"| {row.p10_ms:.3f} | {row.p90_ms:.3f} "
            f"| {row.device_clock_ms:.3f} | {row.host_overhead_ms:.3f} "
            f"| {row.device_ms:.3f} | {_cell(row.kernels_per_update, 'd')} "
            f"| {_cell(row.prepare_ms.get('compiler_startup'), '.0f')} "
            f"| {_cell(row.prepare_ms.get('compile'), '.0f')} "
            f"| {_cell(row.prepare_ms.get('capture'), '.1f')} | {speedup} "
            f"| {_cell(row.ratio_vs_bare, '.3f')} | {_cell(row.parity_max_abs_param_diff, '.1e')} "
            f"| {row.tags.get(names.COMPILE_CACHE, '')} |"
        )
    return "\n".join(lines) + "\n"


def print_length_targets(rows: list[Row]) -> None:
    """Issue 27's targets: each bucketed variant's mean update against the same variant at the fixed
    mean length (<= 1.08x) and against the bare helper over the same lengths (>= 15x faster)."""
    by_key = {(row.shape, row.streams, row.lengths, row.variant): row for row in rows}
    for row in rows:
        if row.lengths == "fixed" or row.mean_ms is None:
            continue
        fixed = by_key.get((row.shape, row.streams, "fixed", row.variant))
        bare = by_key.get((row.shape, row.streams, row.lengths, BARE))
        if fixed and fixed.mean_ms:
            print(f"{row.variant} bucketed / fixed at {row.shape}: {row.mean_ms / fixed.mean_ms:.3f} (target <= 1.08)")
        if bare and bare.mean_ms and row.variant != BARE:
            print(
                f"{row.variant} speedup over bare helper ({row.lengths}): "
                f"{bare.mean_ms / row.mean_ms:.1f}x (target >= 15)"
            )
        print(
            f"{row.variant} per-bucket median ms: {row.bucket_median_ms}, padding overhead {row.padding_overhead:.3f}"
        )


def _variant(text: str) -> str:
    if text.partition(OPTION_SEPARATOR)[0] not in VARIANTS:
        raise argparse.ArgumentTypeError(f"unknown variant {text!r}; choose from {', '.join(VARIANTS)}")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["3x12x4", "64x256x32", "1024x64x32"])
    parser.add_argument(
        "--variants",
        nargs="+",
        default=list(VARIANTS),
        type=_variant,
        help=f"any of {', '.join(VARIANTS)}, optionally NAME{OPTION_SEPARATOR}key=value,... "
        "for executor options; eager is always built (it makes the population); "
        "ratios need their baseline",
    )
    parser.add_argument(
        "--batch-sizes", nargs="+", type=int, default=[1], help="streams per update (population.batch_size)"
    )
    parser.add_argument("--updates", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--override", nargs="*", default=[], help="extra Hydra overrides, e.g. optimizer=sgd")
    parser.add_argument("--lengths", help="population.lengths for every shape, e.g. uniform:32:256")
    parser.add_argument("--length-batches", type=int, default=32, help="distinct batches (lengths) with --lengths")
    parser.add_argument(
        "--fixed-variants", nargs="*", default=[], type=_variant, help="with --lengths: also at the fixed shape"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--label", default=f"update-latency_gpu_{date.today()}_all")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("this benchmark needs a CUDA GPU")
    registry = load_plugins()
    register_configs(registry)
    # any registered component may be measured: the code recorded is every one's
    environment = {**metadata.collect(torch.device("cuda"), registry.components()), **metadata.provenance("cuda")}
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    for text, streams in itertools.product(args.shapes, args.batch_sizes):  # files rewritten after each: a
        shape = tuple(map(int, text.split("x")))
        rows += bench_shape(shape, streams, args)  # time-out keeps the rest
        if args.lengths and args.fixed_variants:
            fixed = argparse.Namespace(**{**vars(args), "lengths": None, "variants": args.fixed_variants})
            rows += bench_shape(shape, streams, fixed)
        report = {
            "environment": environment,  # provenance included: commit, dirty flag, command, device, date
            "settings": {k: v for k, v in vars(args).items() if k != "out"} | {"profiled_updates": PROFILED_UPDATES},
            "rows": [asdict(row) | {"streams_per_s": row.streams_per_s} for row in rows],
        }
        (args.out / f"{args.label}.json").write_text(json.dumps(report, indent=2, default=str))
        table = markdown(rows, environment, args)
        (args.out / f"{args.label}.md").write_text(table)
        print(table, flush=True)
    ratios = [row.ratio_vs_bare for row in rows if row.variant == "cudagraph" and row.ratio_vs_bare]
    if ratios:
        print(f"cudagraph executor / bare helper, worst shape: {max(ratios):.3f} (target <= 1.05)")
    if args.lengths:
        print_length_targets(rows)
    for row in rows:
        if row.variant.startswith("fused_cudagraph") and row.kernels_per_update is not None:
            print(
                f"{row.variant} kernels_per_update at {row.shape} B={row.streams}: {row.kernels_per_update} "
                f"{row.activities_per_update} (target <= 8)"
            )
        if row.variant != "cudagraph" and row.variant.partition(OPTION_SEPARATOR)[0] in CHECKED and row.ratio_vs_bare:
            print(
                f"{row.variant} speedup over bare helper at {row.shape} B={row.streams}: {1 / row.ratio_vs_bare:.2f}x"
            )


if __name__ == "__main__":
    main()
