"""Device leases and the launchers beyond one process: joblib, submitit (local), Ray.

SLURM itself cannot run here: the SLURM preset is followed up to ``sbatch`` (a stand-in
``sbatch`` records the script submitit writes); the jobs themselves run through submitit's
local executor, which runs the same pickled job function.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import torch
from helpers import RAY_PORT_ENV, child_processes, leftovers, new_child_processes, run_cli, run_clis
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from axoexp import lease, names
from axoexp.errors import ConfigError, LeaseTimeoutError
from axoexp.experiment import run_experiment
from axoexp.parallel_launcher import LabelledLines
from axoexp.plan import plan_experiment
from axoexp.runtime import allowed_cpus
from axoexp.sweep_plan import jobs_run_here

FAILS_ONCE = '''
from pathlib import Path
from axoexp import component
from axoexp.executors.eager import EagerExecutor

MARKER = Path(__file__).with_name("fails_once.failed")


@component("executor", "fails_once")
class FailsOnce(EagerExecutor):
    """Fails its first update the first time it ever runs (a job that a rerun fixes), then is eager."""

    def step(self, inputs, targets):
        if not MARKER.exists():
            MARKER.write_text("failed once")
            raise RuntimeError("fails_once failed on purpose")
        return super().step(inputs, targets)
'''

# Holds a faked CUDA device of a host with N GPUs: waits for the 'go' file, takes the lease,
# records when it held it (inside the lease) and, with 'meet', waits there for its peer.
LEASE_PROBE = """
import json, sys, time
from pathlib import Path
import torch
from axoexp import lease

gpus, hold_s, out, meet = int(sys.argv[1]), float(sys.argv[2]), Path(sys.argv[3]), sys.argv[4] == "meet"
lease.visible_gpus = lambda: [(index, f"GPU-fake-{index}") for index in range(gpus)]
torch.cuda.current_device = lambda: 0
torch.cuda.set_device = lambda index: None
(out.parent / (out.name + ".ready")).touch()
while not (out.parent / "go").exists():
    time.sleep(0.01)
with lease.device_lease(torch.device("cuda"), cpus=None, timeout_s=60) as held:
    start = time.time()
    (out.parent / (out.name + ".inside")).touch()
    met = False
    if meet:
        deadline = time.monotonic() + 60
        while not met and time.monotonic() < deadline:
            met = len(list(out.parent.glob("*.inside"))) == 2
            time.sleep(0.01)
    else:
        time.sleep(hold_s)
    end = time.time()
out.write_text(json.dumps({"device": held.device, "start": start, "end": end, "waited_s": held.waited_s, "met": met}))
"""


@pytest.fixture
def lease_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "leases"
    monkeypatch.setenv(lease.LEASE_DIR_ENV, str(directory))
    return directory


def _contend(tmp_path: Path, gpus: int, mode: str, hold_s: float = 1.0) -> tuple[list[dict], list[str]]:
    """Two processes ask for a lease on one host with ``gpus`` faked GPUs at the same moment."""
    env = {**os.environ, lease.LEASE_DIR_ENV: str(tmp_path / "leases")}
    outs = [tmp_path / f"probe{n}.json" for n in range(2)]
    probes = [
        subprocess.Popen(
            [sys.executable, "-c", LEASE_PROBE, str(gpus), str(hold_s), str(out), mode],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for out in outs
    ]
    deadline = time.monotonic() + 120
    while not all(Path(f"{out}.ready").exists() for out in outs):
        assert time.monotonic() < deadline and all(p.poll() is None for p in probes), "probes did not start"
        time.sleep(0.02)
    (tmp_path / "go").touch()
    errors = [probe.communicate(timeout=120)[1] for probe in probes]
    assert [probe.returncode for probe in probes] == [0, 0], errors
    return [json.loads(out.read_text()) for out in outs], errors


@pytest.mark.slow
def test_one_faked_gpu_serializes_two_jobs(tmp_path: Path) -> None:
    records, errors = _contend(tmp_path, gpus=1, mode="hold", hold_s=1.0)
    first, second = sorted(records, key=lambda record: record["start"])
    assert first["device"] == second["device"] == "cuda:0 GPU-fake-0"
    assert first["end"] <= second["start"], "both held the one GPU at once"
    assert second["waited_s"] >= 0.5, "the second asked while the first held it (for 1 s), so it waited"
    assert sum("waiting up to 60 s (run.lease_timeout_s) for a device lease" in error for error in errors) == 1


@pytest.mark.slow
def test_two_faked_gpus_let_two_jobs_time_at_once(tmp_path: Path) -> None:
    records, _ = _contend(tmp_path, gpus=2, mode="meet")
    assert all(record["met"] for record in records), "each held its lease while the other held one"
    assert sorted(record["device"] for record in records) == ["cuda:0 GPU-fake-0", "cuda:1 GPU-fake-1"]


def test_waiting_for_a_held_device_is_bounded_and_reported(lease_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with lease.device_lease(torch.device("cpu"), cpus=None, timeout_s=0):
        start = time.monotonic()
        with pytest.raises(
            LeaseTimeoutError,
            match=r"no device lease after 0 s \(run.lease_timeout_s=0.3\): "
            rf"{len(allowed_cpus())} CPUs? \({', '.join(map(str, allowed_cpus()))}\), held by pid {os.getpid()} on ",
        ):
            with lease.device_lease(torch.device("cpu"), cpus=None, timeout_s=0.3):
                pytest.fail("got a lease another holder has")
        assert time.monotonic() - start < 30
    assert capsys.readouterr().err.count("axoexp: waiting up to 0.3 s (run.lease_timeout_s)") == 1
    with lease.device_lease(torch.device("cpu"), cpus=None, timeout_s=0) as again:
        assert again.waited_s < 1, "a released lease is free at once"


def test_the_wait_message_names_what_is_wanted_and_who_holds_each_slot(lease_dir: Path) -> None:
    """`2 CPUs (0, 1)`, then each holder once with the slots it holds; a slot no one holds is free."""
    request = lease.SlotRequest(["cpu-a", "cpu-b"], 2, {"cpu-a": "0", "cpu-b": "1"}, "CPU")
    with lease.hold([lease.SlotRequest(["cpu-a"], 1)], timeout_s=0, directory=lease_dir):
        with pytest.raises(LeaseTimeoutError) as refused:
            with lease.hold([request], timeout_s=0, directory=lease_dir):
                pytest.fail("got a slot another holder has")
    held_by = rf"held by pid {os.getpid()} on \S+ since \d\d:\d\d:\d\d"
    assert re.search(rf": 2 CPUs \(0, 1\), {held_by} \(0\), free now \(1\); run fewer jobs", str(refused.value))
    one_of_two = lease.SlotRequest(["cpu-a", "cpu-b"], 1, {"cpu-a": "0", "cpu-b": "1"}, "CPU")
    with lease.hold([request], timeout_s=0, directory=lease_dir):
        with pytest.raises(LeaseTimeoutError, match=rf": 1 of 2 CPUs \(0, 1\), {held_by}; run fewer jobs"):
            with lease.hold([one_of_two], timeout_s=0, directory=lease_dir):
                pytest.fail("got a slot another holder has")


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_cpu_jobs_get_disjoint_cpu_sets_and_are_pinned_to_them(lease_dir: Path) -> None:
    everything = set(allowed_cpus())
    with lease.device_lease(torch.device("cpu"), cpus=1, timeout_s=0) as first:
        assert len(first.cpus) == 1 and os.sched_getaffinity(0) == set(first.cpus)
        assert first.tags()[names.LEASE_CPUS] == str(first.cpus[0])
        second = subprocess.run(  # another job on the same host (not pinned by this one's lease)
            [
                sys.executable,
                "-c",
                "import os, sys, torch; from axoexp import lease\n"
                f"os.sched_setaffinity(0, {sorted(everything)})\n"
                "with lease.device_lease(torch.device('cpu'), cpus=int(sys.argv[1]), timeout_s=0) as held:\n"
                "    print(*held.cpus)",
                "1",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 0, second.stderr
        assert set(first.cpus).isdisjoint(map(int, second.stdout.split())) and second.stdout.strip()
        everything_else = subprocess.run(
            second.args[:-1] + [str(len(everything))], capture_output=True, text=True, timeout=120
        )
        assert "LeaseTimeoutError" in everything_else.stderr, "all CPUs, one of them taken: no lease"
    assert os.sched_getaffinity(0) == everything, "the process's CPUs are restored"
    assert first.released_at is not None and first.released_at >= first.acquired_at


def test_every_run_records_the_lease_it_held(make_config: Callable, client: MlflowClient, lease_dir: Path) -> None:
    result = run_experiment(make_config("run.measured_updates=2", "run.warmup_updates=1"))
    tags = client.get_run(result.run_id).data.tags
    assert tags[names.LEASE_DEVICE] == "cpu"
    assert tags[names.LEASE_CPUS] == ",".join(map(str, allowed_cpus()))
    assert float(tags[names.LEASE_WAITED_S]) >= 0
    assert float(tags[names.LEASE_ACQUIRED_AT]) <= float(tags[names.LEASE_RELEASED_AT])
    assert sorted(path.name for path in lease_dir.iterdir())[0].startswith("cpu-")


@pytest.mark.parametrize("key", ["run.lease_cpus", "run.threads"])
def test_more_cpus_or_threads_than_the_process_may_use_is_refused_before_any_run(
    make_config: Callable, key: str
) -> None:
    """More threads than CPUs take turns on them, which a run's timings would not show as contention."""
    too_many = len(allowed_cpus()) + 1
    with pytest.raises(ConfigError, match=rf"{key}={too_many}: this process may use only {too_many - 1} CPUs"):
        run_experiment(make_config(f"{key}={too_many}"))


def test_more_threads_than_the_leased_cpus_is_refused_before_any_run(make_config: Callable) -> None:
    """The lease pins the process to run.lease_cpus CPUs before its threads are set."""
    if len(allowed_cpus()) < 2:
        pytest.skip("one CPU: run.lease_cpus=1 leases all of them")
    with pytest.raises(ConfigError, match=r"run.threads=2: run.lease_cpus=1 pins this process to 1 CPU, so its"):
        run_experiment(make_config("run.threads=2", "run.lease_cpus=1"))


def test_presets_size_jobs_to_the_devices() -> None:
    cpus = len(allowed_cpus())
    assert lease.parallel_jobs("cpu", None) == 1, "a CPU job leases every CPU: one at a time"
    assert lease.parallel_jobs("cpu", 1) == cpus
    assert lease.parallel_jobs("cuda:3", None) == 1
    assert (lease.gpus_per_job("cuda"), lease.gpus_per_job("cpu")) == (1, 0)
    assert (lease.cpus_per_job(None), lease.cpus_per_job(4)) == (1, 4)


# --- sweeps through the launchers


def _sweep_runs(uri: str) -> tuple[list, list]:
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs(
        [client.get_experiment_by_name("axoexp").experiment_id], order_by=["attributes.start_time ASC"]
    )
    parents = [run for run in runs if run.data.tags.get(names.SWEEP_ROLE) == "parent"]
    return parents, [run for run in runs if run not in parents]


@pytest.fixture(autouse=True)
def private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every launcher's process gets this test's own HOME and TMPDIR (a Ray token or a joblib
    folder another program left in ~ or /tmp changes nothing); /tmp gains nothing from it."""
    before = set(os.listdir(tempfile.gettempdir()))
    for name in ("home", "tmp"):
        (tmp_path / name).mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    yield tmp_path / "home"
    created = set(os.listdir(tempfile.gettempdir())) - before
    assert not [name for name in created if name.startswith(("ray", "axray", "joblib", "submitit"))], created


def check_fail_then_resume(run: Callable[..., subprocess.CompletedProcess], uri: str, root: Path) -> None:
    """One sweep, twice: a failing job fails the parent but not its sibling; the rerun runs only it."""
    sweep = (
        "executor=eager,fails_once",
        "population.neurons=2",
        "run.measured_updates=3",
        f"tracking.uri={uri}",
        "sweep.resume_contended=true",  # about reuse: a busy machine's runs are contended
    )
    first = run(*sweep, f"hydra.sweep.dir={root / 'first'}")
    assert first.returncode == 1, first.stderr[-3000:]
    (parent,), children = _sweep_runs(uri)
    assert parent.info.status == "FAILED"
    assert parent.data.tags[names.FAILURE].startswith("1 of 2 jobs did not finish")
    statuses = {child.data.tags[names.component_tag("executor")]: child.info.status for child in children}
    assert statuses == {"eager": "FINISHED", "fails_once": "FAILED"}, "one run per job, the sibling FINISHED"
    assert {child.data.tags[names.PARENT_RUN_ID] for child in children} == {parent.info.run_id}
    assert all(child.data.tags[names.LEASE_DEVICE] == "cpu" for child in children)

    again = run(*sweep, f"hydra.sweep.dir={root / 'again'}")
    assert again.returncode == 0, again.stderr[-3000:]
    parents, children = _sweep_runs(uri)
    resumed = parents[-1]
    assert resumed.info.status == "FINISHED"
    reused = [value for key, value in resumed.data.tags.items() if key.startswith(names.REUSED_PREFIX)]
    eager_run = next(child for child in children if child.data.tags[names.component_tag("executor")] == "eager")
    assert reused == [eager_run.info.run_id], "the finished job was skipped, not run again"
    new = [child for child in children if child.data.tags[names.PARENT_RUN_ID] == resumed.info.run_id]
    assert [(c.data.tags[names.component_tag("executor")], c.info.status) for c in new] == [("fails_once", "FINISHED")]
    assert len(children) == 3, "no duplicate runs: eager once, fails_once once per sweep"


@pytest.mark.slow
@pytest.mark.usefixtures("migrated_store")
def test_sweep_through_submitit_local(tmp_path: Path) -> None:
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "fails_once.py").write_text(FAILS_ONCE)
    env = {lease.LEASE_DIR_ENV: str(tmp_path / "leases")}

    def run(*overrides: str) -> subprocess.CompletedProcess:
        return run_cli("-m", "hydra/launcher=submitit_local", *overrides, cwd=tmp_path, env=env)

    before = child_processes()  # the session's Ray instance, if a test before this one started it
    check_fail_then_resume(run, f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "sweeps")
    assert new_child_processes(before) == []
    assert leftovers(str(tmp_path)) == []


RAY = "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher"


@pytest.mark.parametrize(
    "launcher, address, environment, here",
    [
        ("hydra._internal.core_plugins.basic_launcher.BasicLauncher", None, None, True),
        ("hydra_plugins.axoexp_parallel_launcher.parallel_launcher.ParallelLauncher", None, None, True),
        ("hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher", None, None, True),
        ("hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher", None, None, True),
        (RAY, None, None, True),
        (RAY, "auto", None, False),
        (RAY, None, "10.0.0.5:6379", False),  # ray.init() connects to RAY_ADDRESS where no address is given
        ("hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher", None, None, False),
        ("hydra_plugins.hydra_ray_launcher.ray_aws_launcher.RayAWSLauncher", None, None, False),
    ],
)
def test_only_launchers_known_to_run_jobs_here_have_them_judged_here(
    launcher: str, address: str | None, environment: str | None, here: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deny-list (SLURM, Ray at an address) judged a Ray AWS cluster's jobs on the submitting machine."""
    if environment is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", environment)
    config = OmegaConf.create({"hydra": {"launcher": {"_target_": launcher, "ray": {"init": {"address": address}}}}})
    assert jobs_run_here(config) is here


def test_a_job_planned_for_another_machine_is_judged_by_what_holds_on_any(make_config) -> None:
    """Planned for a cluster's node (here=False): CUDA and the CPUs this machine lacks are the node's to
    judge, but threads beyond the job's own CPU lease are refused on any machine."""
    assert plan_experiment(make_config("device=cuda", "executor=cudagraph", "run.threads=512"), here=False)
    with pytest.raises(ConfigError, match=r"run.threads=8: run.lease_cpus=2 pins this process to 2 CPUs"):
        plan_experiment(make_config("run.lease_cpus=2", "run.threads=8"), here=False)


def _sbatch_stand_in(folder: Path) -> dict[str, str]:
    """A ``bin`` folder in ``folder`` whose ``sbatch`` keeps the script it is given as
    ``submitted.sh`` and refuses it (no SLURM here); the environment that puts it first on PATH."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\ncp "$1" {folder / "submitted.sh"}\necho refused >&2\nexit 1\n')
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")  # submitit checks that it exists
    for tool in ("sbatch", "srun"):
        (bin_dir / tool).chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


PRESET_SWEEPS = {  # a name: the sweep's overrides, what its folder needs (the environment it adds)
    "parallel": (
        ("hydra/launcher=parallel", "hydra.launcher.n_jobs=2", "population.neurons=2,3", "run.measured_updates=20"),
        lambda folder: {lease.LEASE_DIR_ENV: str(folder / "leases")},
    ),
    "slurm": (  # the README's GPU sweep, from a machine without CUDA (a cluster's login node)
        (
            "hydra/launcher=slurm",
            "hydra.launcher.partition=gpu",
            "device=cuda",
            "executor=cudagraph",
            "population.neurons=2,3",
        ),
        _sbatch_stand_in,
    ),
    "joblib refuses a setting": (  # a third-party launcher's own ValueError, raised as it launches
        ("hydra/launcher=joblib", "hydra.launcher.prefer=bogus", "population.neurons=2,3"),
        lambda folder: {},
    ),
}


@pytest.fixture(scope="module")
def preset_sweeps(
    tmp_path_factory: pytest.TempPathFactory, empty_store: Path
) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """What each of ``PRESET_SWEEPS`` printed and its folder (a copy of the empty store, a HOME and
    TMPDIR of its own, as ``private_home`` gives a test): the two share nothing, so they run side by side."""
    before = set(os.listdir(tempfile.gettempdir()))
    folders = {name: tmp_path_factory.mktemp(name) for name in PRESET_SWEEPS}
    calls = []
    for name, (overrides, prepare) in PRESET_SWEEPS.items():
        folder = folders[name]
        shutil.copyfile(empty_store, folder / "mlflow.db")
        for private in ("home", "tmp"):
            (folder / private).mkdir()
        env = {"HOME": str(folder / "home"), "TMPDIR": str(folder / "tmp"), **prepare(folder)}
        calls.append((("-m", *overrides), folder, env))
    results = run_clis(calls)
    created = set(os.listdir(tempfile.gettempdir())) - before
    assert not [name for name in created if name.startswith(("joblib", "submitit"))], created
    return {name: (result, folders[name]) for name, result in zip(PRESET_SWEEPS, results, strict=True)}


@pytest.mark.slow
def test_parallel_preset_times_one_cpu_job_at_a_time_on_all_cpus(preset_sweeps) -> None:
    """More jobs at once than CPU sets: the lease makes them take turns."""
    result, folder = preset_sweeps["parallel"]
    assert result.returncode == 0, result.stderr[-3000:]
    (parent,), children = _sweep_runs(f"sqlite:///{folder / 'mlflow.db'}")
    assert parent.info.status == "FINISHED" and len(children) == 2
    assert len({child.data.tags[names.PROCESS_PID] for child in children}) == 2, "one process per job"
    held = sorted(
        (float(c.data.tags[names.LEASE_ACQUIRED_AT]), float(c.data.tags[names.LEASE_RELEASED_AT])) for c in children
    )
    assert all(earlier[1] <= later[0] for earlier, later in zip(held, held[1:], strict=False)), (
        f"leases overlap: {held}"
    )
    assert {child.data.tags[names.LEASE_CPUS] for child in children} == {",".join(map(str, allowed_cpus()))}
    for child in children:  # jobs that run at once share the terminal: each line names its job
        number = int(child.info.run_name.split()[0])
        assert f"[#{number}] mlflow run    {child.info.run_id}  " in result.stdout, result.stdout[-3000:]


def test_a_parallel_jobs_lines_start_with_its_number() -> None:
    written = io.StringIO()
    labelled = LabelledLines(written, "[#3] ")
    for text in ("first line\nsecond ", "line, written in two\n", "", "\n", "a\r\nb\n"):
        labelled.write(text)
    assert written.getvalue() == "[#3] first line\n[#3] second line, written in two\n[#3] \n[#3] a\r\n[#3] b\n"


@pytest.mark.slow
def test_a_launchers_own_value_error_is_the_sweeps_one_line_and_its_parents_reason(preset_sweeps) -> None:
    """A setting the launcher's library refuses as it launches (joblib's ``prefer``): one line naming the
    launcher, no traceback, and the parent FAILED with it as its reason."""
    result, folder = preset_sweeps["joblib refuses a setting"]
    failed = (
        "hydra/launcher=joblib failed to launch or collect the jobs: ValueError: prefer=bogus is not a valid "
        "backend hint, expected one of ('processes', 'threads', None)"
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-2:] == [
        f"axoexp: {failed}",
        f"axoexp: the sweep ended FAILED: 2 of 2 jobs never started; {failed}",
    ]
    (parent,), children = _sweep_runs(f"sqlite:///{folder / 'mlflow.db'}")
    assert parent.info.status == "FAILED" and children == []
    assert parent.data.tags[names.FAILURE] == f"2 of 2 jobs never started; {failed}"


@pytest.mark.slow
def test_slurm_preset_submits_a_gpu_array_through_sbatch(preset_sweeps) -> None:
    """Up to sbatch: the script submitit writes for hydra/launcher=slurm (no SLURM here). A GPU sweep
    submitted from a machine without CUDA was refused as a whole ("CUDA is not available here"): what
    the machine has is judged by each job on its node. sbatch's refusal printed submitit's traceback;
    it is one line, and the parent run's reason."""
    result, folder = preset_sweeps["slurm"]
    assert result.returncode == 1
    failed = "hydra/launcher=slurm failed to launch or collect the jobs: FailedJobError: refused"
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-2:] == [
        f"axoexp: {failed}",
        f"axoexp: the sweep ended FAILED: 2 of 2 jobs never started; {failed}",
    ]
    script = (folder / "submitted.sh").read_text()
    for flag in (
        "--gpus-per-node=1",
        "--exclusive",
        "--time=60",
        "--array=0-1%2",
        "--partition=gpu",
        "--ntasks-per-node=1",
        "--job-name=axoexp",
        "--signal=USR2@120",
    ):
        assert f"#SBATCH {flag}\n" in script, f"{flag} missing from:\n{script}"
    (parent,), children = _sweep_runs(f"sqlite:///{folder / 'mlflow.db'}")
    assert parent.info.status == "FAILED" and children == [], "a sweep whose submission failed is not FINISHED"
    assert parent.data.tags[names.FAILURE].endswith(failed)


# --- Ray: the session's local instance on 127.0.0.1 (conftest.py's ray_cluster)


@pytest.mark.slow
@pytest.mark.usefixtures("migrated_store")
def test_sweep_through_ray(ray_cluster: tuple[str, Path, dict[str, str]], tmp_path: Path) -> None:
    address, plugins, private = ray_cluster
    (plugins / "fails_once.py").write_text(FAILS_ONCE)  # the cluster's workers load their plugins from there
    env = {**RAY_PORT_ENV, **private, "AXOEXP_PLUGINS_DIR": str(plugins)}

    def run(*overrides: str) -> subprocess.CompletedProcess:
        return run_cli(
            "-m",
            "hydra/launcher=ray_devices",
            f"hydra.launcher.ray.init.address={address}",
            *overrides,
            cwd=tmp_path,
            env=env,
        )

    check_fail_then_resume(run, f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "sweeps")
    (first, _), children = _sweep_runs(f"sqlite:///{tmp_path / 'mlflow.db'}")
    driver = first.data.tags[names.PROCESS_PID]
    assert all(child.data.tags[names.PROCESS_PID] != driver for child in children), "jobs ran in Ray workers"
    ray_head = {process.pid for process in psutil.Process().children() if "ray" in process.name()}
    assert [process for process in psutil.Process().children() if process.pid not in ray_head] == []
    assert leftovers(str(tmp_path)) == []


@pytest.mark.parametrize("device, gpus", [("cpu", 0), ("cuda", 1)])
def test_ray_preset_asks_for_a_gpu_on_cuda_and_never_retries(loaded_registry, device: str, gpus: int) -> None:
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    with initialize_config_module(config_module="axoexp.conf", version_base="1.3"):
        config = compose(
            "config",
            overrides=["hydra/launcher=ray_devices", f"device={device}", "run.lease_cpus=2"],
            return_hydra_config=True,
        )
    remote = OmegaConf.to_container(config.hydra.launcher.ray.remote, resolve=True)
    assert remote == {"num_gpus": gpus, "num_cpus": 2, "max_retries": 0}
