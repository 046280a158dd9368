"""Idle against disturbed default runs, per thread count: the evidence for ``timing.noise`` and ``run.threads``.

    python benchmarks/noise_threads.py --threads 1 2 auto --repeats 8 --out noise-threads_cpu_DATE_2cpu.json

In one process, the default experiment's population and eager executor (or ``--override``s)
run, for each repeat and each thread count (``auto``: ``run.threads=null``'s calibration after
warm-up), once on the machine as it is ("idle") and once beside one busy process (a Python
``while True`` loop this script starts and ends), in rotating order. Each run is what
``python -m axoexp`` times by default: ``run.warmup_updates`` then ``run.measured_updates``
updates through :func:`axoexp.measure.run_updates`. For every run the JSON keeps the order
statistics, IQR/median, every measured latency (to the microsecond, so any other statistic can
be computed from the file) and the 1-minute load average before it. Machines shared with other
sessions are never truly idle: the load average says how far from idle each run was.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_module

from axoexp import metadata
from axoexp.config import register_configs
from axoexp.measure import calibrate_threads, run_updates
from axoexp.plan import plan_experiment
from axoexp.plugins import load_plugins
from axoexp.runtime import thread_candidates
from axoexp.statistics import HIGH, NOISE_THRESHOLD, LatencySummary, noise_verdict
from axoexp.windows import UpdateTrace

BUSY_LOOP = "while True: pass"
AUTO = "auto"  # run.threads=null: calibrated after warm-up


class Discard:
    """Where calibration logs to in this benchmark: nowhere (the JSON keeps its choice)."""

    def log_metrics(self, *args: object, **kwargs: object) -> None: ...
    def log_params(self, *args: object, **kwargs: object) -> None: ...
    def set_tags(self, *args: object, **kwargs: object) -> None: ...


def one_run(plan, threads: str) -> dict[str, float]:
    """A default run: warm-up, measured updates; with ``threads=auto`` the calibration between them."""
    torch.set_num_threads(1 if threads == AUTO else int(threads))
    setup = plan.build_population()
    executor = plan.build_executor(setup.module)
    executor.prepare(*setup.batches[0])
    warmup, measured = UpdateTrace(), UpdateTrace()
    warmup_count = int(plan.config.run.warmup_updates)
    run_updates(executor, setup.batches, warmup_count, 0, warmup)
    chosen = torch.get_num_threads()
    if threads == AUTO:
        candidates = thread_candidates(len(os.sched_getaffinity(0)))
        chosen = calibrate_threads(executor, setup.batches, warmup_count, candidates, Discard())
    run_updates(executor, setup.batches, int(plan.config.run.measured_updates), len(warmup.latencies_ms), measured)
    summary = LatencySummary.of(measured.latencies_ms)
    return {
        "threads_used": chosen,
        "median_ms": round(summary.median, 4),
        "p10_ms": round(summary.p10, 4),
        "p90_ms": round(summary.p90, 4),
        "mean_ms": round(summary.mean, 4),
        "rel_iqr": round(summary.rel_iqr, 4),
        "latencies_ms": [round(value, 3) for value in measured.latencies_ms],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", nargs="+", default=["1", "2", AUTO], help=f"counts, or {AUTO} (calibrated)")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--override", nargs="*", default=[], help="config overrides, e.g. population.neurons=64")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    register_configs(load_plugins())
    with initialize_config_module("axoexp.conf", version_base="1.3"):
        config = compose("config", overrides=args.override)
    plan = plan_experiment(config)
    runs = []
    for repeat in range(args.repeats):
        for condition in ("idle", "one busy process") if repeat % 2 == 0 else ("one busy process", "idle"):
            busy = subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) if condition != "idle" else None
            try:
                time.sleep(0.3)
                for threads in args.threads if repeat % 2 == 0 else reversed(args.threads):
                    load = os.getloadavg()[0]
                    runs.append({"repeat": repeat, "condition": condition, "threads": threads, "load_1min": load})
                    runs[-1].update(one_run(plan, threads))
                    print({key: value for key, value in runs[-1].items() if key != "latencies_ms"}, flush=True)
            finally:
                if busy is not None:
                    busy.kill()
                    busy.wait()
    summary = {}
    for condition in ("idle", "one busy process"):
        for threads in args.threads:
            mine = [run for run in runs if run["condition"] == condition and run["threads"] == threads]
            noisy = sum(noise_verdict(run["rel_iqr"]) == HIGH for run in mine)  # timing.noise's rule
            summary[f"{condition}, {threads} threads"] = {
                "median_of_medians_ms": round(float(np.median([run["median_ms"] for run in mine])), 4),
                "median_of_means_ms": round(float(np.median([run["mean_ms"] for run in mine])), 4),
                "median_p90_ms": round(float(np.median([run["p90_ms"] for run in mine])), 4),
                f"rel_iqr_over_{NOISE_THRESHOLD:g}": f"{noisy} of {len(mine)}",
                "threads_used": sorted(run["threads_used"] for run in mine),
            }
    record = {
        "provenance": metadata.provenance("cpu"),
        "cpus_allowed": len(os.sched_getaffinity(0)),
        "note": "other sessions share this machine: 'idle' means no busy process of ours; load_1min says the rest",
        "summary": summary,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
