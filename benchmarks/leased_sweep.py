"""One sweep run twice, sequentially and through the parallel preset with more jobs than devices.

    python benchmarks/leased_sweep.py --label leased-sweep_h200_DATE_a --jobs 4 -- device=cuda executor=cudagraph \
        population.neurons=3,64,256,1024 run.measured_updates=200

The first pass uses Hydra's basic launcher (one job after another, one process); the second
``hydra/launcher=parallel hydra.launcher.n_jobs=JOBS`` (one process per job, JOBS at once),
so on a host with fewer devices than JOBS the device leases must make the jobs take turns.
For every job it reports both medians and their ratio, the device each pass leased, and
whether any two parallel jobs held the same device at overlapping times (they must not).
Writes ``OUT/LABEL.json`` and ``OUT/LABEL.md``; the MLflow store is ``OUT/LABEL.db``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from mlflow.tracking import MlflowClient

from axoexp import metadata, names
from axoexp.tracking import child_runs

PASSES = {"sequential": [], "parallel": ["hydra/launcher=parallel"]}


def run_pass(name: str, jobs: int, overrides: list[str], uri: str) -> str:
    """Run one pass; return its parent run id."""
    extra = PASSES[name] + ([f"hydra.launcher.n_jobs={jobs}"] if name == "parallel" else [])
    command = [sys.executable, "-m", "axoexp", "-m", *extra, *overrides, "sweep.resume=false", f"tracking.uri={uri}"]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True)
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("axoexp")
    parents = client.search_runs(
        [experiment.experiment_id],
        f"tags.`{names.SWEEP_ROLE}` = 'parent'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return parents[0].info.run_id


def jobs_of(client: MlflowClient, parent: str) -> dict[str, dict]:
    found = {}
    for run in child_runs(client, client.get_run(parent)):
        tags = run.data.tags
        job = ",".join(part for part in run.info.run_name.split(",") if not part.startswith(("tracking.", "sweep.")))
        found[job] = {
            "median_ms": run.data.metrics[names.UPDATE_MEDIAN],
            "status": run.info.status,
            "device": tags.get(names.LEASE_DEVICE),
            "waited_s": float(tags.get(names.LEASE_WAITED_S, "nan")),
            "held": [float(tags[names.LEASE_ACQUIRED_AT]), float(tags[names.LEASE_RELEASED_AT])],
        }
    return found


def overlaps(jobs: dict[str, dict]) -> list[tuple[str, str]]:
    """Pairs of jobs that held the same device at overlapping times."""
    items = sorted(jobs.items(), key=lambda item: item[1]["held"][0])
    return [
        (a, b)
        for i, (a, ja) in enumerate(items)
        for b, jb in items[i + 1 :]
        if ja["device"] == jb["device"] and jb["held"][0] < ja["held"][1]
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", required=True)
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("overrides", nargs="+", help="the sweep, after --")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{(args.out / f'{args.label}.db').resolve()}"
    client = MlflowClient(uri)
    passes = {name: jobs_of(client, run_pass(name, args.jobs, args.overrides, uri)) for name in PASSES}
    sequential, parallel = passes["sequential"], passes["parallel"]
    clashes = overlaps(parallel)
    record = metadata.provenance(next((o.split("=", 1)[1] for o in args.overrides if o.startswith("device=")), "cpu"))
    rows = [
        metadata.provenance_line(record),
        "",
        "| job | sequential median ms | parallel median ms | parallel / sequential | parallel device | waited s |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for job in sorted(sequential):
        s, p = sequential[job], parallel.get(job, {})
        ratio = p["median_ms"] / s["median_ms"] if p else float("nan")
        rows.append(
            f"| {job} | {s['median_ms']:.4g} | {p.get('median_ms', float('nan')):.4g} | {ratio:.3f} | "
            f"{p.get('device')} | {p.get('waited_s', float('nan')):.1f} |"
        )
    rows.append("")
    rows.append(f"Parallel jobs that held one device at overlapping times: {clashes or 'none'}.")
    (args.out / f"{args.label}.json").write_text(
        json.dumps(
            {
                "provenance": record,
                "overrides": args.overrides,
                "jobs": args.jobs,
                "passes": passes,
                "overlaps": clashes,
            },
            indent=2,
        )
    )
    (args.out / f"{args.label}.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))
    sys.exit(1 if clashes else 0)


if __name__ == "__main__":
    main()
