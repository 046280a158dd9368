"""How long inductor's compile-worker pool takes to answer, in a fresh process per setting.

    python benchmarks/explore/pool_start.py --out pool.jsonl subprocess:16 subprocess:4 fork:16

Each SETTING (``METHOD:WORKERS``, METHOD inductor's ``worker_start_method``) runs in a new
process: import torch, create the pool (``warm_pool``), then wait until it answers a first
no-op job (``ready_after_warm``, the moment inductor starts compiling kernels in the pool
rather than in the process), then until every worker has run a 0.2 s job. One JSON line each,
with the provenance (commit, dirty flag, command line, device, date).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def worker(method: str, workers: int) -> dict[str, object]:
    start = time.perf_counter()
    import torch  # noqa: F401
    from torch._inductor import config
    from torch._inductor.async_compile import AsyncCompile

    marks: dict[str, object] = {
        "method": method,
        "workers": workers,
        "import_torch": round(time.perf_counter() - start, 3),
    }
    config.worker_start_method, config.compile_threads = method, workers
    for name, call in (("warm_pool", AsyncCompile.warm_pool), ("ready_after_warm", AsyncCompile.wait_pool_ready)):
        start = time.perf_counter()
        call()
        marks[name] = round(time.perf_counter() - start, 3)
    start = time.perf_counter()
    for future in [AsyncCompile.process_pool().submit(time.sleep, 0.2) for _ in range(workers)]:
        future.result()
    marks["all_workers_0.2s_jobs"] = round(time.perf_counter() - start, 3)
    return marks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("settings", nargs="+", help="METHOD:WORKERS, e.g. subprocess:16")
    parser.add_argument("--out", type=Path, required=True, help="JSON lines, one per process")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        method, workers = args.settings[0].split(":")
        print("ROW " + json.dumps(worker(method, int(workers))), flush=True)
        return
    from axoexp import metadata  # in the parent only: a worker's first import of torch is what it times

    record = metadata.provenance()
    for setting in args.settings:
        done = subprocess.run(
            [sys.executable, __file__, "--worker", "--out", str(args.out), setting],
            capture_output=True,
            text=True,
            timeout=300,
        )
        rows = [line[4:] for line in done.stdout.splitlines() if line.startswith("ROW ")]
        found = json.loads(rows[0]) if rows else {"setting": setting, "error": done.stderr[-3000:]}
        row = json.dumps({**found, "provenance": record})
        with args.out.open("a") as out:
            out.write(row + "\n")
        print(row, flush=True)


if __name__ == "__main__":
    main()
