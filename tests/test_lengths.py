"""Variable-length streams: the lengths syntax, buckets, and padded-and-masked updates equal to
exact-length eager updates (docs/lengths.md)."""

from __future__ import annotations

import copy
import json
import shlex
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import LENGTH_PLUGINS, registry_with_plugins, run_clis
from mlflow.tracking import MlflowClient

from axoexp import names
from axoexp.components.losses import causal_mse, huber, mse
from axoexp.components.population import lite
from axoexp.console import format_result
from axoexp.errors import ConfigError
from axoexp.executors.base import eager_update, pad_steps
from axoexp.experiment import run_experiment
from axoexp.interfaces import adaptation_parameters
from axoexp.lengths import Lengths, bucket_of, buckets_for, padding_overhead, parse_lengths
from axoexp.plan import plan_experiment
from axoexp.report.__main__ import main as report_main
from axoexp.report.rows import build_rows
from axoexp.report.table import bucket_span

CPU = torch.device("cpu")


def test_lengths_syntax() -> None:
    assert parse_lengths(None) is None
    assert parse_lengths([128, 64, 64, 256]) == Lengths((64, 128, 256), 64, 256)
    assert parse_lengths("64,128") == Lengths((64, 128), 64, 128)
    assert parse_lengths([40]) == parse_lengths("40") == Lengths((40,), 40, 40)
    assert parse_lengths("uniform:32:256") == Lengths(None, 32, 256)
    for bad, says in (
        ("uniform:9", " is not null"),
        ("uniform:9:3", ": MIN 9 exceeds MAX 3"),
        ([8, 0, 16], ": 0 is not a positive integer (null"),  # the bad element, not only the list
        ([-8, 16], ": -8 is not a positive integer (null"),
        ([-8, 0, "x"], ": -8, 0, 'x' are not positive integers (null"),
        ("uniform:0:16", ": 0 is not a positive integer (null"),
        ("abc", ": 'abc' is not a positive integer (null"),
        ([], " is empty (null"),
        (2.5, " is not null"),
    ):
        with pytest.raises(ValueError) as error:
            parse_lengths(bad)
        assert str(error.value).startswith(f"population.lengths={bad!r}{says}"), error.value
    with pytest.raises(ValueError, match=r"executor.buckets=\[64, 0\]: 0 is not a positive integer \(pow2half"):
        buckets_for([64, 0], [9, 30])


def test_a_bare_number_of_lengths_is_refused_for_population_time_steps(make_config) -> None:
    """``population.lengths=16`` ran every batch at 16 steps while the logged ``population.time_steps``
    said 12: one length for every batch is ``population.time_steps``'s, and the line says so."""
    with pytest.raises(ConfigError) as refused:
        plan_experiment(make_config("population.lengths=16"))
    assert str(refused.value) == (
        "invalid experiment config: population.lengths=16: one length for every batch is population.time_steps=16; "
        "population.lengths takes null (every batch has the population's fixed length), a list such as "
        "[64,128,256], or uniform:MIN:MAX"
    )
    plan_experiment(make_config("population.lengths=[16]"))  # a list of one length is a list


def test_drawn_lengths_are_seeded_and_within_the_spec() -> None:
    spec = parse_lengths("uniform:32:256")
    assert spec is not None
    drawn = spec.draw(2000, torch.Generator().manual_seed(1))
    assert drawn == spec.draw(2000, torch.Generator().manual_seed(1))
    assert min(drawn) == 32 and max(drawn) == 256  # both ends drawn: the range is inclusive
    assert set(parse_lengths([8, 16]).draw(50, torch.Generator().manual_seed(0))) == {8, 16}  # type: ignore[union-attr]


def test_population_draws_each_batch_length_and_keeps_the_fixed_default() -> None:
    fixed = lite(device=CPU, dtype=torch.float32, seed=3, time_steps=12)
    assert [inputs.shape for inputs, _ in fixed.batches] == [torch.Size([3, 12, 4])] * 4
    same = lite(device=CPU, dtype=torch.float32, seed=3, time_steps=12, lengths=None)
    for (a, b), (c, d) in zip(fixed.batches, same.batches, strict=True):
        assert torch.equal(a, c) and torch.equal(b, d)
    varied = lite(device=CPU, dtype=torch.float32, seed=3, lengths="uniform:6:30", batches=6, batch_size=2)
    steps = [inputs.shape[-2] for inputs, _ in varied.batches]
    assert len(set(steps)) > 1 and all(6 <= step <= 30 for step in steps)
    assert all(targets.shape[:-1] == inputs.shape[:-1] for inputs, targets in varied.batches)


def test_the_lengths_drawn_depend_on_the_seed_alone_not_on_the_shape() -> None:
    """A shape sweep times one workload: the same seed draws the same lengths, adapted and held out."""

    def lengths(seed: int = 0, **shape: int) -> tuple[list[int], list[int]]:
        setup = lite(device=CPU, dtype=torch.float32, seed=seed, lengths="uniform:8:64", batches=8, **shape)
        return [int(x.shape[-2]) for x, _ in setup.batches], [int(x.shape[-2]) for x, _ in setup.eval_batches]

    drawn = lengths()
    assert len(set(drawn[0])) > 1
    for shape in ({"neurons": 4}, {"neurons": 64, "contacts": 32}, {"batch_size": 2}):
        assert lengths(**shape) == drawn, shape
    assert lengths(seed=1) != drawn


def test_buckets_follow_the_documented_rules() -> None:
    assert buckets_for("pow2", list(range(32, 257))) == (32, 64, 128, 256)
    assert buckets_for("pow2", [33, 200]) == (64, 128, 200)  # the longest length is the last bucket
    assert buckets_for("pow2", [12, 12]) == (12,)  # a fixed length: one unpadded graph
    assert buckets_for("pow2half", list(range(32, 257))) == (32, 48, 64, 96, 128, 192, 256)  # the default
    assert buckets_for("pow2half", [9, 30]) == (12, 16, 24, 30)  # none below the shortest length
    assert buckets_for([256, 64, 128], [50, 256]) == (64, 128, 256)
    assert buckets_for("100,300", [50, 256]) == (100, 300)
    assert buckets_for(256, [50, 256]) == (256,)  # executor.buckets=256: pad everything to 256
    assert bucket_of(65, (64, 128, 256)) == 128 and bucket_of(64, (256, 64)) == 64
    assert padding_overhead([48, 64], (64,)) == pytest.approx(128 / 112)
    with pytest.raises(ValueError, match="longer than the largest bucket 128; add a bucket of at least 200"):
        buckets_for([64, 128], [50, 200])
    with pytest.raises(ValueError, match=r"executor.buckets='fast' is not pow2half"):
        buckets_for("fast", [50, 200])


def _updates(module, loss_fn, batches, bucket: int | None, updates: int):
    """``updates`` Adam updates cycling through ``batches``; with ``bucket``, padded and masked."""
    optimizer = torch.optim.Adam(adaptation_parameters(module), lr=0.05)
    losses = []
    for index in range(updates):
        inputs, targets = batches[index % len(batches)]
        if bucket is None:
            losses.append(eager_update(module, optimizer, loss_fn, None, inputs, targets))
        else:
            length = torch.tensor(inputs.shape[-2])
            padded = pad_steps(inputs, bucket), pad_steps(targets, bucket)
            losses.append(eager_update(module, optimizer, loss_fn, None, *padded, length))
    return torch.stack(losses), [parameter.detach().clone() for parameter in adaptation_parameters(module)]


@pytest.mark.parametrize(
    "loss_fn", [causal_mse(), mse(), huber(delta=0.05, warmup_steps=4)], ids=["causal_mse", "mse", "causal_huber"]
)
@pytest.mark.parametrize("batch_size", [1, 3])
def test_padded_and_masked_updates_equal_exact_length_eager_updates(loss_fn, batch_size: int) -> None:
    setup = lite(device=CPU, dtype=torch.float32, seed=5, lengths=[9, 13, 16], batches=3, batch_size=batch_size)
    assert sorted(inputs.shape[-2] for inputs, _ in setup.batches) != [16] * 3
    exact_losses, exact = _updates(copy.deepcopy(setup.module), loss_fn, setup.batches, None, 6)
    padded_losses, padded = _updates(copy.deepcopy(setup.module), loss_fn, setup.batches, 32, 6)
    torch.testing.assert_close(padded_losses, exact_losses, atol=1e-6, rtol=0)
    for a, b in zip(padded, exact, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)  # verify's default tolerance
    initial = adaptation_parameters(setup.module)
    assert max(float((a - s.detach()).abs().max()) for a, s in zip(exact, initial, strict=True)) > 1e-3


def test_padding_without_the_mask_would_change_the_update() -> None:
    """The check above can fail: the padded steps do change an unmasked loss."""
    setup = lite(device=CPU, dtype=torch.float32, seed=5, lengths=[9], batches=1)
    inputs, targets = setup.batches[0]
    loss_fn = causal_mse()
    with torch.no_grad():
        exact = loss_fn(setup.module(inputs), targets)
        padded = loss_fn(setup.module(pad_steps(inputs, 32)), pad_steps(targets, 32))
    assert abs(float(exact - padded)) > 1e-4


@pytest.mark.parametrize("lengths", ["population.lengths=null", "population.lengths=[12,24]"])
def test_a_buckets_rule_it_cannot_read_is_refused_once_for_fixed_and_varying_lengths(make_config, lengths: str) -> None:
    with pytest.raises(ConfigError) as refused:
        plan_experiment(make_config("executor=fused_cudagraph", "executor.buckets=fast", lengths))
    assert str(refused.value).count("executor.buckets='fast' is not pow2half") == 1


def test_the_hint_to_quote_a_string_of_lengths_works_pasted_into_a_shell(make_config) -> None:
    """The shell strips one level of quotes: the hint's override, split as a shell splits it, still
    hands Hydra the quoted string (``population.lengths='64,128,256'`` typed as is was refused again)."""
    from hydra.errors import ConfigCompositionException, OverrideParseException

    from axoexp.config import one_line

    with pytest.raises(ConfigCompositionException) as several:
        make_config("population.lengths=64,128,256")
    (override,) = shlex.split(one_line(several.value).rpartition(": ")[2])  # the hint's last words
    assert parse_lengths(make_config(override).population.lengths) == Lengths((64, 128, 256), 64, 256)
    with pytest.raises(OverrideParseException) as unreadable:
        make_config("population.lengths=[64,128")
    assert shlex.split(one_line(unreadable.value).rpartition(": ")[2]) == ["key='a,b'"]


REFUSED = {  # the commands of this module's CLI tests: a name, the arguments
    "longer than every bucket": ("executor=fused_cudagraph", "executor.buckets=[16]", "population.lengths=[12,24]"),
    "bad lengths value": ("population.lengths=uniform:40",),
}


@pytest.fixture(scope="module")
def refused(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess[str]]:
    """What each of ``REFUSED`` printed, each run in a folder of its own: side by side."""
    folders = {name: tmp_path_factory.mktemp("lengths") for name in REFUSED}
    calls = [
        ((*arguments, f"tracking.uri=sqlite:///{folders[name]}/mlflow.db"), folders[name], None)
        for name, arguments in REFUSED.items()
    ]
    return dict(zip(REFUSED, run_clis(calls), strict=True))


@pytest.mark.slow
def test_cli_refuses_a_length_longer_than_every_bucket_before_any_run(refused) -> None:
    result = refused["longer than every bucket"]
    assert result.returncode == 2, result.stderr
    assert "executor=fused_cudagraph cannot run batches of these lengths: executor.buckets=[16]" in result.stderr
    assert "add a bucket of at least 24 (lengths are never truncated)" in result.stderr
    assert "Traceback" not in result.stderr
    assert "mlflow run" not in result.stdout + result.stderr


@pytest.mark.slow
def test_cli_refuses_a_bad_lengths_value_in_one_line(refused) -> None:
    result = refused["bad lengths value"]
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "axoexp: invalid experiment config: population.lengths='uniform:40' is not null (every batch has the "
        "population's fixed length), a list such as [64,128,256], or uniform:MIN:MAX"
    )


def test_fused_kernel_padded_and_masked_updates_equal_exact_length_eager_updates() -> None:
    """The fused forward (Triton's interpreter without CUDA) on padded batches, masked loss."""
    pytest.importorskip("triton", reason="the fused AxoSim-Lite kernels need Triton")
    from axoexp.executors.fused import FusedLiteForward
    from axoexp.kernels import lite_recurrence

    if not torch.cuda.is_available() and not lite_recurrence.INTERPRETED:
        pytest.skip("triton was imported before TRITON_INTERPRET=1 could be set in this process")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    setup = lite(device=device, dtype=torch.float32, seed=2, lengths=[9, 14], batches=2, batch_size=2)
    exact_losses, exact = _updates(copy.deepcopy(setup.module), causal_mse(), setup.batches, None, 3)
    fused_module = copy.deepcopy(setup.module)
    optimizer = torch.optim.Adam(adaptation_parameters(fused_module), lr=0.05)
    fused, losses = FusedLiteForward(fused_module), []
    for index in range(3):
        inputs, targets = setup.batches[index % 2]
        length = torch.tensor(inputs.shape[-2], device=device)
        padded = pad_steps(inputs, 16), pad_steps(targets, 16)
        losses.append(eager_update(fused, optimizer, causal_mse(), None, *padded, length))
    torch.testing.assert_close(torch.stack(losses), exact_losses, atol=1e-5, rtol=0)
    for a, b in zip(adaptation_parameters(fused_module), exact, strict=True):
        torch.testing.assert_close(a.detach(), b, atol=1e-5, rtol=0)


def test_length_metrics_group_measured_updates_by_bucket() -> None:
    from axoexp.measure import length_groups, length_metrics

    batches = [(torch.zeros(3, steps, 4), torch.zeros(3, steps, 2)) for steps in (10, 30, 60)]
    # updates 2, 3, 4, 5 (after 2 warm-up updates) take batches of 60, 10, 30 and 60 steps
    metrics = length_metrics([4.0, 1.0, 2.0, 6.0], batches, 2, (32, 64))
    assert metrics[names.PADDING_OVERHEAD] == pytest.approx((64 + 32 + 32 + 64) / (60 + 10 + 30 + 60))
    assert metrics[names.bucket_update_metric(32, "median")] == 1.5
    assert metrics[names.bucket_update_metric(64, "median")] == 5.0
    assert metrics[names.bucket_update_metric(64, "count")] == 2
    assert length_groups(batches, 2, 4, (32, 64)) == [64, 32, 32, 64]  # what each update's noise is judged within
    assert length_groups(batches, 2, 3, None) == [60, 10, 30]  # unpadded: each exact length
    assert length_groups(batches[:1], 0, 2, None) is None  # one length: judged across all updates
    unpadded = length_metrics([4.0, 1.0, 2.0], batches, 2, None)
    assert unpadded[names.PADDING_OVERHEAD] == 1.0 and unpadded[names.bucket_update_metric(10, "median")] == 1.0
    assert length_metrics([1.0], batches[:1], 0, None) == {}


@pytest.fixture(scope="module")
def padded_registry(loaded_registry):
    """Built-ins plus ``padded_eager`` (tests/length_plugins): length buckets on the CPU."""
    return registry_with_plugins(LENGTH_PLUGINS)


VARIED = ("population.lengths=[9,13,16,24,30]", "population.batches=6", "population.batch_size=2")


def test_an_executor_asking_cudagraphs_length_refusal_refuses_a_buckets_rule_it_cannot_read(
    make_config, padded_registry
) -> None:
    """``padded_eager`` is no CUDA-graph executor: only its length refusal judges the rule."""
    with pytest.raises(ConfigError, match=r"cannot run batches of these lengths: executor.buckets='fast' is not"):
        plan_experiment(make_config("executor=padded_eager", "executor.buckets=fast", *VARIED), padded_registry)


@pytest.mark.parametrize("lazy", [False, True], ids=["buckets_set_up_in_prepare", "buckets_set_up_on_first_use"])
def test_graphs_captured_after_prepare_are_logged_as_recaptures(make_config, padded_registry, lazy: bool) -> None:
    config = make_config(
        "executor=padded_eager",
        f"executor.lazy={lazy}",
        *VARIED,
        "run.warmup_updates=1",
        "run.measured_updates=12",
        "run.progress=false",
    )
    result = run_experiment(config, registry=padded_registry)
    run = MlflowClient(result.tracking_uri).get_run(result.run_id)
    assert result.buckets is not None and len(result.buckets) > 1, result.buckets
    expected = len(result.buckets) if lazy else 0  # 13 updates cycle through all 6 batches: every bucket
    assert run.data.metrics[names.RECAPTURES] == expected == result.recaptures
    assert run.data.tags[names.LENGTH_BUCKETS] == ",".join(map(str, result.buckets))
    assert result.lengths is not None and result.padding_overhead is not None and result.padding_overhead > 1.0
    line = next(line for line in format_result(result).splitlines() if line.startswith("lengths"))
    assert line.split(maxsplit=1)[1] == (
        f"{result.lengths[0]}..{result.lengths[1]} steps in buckets {run.data.tags[names.LENGTH_BUCKETS]}: "
        f"padding {result.padding_overhead:.2f}x, {expected} recaptures after prepare"
    )


def test_an_executor_that_captures_nothing_logs_no_recaptures_and_exact_lengths(make_config) -> None:
    result = run_experiment(make_config("executor=eager", *VARIED, "run.measured_updates=6", "run.progress=false"))
    run = MlflowClient(result.tracking_uri).get_run(result.run_id)
    assert names.RECAPTURES not in run.data.metrics and result.recaptures is None
    assert run.data.tags[names.LENGTH_BUCKETS] == names.LENGTH_BUCKETS_EXACT
    assert "each batch at its own length (no padding)" in format_result(result)
    low, high = result.lengths or (0, 0)
    shape = f"3x{low}..{high}x4"  # the batches' range of lengths, not the first batch's length
    assert low < high and run.data.tags[names.SHAPE] == shape and f" eager {shape} B=2 cpu" in run.info.run_name
    assert names.shape_size(shape) == 3 * high * 4


def test_a_run_of_several_lengths_judges_its_noise_within_each_length(make_config) -> None:
    """timing.noise, the summary's line and adaptive measuring judge each update against the median of
    its own length's updates (eager: each exact length is a bucket), not against all updates'."""
    from axoexp.statistics import noise_spread, noise_verdict

    config = make_config(
        "executor=eager",
        *VARIED,
        "run.warmup_updates=1",
        "run.measured_updates=12",
        "run.min_time_s=0.001",
        "run.max_time_s=0.5",
        "run.threads=1",
        "run.progress=false",
    )
    result = run_experiment(config)
    client = MlflowClient(result.tracking_uri)
    run = client.get_run(result.run_id)
    series = sorted(client.get_metric_history(result.run_id, names.UPDATE_SERIES), key=lambda metric: metric.step)
    latencies = [metric.value for metric in series[1:]]  # after the one warm-up update
    batches = plan_experiment(config).build_population().batches
    lengths = [int(batches[(1 + index) % len(batches)][0].shape[-2]) for index in range(len(latencies))]
    spread = noise_spread(latencies, lengths)
    assert len(set(lengths)) > 1 and result.update.count == len(latencies)
    assert run.data.metrics[names.NOISE_SPREAD] == pytest.approx(spread) == result.noise_spread
    assert run.data.tags[names.TIMING_NOISE] == noise_verdict(spread)
    judged = "<=" if noise_verdict(spread) == "low" else ">"
    assert f"noise {noise_verdict(spread)} (IQR/median within length buckets {spread:.3f} {judged} 0.5)" in (
        format_result(result)
    )
    assert f"IQR/median within length buckets {spread:.3f}" in run.data.tags[names.TIMING_ADAPTIVE]


@pytest.mark.slow  # a sweep's runs
def test_runs_with_lengths_report_each_bucket_and_plot_latency_against_length(
    make_config, padded_registry, client, tracking_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Real CPU runs of one sweep, eager and a padding executor, through the report's JSON and figure."""
    experiment = client.create_experiment("axoexp")
    parent = client.create_run(experiment, run_name="lengths", tags={names.SWEEP_ROLE: "parent"}).info.run_id
    for executor in ("eager", "padded_eager"):
        overrides = (f"executor={executor}", *VARIED, "run.measured_updates=12", "run.progress=false")
        run_experiment(make_config(*overrides, f"sweep.parent_run_id={parent}"), registry=padded_registry)
    report_main(
        ["--tracking-uri", tracking_uri, "--parent", parent, "--format", "json", "--out", str(tmp_path / "r.png")]
    )
    rows = {row["executor"]: row for row in json.loads(capsys.readouterr().out)}
    padded = client.get_run(rows["padded_eager"]["run_id"])
    buckets = [int(bucket) for bucket in padded.data.tags[names.LENGTH_BUCKETS].split(",")]
    assert [bucket["bucket"] for bucket in rows["padded_eager"]["length_buckets"]] == buckets
    exact = [bucket["bucket"] for bucket in rows["eager"]["length_buckets"]]  # the lengths drawn, each its own
    assert len(exact) > 1 and set(exact) <= {9, 13, 16, 24, 30} and exact == sorted(exact)
    for row in rows.values():
        assert sum(bucket["count"] for bucket in row["length_buckets"]) == 12
        assert all(bucket["p10_ms"] <= bucket["median_ms"] <= bucket["p90_ms"] for bucket in row["length_buckets"])
    assert rows["padded_eager"]["padded"] and rows["padded_eager"]["padding_overhead"] > 1.0
    assert not rows["eager"]["padded"] and rows["eager"]["padding_overhead"] == 1.0
    assert padded.data.metrics[names.RECAPTURES] == 0
    assert (tmp_path / "report_lengths.png").is_file() and (tmp_path / "r.png").is_file()
    first = rows["padded_eager"]["length_buckets"][0]["bucket"]
    rows_again = build_rows([padded])
    assert bucket_span(rows_again[0], 0) == (9, first), "the first bucket holds lengths from the shortest listed"


def test_a_swept_lengths_rule_is_named_as_written_not_as_hydra_escapes_it() -> None:
    from axoexp.describe import short_overrides
    from axoexp.names import job_label, unescaped

    escaped = r"population.lengths=uniform\:16\:40"  # a sweep job's override, as Hydra hands it on
    assert short_overrides([escaped, "loss=mse"]) == ["lengths=uniform:16:40", "mse"]
    assert unescaped(r"population.lengths=uniform\:16\:40,loss=mse") == "population.lengths=uniform:16:40,loss=mse"
    # a job in lines and tags, as Hydra hands its overrides on: unescaped and space-separated (Hydra's
    # override_dirname joined them by commas, which a list's own made ambiguous), less the sweep's own
    job = ["population.lengths=[16,32]", escaped, "~loss.delta=null", "tracking.experiment=a", "sweep.repeat=1"]
    label = "population.lengths=[16,32] population.lengths=uniform:16:40 ~loss.delta=null tracking.experiment=a"
    assert job_label([*job, "sweep.parent_run_id=0af3"]) == label, "a job's repeats share its label"
    assert job_label(["sweep.trial=3", "+sweep.repeats=2"]) == "defaults"
