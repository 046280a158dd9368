"""Populations to adapt and the synthetic targets they adapt to."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import torch
from axosim import AxoSimLite, AxoSimPopulation
from axosim.checkpoint import load_checkpoint
from axosim.support_surrogate import SupportP4Config

from axoexp.errors import CheckpointError, ConfigError, first_line
from axoexp.interfaces import PopulationSetup
from axoexp.lengths import LENGTHS_SYNTAX, Lengths, parse_lengths
from axoexp.registry import AT_LEAST_ONE, NON_NEGATIVE, Bounds, component
from axoexp.stdout import with_article

WARMUP_STEPS = 4
"""AxoSim-Lite forecasts after each 4-step input patch: its first 4 output steps are warm-up zeros,
with no gradient (axosim.support_surrogate fills them before the first forecast)."""


LITE_KIND = "adaptive-support-p4-surrogate"
"""axosim.checkpoint's ``model_kind`` of an AxoSim-Lite model."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def checkpoint_problem(path: str | None, pinned_sha256: str | None) -> str | None:
    """What makes ``population.checkpoint`` unusable that is found without unpickling it (so
    while planning, before any MLflow run): not a file, unreadable, or failing its pin."""
    if path is None:
        return None
    shown = path if len(path) <= 200 else f"{path[:200]}... ({len(path)} characters)"
    try:
        file = Path(path).expanduser()
        if not file.is_file():
            return f"population.checkpoint={shown!r} is not a file"
        if pinned_sha256 is None:
            with file.open("rb") as stream:
                stream.read(1)
            return None
        actual = sha256_of(file)
    except OSError as error:
        return f"population.checkpoint={shown!r} cannot be read: {error.strerror or error}"
    if actual != pinned_sha256.lower():
        return (
            f"population.checkpoint={shown!r} has SHA-256 {actual}, "
            f"but population.checkpoint_sha256 pins {pinned_sha256}"
        )
    return None


def load_lite_checkpoint(path: str, pinned_sha256: str | None) -> tuple[AxoSimLite, str]:
    """Load an AxoSim-Lite checkpoint; return the model and the file's SHA-256.

    A checkpoint is loaded weights-only (``torch.load(weights_only=True)``: tensors and plain
    containers, no code can run), as every axosim checkpoint can be. One that needs arbitrary
    unpickling is refused unless ``checkpoint_sha256`` pins it; the pin is checked before
    anything is unpickled.
    """
    problem = checkpoint_problem(path, pinned_sha256)
    if problem:
        raise CheckpointError(problem)
    file = Path(path).expanduser()
    actual = sha256_of(file)
    try:
        payload = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        if pinned_sha256 is None:
            raise CheckpointError(
                f"population.checkpoint={path!r} is not a weights-only checkpoint: loading it would run "
                f"code stored in the file ({str(error).splitlines()[0][:200]}). If you trust the file, pin it: "
                f"population.checkpoint_sha256={actual}"
            ) from error
        try:
            model, _ = load_checkpoint(file, map_location="cpu")  # pinned: the user vouches for this exact file
        except Exception as pinned_error:
            raise CheckpointError(
                f"population.checkpoint={path!r} is pinned, but loading it as an axosim checkpoint failed: "
                f"{first_line(pinned_error)}"
            ) from pinned_error
    except Exception as error:  # not a torch file at all
        raise CheckpointError(
            f"population.checkpoint={path!r} cannot be read as a checkpoint: {first_line(error)}"
        ) from error
    else:
        model = _lite_from_payload(path, payload)
    if not isinstance(model, AxoSimLite):
        raise CheckpointError(
            f"population.checkpoint={path!r} holds {with_article(type(model).__name__)}, "
            f"not an AxoSim-Lite model ({LITE_KIND})"
        )
    return model, actual


def _lite_from_payload(path: str, payload: Any) -> torch.nn.Module | None:
    """The model of a weights-only axosim checkpoint (``model_kind``, ``config``, ``state_dict``)."""
    if not isinstance(payload, dict) or not {"config", "state_dict"} <= payload.keys():
        raise CheckpointError(
            f"population.checkpoint={path!r} is not an axosim checkpoint "
            "(expected a dict with model_kind, config and state_dict, as axosim.checkpoint.save_checkpoint writes)"
        )
    kind = payload.get("model_kind", payload.get("metadata", {}).get("model_kind"))
    if kind != LITE_KIND:
        raise CheckpointError(
            f"population.checkpoint={path!r} holds model_kind {kind!r}, not an AxoSim-Lite model ({LITE_KIND})"
        )
    try:
        config = SupportP4Config(**payload["config"])
        model = AxoSimLite(config, payload["state_dict"]["route_features"])
        model.load_state_dict(payload["state_dict"])
    except (TypeError, KeyError, RuntimeError) as error:
        raise CheckpointError(f"population.checkpoint={path!r} does not fit AxoSim-Lite: {error}") from error
    return model


OUTPUTS = next(item.default for item in dataclasses.fields(SupportP4Config) if item.name == "output_dim")
"""Outputs per neuron and step of a fresh AxoSim-Lite model (a checkpoint's may differ)."""


def stream_generator(seed: int, stream: str) -> torch.Generator:
    """A generator of its own for one ``stream`` of draws (the held-out batches, the lengths), seeded
    from ``seed`` and the stream's name alone: the same seed draws the same whatever the shape or the
    number of adapted batches, and no stream replays another. Seeded through a hash, as torch's CPU
    generator keeps only a seed's low 32 bits (``seed + 2**32`` replayed ``seed``'s very stream: the
    held-out batches were drawn from the numbers that built the model)."""
    digest = hashlib.sha256(f"{seed}:{stream}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))


HELD_OUT, LENGTHS, HELD_OUT_LENGTHS = "held-out batches", "lengths", "held-out lengths"
"""The streams a population draws from generators of their own (:func:`stream_generator`)."""


BYTES_PER_BATCH = 1536 + 2 * 4096
"""Bookkeeping of one held (inputs, targets) pair beyond its data: two tensors, their storages and
allocations (measured: 1-1.5 KiB at 3x12x4, CPU, float32), and up to a page per buffer that the
allocator rounds to (seen: 2.7 KiB more per batch than the bookkeeping alone at 200x12x4 with
2,000 batches, on CI's machine)."""
BATCH_SLACK = 1.2
"""What the allocator keeps beyond the batches' data while they are generated between the
teacher's temporaries (measured: up to 10 % at 200x12x4; 20 % leaves a margin)."""


def config_problems(params: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """What planning refuses in ``lite``'s settings (``params``, defaults included): no bank to
    train, a ``checkpoint_sha256`` pin without the ``checkpoint`` it pins, a bad ``lengths`` value,
    or a batch that may have no step to adapt on (:func:`too_short_problem`)."""
    problems = []
    if not any(params.get(bank, True) for bank in ("train_behavior", "train_morphology", "train_synaptic")):
        problems.append(
            "population trains no adaptation bank: set at least one of "
            "population.train_behavior, train_morphology, train_synaptic to true"
        )
    if params.get("checkpoint_sha256") is not None and params.get("checkpoint") is None:
        problems.append(
            f"population.checkpoint_sha256={params['checkpoint_sha256']} pins the file of population.checkpoint, "
            "which is not set; set population.checkpoint too, or drop the pin"
        )
    value = params.get("lengths")
    if isinstance(value, int) and not isinstance(value, bool):  # it ran every batch at it, time_steps logged as set
        problems.append(
            f"population.lengths={value}: one length for every batch is population.time_steps={value}; "
            f"population.lengths takes {LENGTHS_SYNTAX}"
        )
        return problems
    try:
        lengths = parse_lengths(value)
    except ValueError as error:
        problems.append(str(error))
        return problems
    return problems + list(filter(None, [too_short_problem(params, lengths, config.get("loss") or {})]))


def too_short_problem(params: Mapping[str, Any], lengths: Lengths | None, loss: Mapping[str, Any]) -> str | None:
    """Why some batch would have no output step that carries a gradient into the loss, else ``None``.

    AxoSim-Lite's outputs 0..3 are warm-up zeros (:data:`WARMUP_STEPS`), so only steps 4.. carry a
    gradient, for every bank and ``batch_size``; the loss leaves out its first ``loss.warmup_steps``
    (0 where it has none). A batch of T steps adapts only if T > max(4, ``loss.warmup_steps``); the
    shortest batch decides: ``time_steps``, or the shortest length ``lengths`` allows (it may be drawn,
    for an adapted batch or a held-out one). Without ``time_steps`` (the factory's own check) only
    ``lengths`` is judged."""
    shortest = params.get("time_steps") if lengths is None else lengths.low
    skipped = loss.get("warmup_steps")
    if not isinstance(skipped, int) or skipped <= WARMUP_STEPS:
        skipped = WARMUP_STEPS
    if not isinstance(shortest, int) or shortest > skipped:
        return None
    if lengths is None:
        subject, may, per = f"population.time_steps={shortest}", "", "an update"
        fix = f"population.time_steps={skipped + 1}"
    else:
        subject, may, per = (
            f"population.lengths={params['lengths']!r}",
            f"a batch may have {shortest} steps, but ",
            "every batch",
        )
        fix = f"lengths of {skipped + 1}"
    if skipped == WARMUP_STEPS:
        reason, lower = f"AxoSim-Lite's first {WARMUP_STEPS} outputs are warm-up, with no gradient to adapt on", ""
    else:
        subject += f" with loss.warmup_steps={skipped}"
        reason = f"loss={loss.get('name')} leaves out the first {skipped} outputs"
        lower = f", or loss.warmup_steps={shortest - 1} or less" if shortest > WARMUP_STEPS else ""
    return f"{subject}: {may}{reason}, so {per} needs more than {skipped} time steps; use {fix} or more{lower}"


def warm_up_batches_problem(name: str, setup: PopulationSetup) -> str | None:
    """Why an ``AxoSimPopulation``'s batches, whoever built them (a plugin's own held-out batches),
    leave the banks nothing to adapt or to show: one of at most :data:`WARMUP_STEPS` time steps,
    whose every output is warm-up (its held-out loss printed ``0 -> 0``); None where none is."""
    if not isinstance(setup.module, AxoSimPopulation):
        return None
    for kind, batches in (("batch", setup.batches), ("held-out batch", setup.eval_batches)):
        for index, (inputs, _) in enumerate(batches):
            if inputs.shape[-2] <= WARMUP_STEPS:
                return (
                    f"population={name} builds {kind} {index} of {inputs.shape[-2]} time steps: AxoSim-Lite's first "
                    f"{WARMUP_STEPS} outputs are warm-up, with no gradient to adapt on, so every batch needs more "
                    f"than {WARMUP_STEPS} time steps"
                )
    return None


def longest_steps(params: Mapping[str, Any]) -> int:
    """The longest batch's time steps: ``time_steps``, or the longest of ``lengths``."""
    lengths = parse_lengths(params.get("lengths"))
    return int(params["time_steps"]) if lengths is None else lengths.high


def memory_estimate(params: dict[str, Any], dtype: torch.dtype) -> int:
    """Bytes the lite workload needs on its device: every batch it holds (the inputs and the
    teacher's targets of the adapted and the held-out batches), and the model's activations and
    gradients during an update, linear in (batch_size x) neurons x time_steps. The update's part was fitted to
    the peak memory of CPU float32 runs (within ~20 % from 2,000 to 100,000 neurons, across the
    model dimensions); tests/test_refuse_early.py checks the whole against measured peak memory over
    batch counts. A checkpoint's own dimensions are not known before loading, so the configured
    ones are used."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    rows = int(params["neurons"]) * int(params.get("batch_size", 1))  # B streams: B x neurons rows
    steps = rows * longest_steps(params)
    batch = steps * (params["contacts"] + OUTPUTS) * itemsize * BATCH_SLACK + BYTES_PER_BATCH
    held = (params["batches"] + params["eval_batches"]) * batch
    update = 64 + 3 * params["contacts"] + 3 * params["token_dim"] + 6 * params["state_dim"] + params["route_features"]
    return int(held + steps * update * itemsize)


def make_lite_model(
    *,
    branches: int,
    route_features: int,
    token_dim: int,
    state_dim: int,
    morphologies: int,
    generator: torch.Generator,
) -> AxoSimLite:
    """A freshly initialised AxoSim-Lite neuron with random routing features."""
    config = SupportP4Config(
        input_dim=branches,
        route_feature_dim=route_features,
        token_dim=token_dim,
        state_dim=state_dim,
        morphology_ids=tuple(f"morphology-{index}" for index in range(morphologies)),
    )
    route = torch.randn(morphologies, branches, route_features, generator=generator)
    return AxoSimLite(config, route / branches**0.5)


@component("population", "lite")
def lite(
    *,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
    neurons: Annotated[int, "population size", AT_LEAST_ONE] = 3,
    time_steps: Annotated[
        int,
        "native 1 ms steps per update: more than 4 (the first 4 outputs are warm-up) and than loss.warmup_steps",
        AT_LEAST_ONE,
    ] = 12,
    contacts: Annotated[int, "retained incoming contacts per neuron", AT_LEAST_ONE] = 4,
    branches: Annotated[int, "model dimension: dendritic branches (ignored with a checkpoint)", AT_LEAST_ONE] = 16,
    route_features: Annotated[int, "model dimension: routing features (ignored with a checkpoint)", AT_LEAST_ONE] = 8,
    token_dim: Annotated[int, "model dimension: token width (ignored with a checkpoint)", AT_LEAST_ONE] = 8,
    state_dim: Annotated[int, "model dimension: recurrent state width (ignored with a checkpoint)", AT_LEAST_ONE] = 4,
    morphologies: Annotated[int, "model dimension: morphologies (ignored with a checkpoint)", AT_LEAST_ONE] = 2,
    train_behavior: Annotated[bool, "adapt the behavior bank"] = True,
    train_morphology: Annotated[bool, "adapt the morphology bank"] = True,
    train_synaptic: Annotated[bool, "adapt the synaptic efficacies"] = True,
    checkpoint: Annotated[str | None, "axosim.checkpoint file to load instead of a fresh model"] = None,
    checkpoint_sha256: Annotated[str | None, "pin: the checkpoint is refused unless its SHA-256 matches"] = None,
    batches: Annotated[int, "distinct (inputs, targets) batches, cycled", AT_LEAST_ONE] = 4,
    lengths: Annotated[
        str | list[int] | None, f"each batch's time steps, drawn once per batch from the seed: {LENGTHS_SYNTAX}"
    ] = None,
    eval_batches: Annotated[
        int, "held-out batches, never adapted on: eval_loss_before and eval_loss_after (0: no evaluation)", NON_NEGATIVE
    ] = 2,
    batch_size: Annotated[
        int, "independent streams per update (B), run through forward_batch; the loss is their mean", AT_LEAST_ONE
    ] = 1,
    input_rate: Annotated[float, "Bernoulli spike probability per step and contact", Bounds(0, 1)] = 0.2,
    target_perturbation: Annotated[
        float, "std of the teacher's perturbation of every adaptation bank", Bounds(0)
    ] = 0.1,
) -> PopulationSetup:
    """An ``AxoSimPopulation`` of AxoSim-Lite neurons and a teacher-generated target stream.

    Contact inputs are Bernoulli(``input_rate``) spikes of shape (neurons, time_steps,
    contacts), or, with ``lengths``, each batch of its own length, drawn from ``seed`` alone
    (:func:`stream_generator`: the same whatever the shape; all of a batch's streams share it;
    docs/lengths.md); with ``batch_size`` B > 1, B independent streams of them, (B, neurons,
    time_steps, contacts), which the population runs through ``forward_batch`` (one set of
    banks for all streams; the update's loss is the mean over streams of each stream's loss).
    Targets are the outputs of a *teacher*: the same population with every
    adaptation bank perturbed by Gaussian noise of std ``target_perturbation``, so the
    targets are reachable by adapting the banks. ``eval_batches`` more batches of the same
    teacher, drawn from a generator of their own, are held out for evaluation (0: none, no
    evaluation). With ``checkpoint`` the model dimensions come from the checkpoint and
    ``branches``..``morphologies`` are ignored.
    """
    problems = config_problems(
        {
            "train_behavior": train_behavior,
            "train_morphology": train_morphology,
            "train_synaptic": train_synaptic,
            "checkpoint": checkpoint,
            "checkpoint_sha256": checkpoint_sha256,
            "lengths": lengths,
        },
        {},
    )
    if problems:
        raise ConfigError(problems[0])
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # AxoSim-Lite initialises its weights from the global generator
    description: dict[str, object] = {}
    if checkpoint is None:
        model = make_lite_model(
            branches=branches,
            route_features=route_features,
            token_dim=token_dim,
            state_dim=state_dim,
            morphologies=morphologies,
            generator=generator,
        )
    else:
        model, digest = load_lite_checkpoint(checkpoint, checkpoint_sha256)
        description["checkpoint_sha256"] = digest
    config = model.config
    module = AxoSimPopulation(
        model,
        morphology_indices=torch.arange(neurons) % len(config.morphology_ids),
        contact_branch_indices=torch.randint(0, config.input_dim, (neurons, contacts), generator=generator),
    )
    module.enable_adaptation_training(behavior=train_behavior, morphology=train_morphology, synaptic=train_synaptic)
    teacher = copy.deepcopy(module)
    with torch.no_grad():
        for parameter in teacher.adaptation_parameters():
            parameter.add_(target_perturbation * torch.randn(parameter.shape, generator=generator))
    module.to(device=device, dtype=dtype)
    teacher.to(device=device, dtype=dtype)
    streams = (batch_size,) if batch_size > 1 else ()  # B = 1: one stream, as forward takes it
    drawn_lengths = parse_lengths(lengths)

    def draw(count: int, generator: torch.Generator, held_out: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
        steps = (
            [time_steps] * count
            if drawn_lengths is None
            else drawn_lengths.draw(count, stream_generator(seed, HELD_OUT_LENGTHS if held_out else LENGTHS))
        )
        drawn = []
        with torch.no_grad():
            for length in steps:
                spikes = torch.rand(*streams, neurons, length, contacts, generator=generator) < input_rate
                inputs = spikes.to(device=device, dtype=dtype)
                drawn.append((inputs, (teacher.forward_batch(inputs) if streams else teacher(inputs)).detach()))
        return drawn

    stream = draw(batches, generator, held_out=False)
    held_out = draw(eval_batches, stream_generator(seed, HELD_OUT), held_out=True)
    description.update(
        branches=config.input_dim,
        route_features=config.route_feature_dim,
        token_dim=config.token_dim,
        state_dim=config.state_dim,
        morphologies=len(config.morphology_ids),
        outputs=config.output_dim,
        trainable_parameters=sum(p.numel() for p in module.trainable_adaptation_parameters()),
    )
    return PopulationSetup(module=module, batches=stream, description=description, eval_batches=held_out)


lite.memory_estimate = memory_estimate  # type: ignore[attr-defined]
lite.config_problems = config_problems  # type: ignore[attr-defined]
