"""Where a compiled executor's compile time goes, cold and warm, one fresh process each.

    python benchmarks/explore/compile_breakdown.py --shape 64x256x32 --out breakdown.jsonl \
        '{"k": 8}' '{"k": 8, "prewarm": ["device"]}' '{"k": 16, "profile": true}'

Each SPEC (JSON) runs twice in a new process, first with a new, empty inductor cache
directory (cold), then with the same one (warm; ``--cold-only`` leaves it out). As a run
does, the process begins the executor's one-off set-up (the compiler's start-up) as soon as
the run is planned. A SPEC may set ``executor`` (default ``regional_cudagraph``); ``k``
(``tokens_per_region``) and ``edges`` (``compile_edges``), both at the executor's defaults
when absent; ``overrides`` (more Hydra overrides, e.g.
``["executor.decompose_matmuls=false"]``); ``options`` (inductor config keys, dotted);
``functorch_options`` (AOTAutograd's config keys); ``workers``
(``TORCHINDUCTOR_WORKER_START``: ``subprocess`` is inductor's own pool, which axoexp used
before 2026-12-03); ``prewarm`` (``"device"``: one eager forward and backward for cuBLAS
before ``prepare``; ``"passes"``: the start-up, then only the one-off set-up of the compile
that depends on no shape and draws no random numbers, :func:`warm_compiler_passes`;
``"compiler"``: the start-up, then a throwaway compile of a one-block region for a small
stand-in neuron, with the caches off, :func:`warm_region_compiler`; each timed apart);
``startup_warm`` (true: that throwaway compile in a thread begun with the start-up, where a
run would do it, overlapping the population's build; ``"passes"``: the same with
:func:`warm_compiler_passes` instead; the rest of it is waited for before ``prepare`` and
timed. With true, the stand-in's initialisation and dynamo's saving and restoring of the
global RNG state run beside the build, so the population's weights may differ from a run's:
a run adopting it must keep the two apart); ``artifacts`` (true: the cold process saves
``torch.compiler.save_cache_artifacts()``, and a third process with another new, empty
cache loads them with ``load_cache_artifacts`` before it compiles, timed apart);
``gc`` (``"freeze"``: ``gc.collect()`` then ``gc.freeze()`` just before ``prepare``, so the
collector no longer walks the objects of the imports and the population during the compile;
``"off"``: ``gc.disable()`` through ``prepare``, the most the collector's pauses can cost it);
``profile`` (cProfile of ``prepare``, the top functions printed).

One JSON line per process: wall times of each stage, ``prepare``'s phases, the compile
workers' start method, ``kernels_compiled`` (inductor's ``async_compile_cache_miss``
counter: the Triton kernels it set up, from source or from the cache) and
``kernels_compiled_in_process`` (how many it compiled in the process itself because the
workers had not answered yet), dynamo's ``calculate_time_spent`` and ``compile_times``
breakdowns, the garbage collector's pauses during ``prepare`` (``gc_s``, ``gc_gen2_s``,
``gc_collections``: summed from ``gc.callbacks``; ``gc_objects``: what it tracked before), the
median of 200 replayed updates, and the provenance (commit, dirty flag, command
line, device, date).

    python benchmarks/explore/compile_breakdown.py --table breakdown.md breakdown.jsonl

writes the rows of JSONL files as a markdown table: each cold (and artifacts) compile, after
what came before ``prepare``, split into dynamo's
tracing, AOTAutograd (joint trace, its passes, the partition, the post-grad passes),
inductor's lowering, its scheduling and code generation, the wait for the Triton kernels,
the first-run timing of kernels with several launch configurations, the rest of dynamo's
total, and what ``compile`` holds outside dynamo's total (the eager code before the block
loop, the first runs).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STARTED = time.perf_counter()


def _warm_tokens(neuron, tokens, state, cache):  # its own code object: no dynamo cache entry on run_tokens
    from axoexp.executors.regional import run_tokens

    forecasts, state = run_tokens(neuron, tokens, state, cache)
    return forecasts.square().mean() + state.square().mean()


def warm_compiler_passes(device) -> None:
    """A process's one-off compile set-up that depends on no shape and draws no random numbers:
    torch's and Triton's source hashes (the cache keys' parts) and the pattern matchers of the
    joint-graph and post-grad passes, which inductor traces at its first compile in a process."""
    import torch
    from torch._inductor.codecache import CacheBase, torch_key
    from torch._inductor.fx_passes import joint_graph, post_grad

    torch_key()
    CacheBase.get_system()
    joint_graph.lazy_init(torch.empty(0, device=device).device)  # cached per device, as inductor passes it
    post_grad.lazy_init()


def warm_region_compiler(device) -> None:
    """A throwaway compile and run of a one-block region, forward and backward, for a small
    stand-in neuron, with inductor's and AOTAutograd's caches off (a later process must find
    its cache as cold as before): a process's one-off compile work (torch's source hash for
    the cache keys, the pattern matchers, the first run of dynamo, AOTAutograd, inductor and
    the Triton workers) then comes before the region's own compile."""
    import torch
    from torch._functorch import config as functorch_config
    from torch._inductor import config
    from torch._inductor.codecache import torch_key

    from axoexp.components.population import make_lite_model
    from axoexp.executors import matmul_decomposition
    from axoexp.executors.compiled import INDUCTOR_OPTIONS

    torch_key()
    matmul_decomposition.widen_thresholds()
    options = {**INDUCTOR_OPTIONS, **matmul_decomposition.OPTIONS}
    neuron = make_lite_model(
        branches=4, route_features=4, token_dim=8, state_dim=4, morphologies=1, generator=torch.Generator()
    ).to(device)
    tokens = torch.zeros(1, 2, neuron.config.token_dim, device=device, requires_grad=True)
    state = torch.zeros(2, neuron.config.state_dim, device=device, requires_grad=True)
    cache = torch.zeros(2, neuron.cache_width, device=device, requires_grad=True)
    with config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
        compiled = torch.compile(_warm_tokens, dynamic=False, fullgraph=True, options=options)
        compiled(neuron, tokens, state, cache).backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    torch._dynamo.utils.compilation_time_metrics.clear()  # the row's stages are the region's own
    torch._dynamo.utils.cumulative_time_spent_ns.clear()
    torch._dynamo.utils.counters.clear()


def worker(shape: str, spec: dict, save_to: Path | None, load_from: Path | None) -> None:
    marks: dict[str, object] = {}

    def mark(name: str, start: float) -> None:
        marks[name] = round(time.perf_counter() - start, 3)

    start = time.perf_counter()
    import torch

    mark("import_torch", start)
    start = time.perf_counter()
    from hydra import compose, initialize_config_module

    from axoexp.config import register_configs
    from axoexp.plan import plan_experiment
    from axoexp.plugins import load_plugins

    register_configs(load_plugins())
    mark("import_axoexp", start)
    import torch._functorch.config  # not imported by torch's own import

    for key, value in spec.get("functorch_options", {}).items():
        setattr(torch._functorch.config, key, value)
    for key, value in spec.get("options", {}).items():
        target = torch._inductor.config
        *path, last = key.split(".")
        for part in path:
            target = getattr(target, part)
        setattr(target, last, value)

    start = time.perf_counter()
    neurons, time_steps, contacts = shape.split("x")
    executor = spec.get("executor", "regional_cudagraph")
    overrides = [
        "device=cuda",
        f"executor={executor}",
        f"population.neurons={neurons}",
        f"population.time_steps={time_steps}",
        f"population.contacts={contacts}",
    ]
    if executor == "regional_cudagraph":
        overrides += [f"executor.tokens_per_region={spec['k']}"] if "k" in spec else []
        overrides += [f"executor.compile_edges={str(spec['edges']).lower()}"] if "edges" in spec else []
    with initialize_config_module(config_module="axoexp.conf", version_base="1.3"):
        plan = plan_experiment(compose("config", overrides=overrides + spec.get("overrides", [])))
    from axoexp.executors import compiler_startup

    def wait_for_start_up() -> None:  # before work that needs inductor's imports; timed as the start-up
        waited: dict[str, float] = {}
        compiler_startup.wait_into(waited, torch.device("cuda"))
        marks["startup_wait_s"] = round(waited[compiler_startup.PHASE] / 1e3, 3)

    plan.begin_executor_setup()
    warming, failures = None, []
    if spec.get("startup_warm"):  # where a run would do it: after the start-up, during the set-up
        import threading

        warm = warm_compiler_passes if spec["startup_warm"] == "passes" else warm_region_compiler

        def warm_after_start_up() -> None:
            try:
                compiler_startup.wait_into({}, torch.device("cuda"))
                warm(torch.device("cuda"))
            except BaseException as error:  # raised again in the main thread, failing the row
                failures.append(error)

        warming = threading.Thread(target=warm_after_start_up, daemon=True)
        warming.start()
    setup = plan.build_population()
    torch.cuda.synchronize()
    mark("population", start)
    if "device" in spec.get("prewarm", []):
        import copy

        start = time.perf_counter()
        scratch = copy.deepcopy(setup.module)
        plan.build_executor(scratch).loss_fn(scratch(setup.batches[0][0]), setup.batches[0][1]).backward()
        torch.cuda.synchronize()
        mark("prewarm_device", start)
    if warming is not None:
        start = time.perf_counter()
        warming.join()
        mark("startup_warm_wait", start)
        if failures:
            raise failures[0]
    if "passes" in spec.get("prewarm", []):
        wait_for_start_up()
        start = time.perf_counter()
        warm_compiler_passes(torch.device("cuda"))
        mark("prewarm_passes", start)
    if "compiler" in spec.get("prewarm", []):
        wait_for_start_up()
        start = time.perf_counter()
        warm_region_compiler(torch.device("cuda"))
        mark("prewarm_compiler", start)
    if load_from is not None:
        wait_for_start_up()
        start = time.perf_counter()
        if torch.compiler.load_cache_artifacts(load_from.read_bytes()) is None:
            raise RuntimeError(f"{load_from}: load_cache_artifacts loaded nothing")
        mark("load_artifacts", start)
    start = time.perf_counter()
    prepared = plan.build_executor(setup.module)
    mark("executor_init", start)

    pauses: list[tuple[int, float]] = []  # (generation, seconds) of each collection during prepare
    began = [0.0]

    def time_collection(phase: str, info: dict) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            pauses.append((info["generation"], time.perf_counter() - began[0]))

    if spec.get("gc") == "freeze":
        gc.collect()
        gc.freeze()
    marks["gc_objects"] = len(gc.get_objects())
    if spec.get("gc") == "off":
        gc.disable()
    gc.callbacks.append(time_collection)
    profiler = None
    if spec.get("profile"):
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    start = time.perf_counter()
    phases = prepared.prepare(*setup.batches[0])
    mark("prepare", start)
    gc.callbacks.remove(time_collection)
    gc.enable()
    marks.update(
        gc_s=round(sum(seconds for _, seconds in pauses), 3),
        gc_gen2_s=round(sum(seconds for generation, seconds in pauses if generation == 2), 3),
        gc_collections=len(pauses),
    )
    if profiler is not None:
        profiler.disable()
    if save_to is not None:
        saved = torch.compiler.save_cache_artifacts()  # None where nothing was recorded
        if saved is not None:
            save_to.write_bytes(saved[0])
        marks["artifacts_saved"] = None if saved is None else str(saved[1])
    marks.update(
        worker_start_method=torch._inductor.config.worker_start_method,
        kernels_compiled_in_process=len(
            torch._dynamo.utils.compilation_time_metrics.get("async_compile.precompile", [])
        ),
        kernels_compiled=torch._dynamo.utils.counters["inductor"]["async_compile_cache_miss"],
        kernels_autotuned=len(
            torch._dynamo.utils.compilation_time_metrics.get("CachingAutotuner.benchmark_all_configs", [])
        ),
    )
    marks.update(
        phases_ms={key: round(value, 1) for key, value in phases.items()},
        tags=prepared.prepared_tags,
        time_spent={k: round(v, 3) for k, v in torch._dynamo.utils.calculate_time_spent().items()},
        compile_times=torch._dynamo.utils.compile_times(repr="str", aggregate=True),
        compile_threads=torch._inductor.config.compile_threads,
    )
    samples = []
    for index in range(230):
        batch = setup.batches[index % len(setup.batches)]
        torch.cuda.synchronize()
        begin = time.perf_counter()
        prepared.step(*batch)
        torch.cuda.synchronize()
        if index >= 30:
            samples.append((time.perf_counter() - begin) * 1e3)
    marks.update(
        replay_median_ms=round(sorted(samples)[len(samples) // 2], 4), process_s=round(time.perf_counter() - STARTED, 2)
    )
    print("ROW " + json.dumps({"shape": shape, "spec": spec, **marks}), flush=True)
    if profiler is not None:
        import pstats

        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(60)
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(25)


COMPILE_TIMES_COLUMNS = {  # column: entries of dynamo's compile_times, seconds summed
    "dynamo trace": ("bytecode_tracing",),
    "AOTAutograd": (
        "aot_trace_joint_graph",
        "_recursive_joint_graph_passes",
        "min_cut_rematerialization_partition",
        "_recursive_post_grad_passes",
    ),
    "lowering": ("GraphLowering.run",),
    "scheduling + codegen": ("GraphLowering.codegen",),
    "Triton wait": ("async_compile.wait",),
}
AUTOTUNE = "CachingAutotuner.benchmark_all_configs"  # at the kernels' first run, after the compile
BEFORE_PREPARE = ("startup_warm_wait", "prewarm_passes", "prewarm_compiler", "load_artifacts")  # a row's marks, seconds


def compile_times_entries(text: str) -> dict[str, float]:
    """Dynamo's ``compile_times(repr="str", aggregate=True)`` table as {entry: seconds}."""
    entries = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        try:
            entries[name.strip()] = float(value)
        except ValueError:
            continue
    return entries


def table(paths: list[Path]) -> str:
    """The cold rows of ``paths`` as a markdown table of seconds per stage (see the docstring)."""
    from axoexp import metadata, names

    rows = [json.loads(line) for path in paths for line in path.read_text().splitlines() if line.strip()]
    rows = [row for row in rows if row.get("phase") in ("cold", "artifacts") and "error" not in row]
    provenance = list({metadata.provenance_line(row["provenance"]): None for row in rows if "provenance" in row})
    columns = [
        "set-up",
        "before prepare",
        "start-up",
        "compile",
        *COMPILE_TIMES_COLUMNS,
        "rest of the compile",
        "autotune timing",
        "first run",
        "of which GC",
    ]
    lines = [
        "# Cold compile, stage by stage",
        "",
        *(f"{line}  " for line in provenance),
        "",
        "Seconds. `cold`: a new, empty cache; `artifacts`: another, loaded with the cold process's cache artifacts",
        "first. `set-up`: planning and the population's build (a run's set-up is longer); `before prepare`: the",
        "throwaway compile or the passes' one-off set-up, or what is left of either in the start-up's thread, or",
        "the artifacts' load, where the spec has one; `start-up`: the wait for the compiler's start-up (before any",
        "of those, or in `prepare`);",
        "`compile`: the `compile` phase, split by the columns after",
        "it: the compile's stages (forward and backward graphs together; `rest of the compile`: the rest of dynamo's",
        "frame and backward compile), the first-run timing of kernels with several launch configurations, and the",
        "rest of the first forward and backward (the eager code before the block loop, the loss, first launches);",
        "`of which GC`: the garbage collector's pauses during `prepare`, wherever they fell.",
        "",
        f"| commit | spec | process | {' | '.join(columns)} | kernels compiled / autotuned | replay ms |",
        "|---|---|---|" + "---:|" * (len(columns) + 2),
    ]
    for row in rows:
        entries = compile_times_entries(row["compile_times"])
        stages = {name: sum(entries.get(key, 0.0) for key in keys) for name, keys in COMPILE_TIMES_COLUMNS.items()}
        total = row["time_spent"]["total_wall_time"]  # dynamo's frame compiles and backward compiles
        compile_s = row["phases_ms"]["compile"] / 1e3
        autotune = entries.get(AUTOTUNE, 0.0)
        values = [
            row["population"],
            sum(row.get(key, 0.0) for key in BEFORE_PREPARE),
            row.get("startup_wait_s", 0.0) + row["phases_ms"].get("compiler_startup", 0.0) / 1e3,
            compile_s,
            *stages.values(),
            total - sum(stages.values()),
            autotune,
            compile_s - total - autotune,
            row.get("gc_s", float("nan")),
        ]
        kernels = f"{row.get('kernels_compiled', '')} / {row.get('kernels_autotuned', '')}"
        cells = " | ".join(f"{value:.2f}" for value in values)
        commit = row.get("provenance", {}).get(names.GIT_COMMIT, "")[:7]
        lines.append(
            f"| {commit} | `{json.dumps(row['spec'])}` | {row['phase']} | {cells} | {kernels} "
            f"| {row['replay_median_ms']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def _run_worker(
    shape: str, spec: dict, extra: list[str], cache_dir: str, workers: dict[str, str], timeout: float
) -> tuple[dict, str]:
    """One worker process on ``cache_dir``: its row, or a row with the error (its stderr's end, or the
    timeout); and its stderr (where ``profile`` prints)."""
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--worker", "--shape", shape, *extra, json.dumps(spec)],
            env={
                **os.environ,
                "TORCHINDUCTOR_CACHE_DIR": cache_dir,
                "TRITON_CACHE_DIR": f"{cache_dir}/triton",
                **workers,
            },
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"shape": shape, "spec": spec, "error": f"timed out after {timeout:.0f} s"}, ""
    rows = [line[4:] for line in done.stdout.splitlines() if line.startswith("ROW ")]
    row = json.loads(rows[0]) if rows else {"shape": shape, "spec": spec, "error": done.stderr[-3000:]}
    return row, done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("specs", nargs="+", help="JSON specs; with --table, JSONL files")
    parser.add_argument("--table", type=Path, help="write the rows of the JSONL files given as a markdown table")
    parser.add_argument("--shape", default="64x256x32")
    parser.add_argument("--out", type=Path, help="JSON lines, one per process")
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds per process")
    parser.add_argument("--cold-only", action="store_true", help="skip the warm process of each SPEC")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--save-artifacts", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--load-artifacts", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.table:
        args.table.write_text(table([Path(path) for path in args.specs]))
        return
    specs = [json.loads(spec) for spec in args.specs]
    if args.worker:
        worker(args.shape, specs[0], args.save_artifacts, args.load_artifacts)
        return
    from axoexp import metadata

    record = metadata.provenance()
    if args.out is None:
        parser.error("--out is required unless --table")
    for spec in specs:
        workers = {"TORCHINDUCTOR_WORKER_START": spec["workers"]} if "workers" in spec else {}
        with (
            tempfile.TemporaryDirectory(prefix="inductor-") as cache,
            tempfile.TemporaryDirectory(prefix="elsewhere-") as elsewhere,
        ):
            artifacts = str(Path(elsewhere) / "artifacts.bin")
            processes = [("cold", cache, ["--save-artifacts", artifacts] if spec.get("artifacts") else [])]
            if spec.get("artifacts"):  # a new, empty cache that loads the cold process's artifacts first
                processes.append(("artifacts", f"{elsewhere}/cache", ["--load-artifacts", artifacts]))
            if not args.cold_only:
                processes.append(("warm", cache, []))
            for phase, cache_dir, extra in processes:
                if phase == "artifacts" and not Path(artifacts).exists():
                    row, stderr = (
                        {"shape": args.shape, "spec": spec, "error": "the cold process saved no artifacts"},
                        "",
                    )
                else:
                    row, stderr = _run_worker(args.shape, spec, extra, cache_dir, workers, args.timeout)
                row["phase"], row["provenance"] = phase, record
                with args.out.open("a") as out:
                    out.write(json.dumps(row) + "\n")
                print(
                    json.dumps({k: row.get(k) for k in ("spec", "phase", "phases_ms", "replay_median_ms", "error")}),
                    flush=True,
                )
                if spec.get("profile"):
                    print(stderr[-16000:], flush=True)


if __name__ == "__main__":
    main()
