"""The README's command against the bare imports it cannot do without, side by side in fresh processes.

    python benchmarks/startup.py --device cpu --repeats 5 --label startup_cpu_2026-12-03_readme --note "..."
    python benchmarks/startup.py --device cuda --repeats 3 --label startup_h200_2026-12-03_readme

On the CPU it times ``python -m axoexp executor=eager loss=causal_mse`` against
``python -c "import torch, mlflow"``; with ``--device cuda`` the README's GPU command against
``python -c "import torch, mlflow; torch.zeros(1, device='cuda')"``. Each command runs once
untimed (the store is created then, and files are in the page cache), then REPEATS times,
alternating, each in a new process, in one fresh working directory. A run's wall time is
measured from outside (start of the child to its exit) and compared with the phases the run
logged (``process_*_ms``); what the run could not log, its exit, is the difference. The runs take
their CPU lease in a folder of that directory (``$AXOEXP_LEASE_DIR``), so that waiting for another
process's lease on a shared machine (a test suite's runs) is not counted as start-up.
Writes LABEL.json and LABEL.md under --out-dir (and, while it runs, each pair to LABEL.partial.jsonl),
with axoexp's provenance (commit, dirty flag, command, device, date).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from axoexp import metadata
from axoexp.lease import LEASE_DIR_ENV

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = {
    "cpu": (
        ["-m", "axoexp", "executor=eager", "loss=causal_mse"],
        ["-c", "import torch, mlflow"],
    ),
    "cuda": (
        ["-m", "axoexp", "executor=cudagraph", "device=cuda", "loss=causal_mse", "verify.enabled=true"],
        ["-c", "import torch, mlflow; torch.zeros(1, device='cuda')"],
    ),
}
RUN_ID_LABEL = "mlflow run"


def timed(arguments: list[str], workdir: Path) -> tuple[float, float, str]:
    """Wall seconds of one fresh process, from before it is started to after it exited; the CPU
    seconds (user and system) it and the processes it waited for (git) used; its stdout."""
    environment = {**os.environ, LEASE_DIR_ENV: str(workdir / "leases")}
    cpu_before = _children_cpu_s()
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *arguments], cwd=workdir, env=environment, capture_output=True, text=True, timeout=900
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(arguments)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return seconds, _children_cpu_s() - cpu_before, done.stdout


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def logged_phases(stdout: str, workdir: Path) -> dict[str, float]:
    """The process_* metrics of the run whose id the summary printed."""
    from mlflow.tracking import MlflowClient

    run_id = next(line.split()[2] for line in stdout.splitlines() if line.startswith(RUN_ID_LABEL))
    run = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}").get_run(run_id)
    return {key: value for key, value in run.data.metrics.items() if key.startswith("process_")}


def spread(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    quartiles = statistics.quantiles(ordered, n=4) if len(ordered) > 1 else [ordered[0]] * 3
    return {
        "median": statistics.median(ordered),
        "min": ordered[0],
        "max": ordered[-1],
        "p25": quartiles[0],
        "p75": quartiles[2],
    }


def measure(device: str, repeats: int, partial: Path) -> dict[str, object]:
    run_arguments, bare_arguments = COMMANDS[device]
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="axoexp-startup-") as directory:
        workdir = Path(directory)
        untimed = {"run": timed(run_arguments, workdir)[0], "bare": timed(bare_arguments, workdir)[0]}
        run_s, bare_s, run_cpu_s, bare_cpu_s, phases = [], [], [], [], []
        for _ in range(repeats):
            seconds, cpu_s, stdout = timed(run_arguments, workdir)
            run_s.append(seconds)
            run_cpu_s.append(cpu_s)
            phases.append(logged_phases(stdout, workdir))
            seconds, cpu_s, _ = timed(bare_arguments, workdir)
            bare_s.append(seconds)
            bare_cpu_s.append(cpu_s)
            loads.append(os.getloadavg()[0])
            with partial.open("a") as out:  # what a pair measured, kept should a later one not finish
                pair = {"run_s": run_s[-1], "bare_s": bare_s[-1], "run_cpu_s": run_cpu_s[-1], "bare_cpu_s": cpu_s}
                out.write(json.dumps({**pair, "phases_ms": phases[-1]}) + "\n")
    exit_s = [seconds - logged["process_total_ms"] / 1000 for seconds, logged in zip(run_s, phases, strict=True)]
    pair_ratios = [run / bare for run, bare in zip(run_s, bare_s, strict=True)]
    phase_names = [key for key in phases[0] if key != "process_total_ms"]
    return {
        "provenance": metadata.provenance(device),
        "cpus": os.cpu_count(),
        "python": sys.executable,
        "commands": {
            "run": " ".join(["python", *run_arguments]),
            "bare": " ".join(["python", *(f'"{a}"' if " " in a else a for a in bare_arguments)]),
        },
        "repeats": repeats,
        "load_average_1min": loads,
        "untimed_first_s": untimed,
        "run_s": run_s,
        "bare_s": bare_s,
        "run": spread(run_s),
        "bare": spread(bare_s),
        "ratio_of_medians": statistics.median(run_s) / statistics.median(bare_s),
        "pair_ratios": pair_ratios,
        "median_pair_ratio": statistics.median(pair_ratios),
        "run_cpu_s": run_cpu_s,
        "bare_cpu_s": bare_cpu_s,
        "cpu_ratio_of_medians": statistics.median(run_cpu_s) / statistics.median(bare_cpu_s),
        "phases_ms_median": {key: statistics.median(p[key] for p in phases) for key in phase_names},
        "logged_total_s": [p["process_total_ms"] / 1000 for p in phases],
        "exit_s": exit_s,
        "phases_ms": phases,
    }


def markdown(result: dict[str, object], note: str) -> str:
    run, bare = result["run"], result["bare"]
    assert isinstance(run, dict) and isinstance(bare, dict)
    commands = result["commands"]
    assert isinstance(commands, dict)
    lines = [
        "# Start-up: the README's command against the bare imports",
        "",
        f"- {metadata.provenance_line(result['provenance'])}",  # type: ignore[arg-type]
        f"- {result['cpus']} CPUs",
        f"- {result['repeats']} alternating repetitions in fresh processes, after one untimed run of each "
        f"(untimed: run {result['untimed_first_s']['run']:.2f} s, bare {result['untimed_first_s']['bare']:.2f} s)",  # type: ignore[index]
        f"- 1-minute load average during the measurement: {', '.join(f'{x:.1f}' for x in result['load_average_1min'])}",  # type: ignore[union-attr]
    ]
    if note:
        lines.append(f"- note: {note}")
    lines += [
        "",
        "| command | median s | p25 | p75 | min | max |",
        "|---|---|---|---|---|---|",
        *(
            f"| `{commands[key]}` | {row['median']:.2f} | {row['p25']:.2f} | {row['p75']:.2f} | "
            f"{row['min']:.2f} | {row['max']:.2f} |"
            for key, row in (("run", run), ("bare", bare))
        ),
        "",
        f"Ratio of medians {result['ratio_of_medians']:.2f} (target: at most 1.5); per pair: "
        f"{', '.join(f'{x:.2f}' for x in result['pair_ratios'])} (median {result['median_pair_ratio']:.2f}).",  # type: ignore[union-attr]
        "",
        f"CPU seconds (user and system, the process and the git commands it waited for), medians: run "
        f"{statistics.median(result['run_cpu_s']):.2f}, bare {statistics.median(result['bare_cpu_s']):.2f}, "  # type: ignore[arg-type]
        f"ratio {result['cpu_ratio_of_medians']:.2f} (less sensitive to the other sessions' load than wall time).",
        "",
        "Median of the phases the run logged (`process_<phase>_ms`), and its exit (wall time seen from "
        "outside minus `process_total_ms`):",
        "",
        "| phase | median ms |",
        "|---|---|",
        *(f"| {key} | {ms:.0f} |" for key, ms in result["phases_ms_median"].items()),  # type: ignore[union-attr]
        f"| exit (outside - logged total) | {statistics.median(result['exit_s']) * 1000:.0f} |",  # type: ignore[arg-type]
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=sorted(COMMANDS), default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--label", required=True, help="file stem of the results, e.g. startup_cpu_2026-12-03_readme")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--note", default="", help="what the reader must know, e.g. that the machine was shared")
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    partial = args.out_dir / f"{args.label}.partial.jsonl"
    result = measure(args.device, args.repeats, partial)
    partial.unlink()
    result["note"] = args.note
    (args.out_dir / f"{args.label}.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result, args.note)
    (args.out_dir / f"{args.label}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
