"""Cold and warm compile of a compiled executor, each in a fresh ``python -m axoexp`` process.

    python benchmarks/explore/compile_cache.py --label compile-cache_h200_DATE_regional --shapes 64x256x32 -- \
        executor=regional_cudagraph

Per shape, one run with a new, empty inductor cache directory (``cold``), then ``--warm``
runs with the same directory (``warm``): what a sweep's later jobs of that shape see. Each
row is read back from the run in MLflow: the ``compiler_startup`` wait, ``compile`` (tracing
and code generation, or loading them from the cache), ``capture``, the steady-state median,
the ``compile.cache`` tag and the process's wall time. Writes ``OUT/LABEL.json``,
``OUT/LABEL.md`` and the store ``OUT/LABEL.db``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from axoexp import metadata, names


def one_run(shape: str, cache: str, overrides: list[str], uri: str) -> dict[str, object]:
    neurons, time_steps, contacts = shape.split("x")
    command = [
        sys.executable,
        "-m",
        "axoexp",
        "device=cuda",
        f"population.neurons={neurons}",
        f"population.time_steps={time_steps}",
        f"population.contacts={contacts}",
        *overrides,
        f"tracking.uri={uri}",
    ]
    start = time.perf_counter()
    done = subprocess.run(command, env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}, capture_output=True, text=True)
    wall_s = time.perf_counter() - start
    if done.returncode != 0:
        return {"shape": shape, "error": done.stderr[-2000:], "wall_s": wall_s}
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("axoexp")
    (run,) = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time DESC"], max_results=1)
    metrics, tags = run.data.metrics, run.data.tags
    return {
        "shape": shape,
        "cache": tags.get(names.COMPILE_CACHE),
        "wall_s": round(wall_s, 2),
        **{phase: metrics.get(names.phase_metric(phase)) for phase in ("compiler_startup", "compile", "capture")},
        "median_ms": metrics[names.UPDATE_MEDIAN],
        "run_id": run.info.run_id,
    }


def markdown(rows: list[dict[str, object]], overrides: list[str], record: dict[str, str]) -> str:
    lines = [
        f"# Compile, cold and warm cache — {record[names.DATE][:10]}",
        "",
        metadata.provenance_line(record),
        "",
        f"overrides: {' '.join(overrides)}",
        "",
        "| shape | compile cache | compiler start-up ms | compile ms | capture ms | median ms | process s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['shape']} | failed | | | | | {row['wall_s']:.1f} |")
            continue
        lines.append(
            f"| {row['shape']} | {row['cache']} | {row['compiler_startup'] or 0:.0f} | {row['compile']:.0f} "
            f"| {row['capture']:.0f} | {row['median_ms']:.3f} | {row['wall_s']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", required=True)
    parser.add_argument("--shapes", nargs="+", default=["64x256x32"])
    parser.add_argument("--warm", type=int, default=2, help="warm runs after the cold one")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("overrides", nargs="+", help="python -m axoexp overrides, after --")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{(args.out / f'{args.label}.db').resolve()}"
    rows = []
    for shape in args.shapes:
        with tempfile.TemporaryDirectory(prefix="inductor-") as cache:
            for _ in range(1 + args.warm):
                rows.append(one_run(shape, cache, args.overrides, uri))
                print(json.dumps(rows[-1]), flush=True)
    record = metadata.provenance()
    (args.out / f"{args.label}.json").write_text(
        json.dumps({"provenance": record, "overrides": args.overrides, "rows": rows}, indent=2)
    )
    table = markdown(rows, args.overrides, record)
    (args.out / f"{args.label}.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
