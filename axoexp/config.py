"""The one config schema: structured configs in Hydra's ConfigStore, and their descriptions.

The top level (``device``, ``run``, ``verify``, ...) is :class:`ExperimentConfig`; each group
option's node is a dataclass made from its factory's signature (:mod:`axoexp.registry`),
so Hydra type-checks every override at compose time and ``--describe`` explains every key
from the same source. ``conf/config.yaml`` holds only the defaults list and Hydra settings.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from axoexp import names
from axoexp.registry import (
    AT_LEAST_ONE,
    GROUPS,
    NON_NEGATIVE,
    POSITIVE,
    Bounds,
    Component,
    Registry,
    literal_choices,
)

SCHEMA_NAME = "axoexp_schema"
MATMUL_PRECISIONS = ("highest", "high", "medium")  # torch.set_float32_matmul_precision's
SEED_BOUNDS = Bounds(-(2**63), 2**63 - 1)  # signed 64 bits: what torch's generators take
HELP_NAME = "axoexp_help"


def setting(default: Any, help: str, bounds: Bounds | None = None, shown_type: Any = None) -> Any:
    """A config key with its default, one line of help and, for a number, its allowed range;
    ``shown_type``: the type ``--help`` shows where the key's config type is ``Any`` (a value of
    several kinds, e.g. ``str | list[int]``, which OmegaConf cannot check)."""
    metadata = {"help": help, "bounds": bounds, "type": shown_type}
    if dataclasses.is_dataclass(default) and isinstance(default, type):
        return field(default_factory=default, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class RunConfig:
    warmup_updates: int = setting(
        5, "updates timed and logged before the measured ones, not in the summary", NON_NEGATIVE
    )
    measured_updates: int = setting(50, "updates in the steady-state summary (median, p10, p90, ...)", AT_LEAST_ONE)
    threads: int | None = setting(
        None,
        "torch intra-op threads; null: on the CPU the fewest of 1, 2, 4, ... (at most 16) within 1.05x of the "
        "fastest, calibrated after warm-up (1 where run.measured_updates is fewer than the calibration's updates); "
        "on a GPU one per CPU allowed, at most 16 (logged resolved)",
        AT_LEAST_ONE,
    )
    min_time_s: float = setting(
        0.0,
        "measure past measured_updates until the measured updates add up to this "
        "many seconds and IQR/median <= 0.1 (within length buckets where population.lengths varies them); 0: off",
        NON_NEGATIVE,
    )
    max_time_s: float = setting(
        60.0, "with min_time_s: stop measuring after this many seconds, stable or not", POSITIVE
    )
    require_quiet: bool = setting(
        False, "end the run FAILED (keeping what it measured) when timing.contention is not none"
    )
    lease_timeout_s: float = setting(
        600.0,
        "seconds a job waits for its device lease (GPU or CPU set) before "
        "failing; 0: fail at once if another job holds it",
        NON_NEGATIVE,
    )
    lease_cpus: int | None = setting(
        None, "CPUs a job leases and is pinned to; null: all it may use on device=cpu, none on cuda", AT_LEAST_ONE
    )
    progress: bool = setting(True, "live progress on stderr when it is a terminal, redrawn only between timed updates")


@dataclass
class VerifyConfig:
    enabled: bool = setting(False, "compare K executor updates with K eager ones from one initial state")
    updates: int = setting(5, "K, the number of compared updates", AT_LEAST_ONE)
    loss_atol: float = setting(1e-5, "largest allowed |loss difference| to eager", NON_NEGATIVE)
    param_atol: float = setting(1e-5, "largest allowed |parameter difference| to eager", NON_NEGATIVE)


@dataclass
class DeterminismConfig:
    deterministic_algorithms: bool = setting(False, "torch.use_deterministic_algorithms")
    cudnn_benchmark: bool = setting(False, "torch.backends.cudnn.benchmark")
    float32_matmul_precision: str = setting(
        "highest", "torch.set_float32_matmul_precision (TF32 changes parity)", shown_type=Literal[MATMUL_PRECISIONS]
    )


@dataclass
class TrackingConfig:
    uri: str | None = setting(None, "MLflow store; null: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the cwd")
    experiment: str = setting("axoexp", "MLflow experiment name")
    run_name: str | None = setting(
        None, "null: the job's overrides in a sweep, else executor, shape, loss, optimizer, device"
    )
    http_max_retries: int = setting(
        names.HTTP_MAX_RETRIES,
        "HTTP retries to a tracking server (bounded, so a dead one fails in seconds)",
        NON_NEGATIVE,
    )
    http_timeout_s: int = setting(names.HTTP_TIMEOUT_S, "seconds per HTTP request to a tracking server", AT_LEAST_ONE)
    http_backoff_factor: int = setting(
        names.HTTP_BACKOFF_FACTOR, "seconds between HTTP retries, doubling per retry", NON_NEGATIVE
    )


@dataclass
class SweepConfig:
    resume: str = setting(
        "same_sweep",
        "in a multirun, reuse a FINISHED, quietly measured run of the job's resolved config from an "
        "earlier sweep with the same overrides (same_sweep), from any run (any), or "
        "never (false)",
    )
    resume_contended: bool = setting(
        False,
        "resume also reuses runs measured under contention, with high noise or without their load recorded "
        "(default: it measures again)",
    )
    parent_run_id: str | None = setting(None, "set by the sweep itself: the MLflow parent run of its jobs")
    repeats: int = setting(
        1, "in a multirun, run each job this many times as separate child runs (the report pools them)", AT_LEAST_ONE
    )
    repeat: int = setting(0, "set by the sweep itself: which of the sweep.repeats runs this job is", NON_NEGATIVE)
    trial: int | None = setting(None, "set by hydra/sweeper=optuna: the Optuna trial number of this job")


@dataclass
class ExperimentConfig:
    population: Any = setting(None, "what adapts, and the workload it adapts to")
    loss: Any = setting(None, "loss between prediction and targets")
    optimizer: Any = setting(None, "optimizer over the trainable adaptation banks")
    gradient_transform: Any = setting(None, "applied between backward and the optimizer step")
    executor: Any = setting(None, "how one update runs (eager, captured, compiled)")
    device: str = setting("cpu", "cpu | cuda | cuda:N")
    dtype: str = setting("float32", "float32 | float64 | bfloat16 (float16 is refused: its optimizer state underflows)")
    seed: int = setting(
        0, "seeds the model, the routing, the inputs and the teacher's targets (a signed 64-bit integer)", SEED_BOUNDS
    )
    run: RunConfig = setting(RunConfig, "what is timed")
    verify: VerifyConfig = setting(VerifyConfig, "parity with eager")
    determinism: DeterminismConfig = setting(DeterminismConfig, "global torch settings, applied first")
    tracking: TrackingConfig = setting(TrackingConfig, "where results go")
    sweep: SweepConfig = setting(SweepConfig, "multirun bookkeeping")


CONFIG_SCALARS = (int, float, bool, str)
OBJECTIVES = "hydra.sweeper.objectives"
"""The Optuna sweeper's objectives: metric names, each with its direction (axoexp.search)."""
HIDDEN_KEYS = ("hydra", "name")  # Hydra's own node; a component's name is chosen as group=name


def did_you_mean(typed: str, choices: Iterable[str]) -> str:
    """`` (did you mean lr?)``, naming the choice closest to ``typed``; empty where none is close."""
    close = difflib.get_close_matches(typed, list(choices), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def no_such_key(key: str, section: str, keys: Sequence[str], where: str = "") -> str:
    """One line for a key the config lacks, e.g. ``run.warmup: no such key in run (did you mean
    warmup_updates?); its keys: ...`` (``section`` empty: a top-level key; ``where`` names the
    section's component, e.g. ``optimizer=adam``)."""
    guess = did_you_mean(key, keys)
    if not section:
        return f"{key}: no such key{guess}; top-level keys: {', '.join(keys)}"
    settings = f"its keys: {', '.join(keys)}" if keys else "it takes no settings"
    return f"{section}.{key}: no such key in {where or section}{guess}; {settings}"


def unchosen_group(arguments: Sequence[str], registry: Registry) -> str | None:
    """One line for a component group that an override leaves without an option (``loss=null``,
    ``-m loss=mse,null``, ``~loss``), which Hydra fails on with a traceback, or composes into no
    node; ``None`` where no override does."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    for argument in arguments:
        group = argument.lstrip("+~").partition("=")[0]
        if group not in GROUPS or argument.startswith("-"):
            continue
        try:
            (override,) = OverridesParser.create().parse_overrides([argument])
        except OverrideParseException:
            continue  # Hydra reports it
        value = override.value()
        if override.is_delete() or value is None or None in getattr(value, "list", ()):
            return (
                f"{argument}: every run needs a {group} option; valid {group} options: "
                f"{', '.join(sorted(registry.names(group)))}"
            )
    return None


def one_line(error: BaseException) -> str:
    """A Hydra or OmegaConf composition error as one line: key, value and what is expected."""
    from hydra.errors import MissingConfigException, OverrideParseException  # loaded wherever Hydra raised it

    if isinstance(error, MissingConfigException) and error.missing_cfg_file and error.options is not None:
        group, _, option = error.missing_cfg_file.rpartition("/")
        return (
            f"{group}={option}: no such option{did_you_mean(option, error.options)}; "
            f"valid {group} options: {', '.join(sorted(error.options))}"
        )
    if isinstance(error, OverrideParseException):  # Hydra's grammar: "no viable alternative at input '[64,128'"
        return (
            f"{error.override}: not an override Hydra can read ({str(error).strip().splitlines()[0]}); write "
            "key=value, a list as key=[a,b], a string with , [ ] = or spaces quoted inside the shell's quotes: "
            "\"key='a,b'\""
        )
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    not_in_defaults = re.search(r"defaults list\.\nTo append to your default list use \+(\S+)", str(error))
    if not_in_defaults:  # a group the config does not choose by default: experiment=eager_cpu
        override = not_in_defaults.group(1)
        group = override.partition("=")[0]
        return f"{override}: the config chooses no {group} by default, so none can be overridden; add one: +{override}"
    appended = re.fullmatch(r"Could not append to config\. An item is already at '(.*)'\.", first)
    if appended:  # Hydra's hints follow on lines of their own
        key = appended.group(1)
        return f"+{key}: the config has {key} already; drop the + to set it (a + adds a key the config lacks)"
    cause = error.__cause__
    unknown = _unknown_key(cause) if isinstance(cause, OmegaConfBaseException) else None
    if unknown:
        return unknown
    text = str(error).strip().splitlines()[0].removeprefix("Error merging override ")
    ambiguous = re.fullmatch(r"Ambiguous value for argument '(.*)'", text)
    if ambiguous:  # Hydra's hints follow on lines of their own
        override = ambiguous.group(1)
        key, _, values = override.partition("=")
        return (
            f"{override}: several values outside a sweep; to sweep over them add -m (--multirun), "
            f"for a list write {key}=[{values}], for a string quote it inside the shell's quotes: \"{key}='{values}'\""
        )
    if isinstance(cause, OmegaConfBaseException):
        detail = (getattr(cause, "msg", None) or str(cause)).strip().splitlines()[0]
        return f"{text}: {detail}"
    if isinstance(error, OmegaConfBaseException):
        key = getattr(error, "full_key", None)
        return f"{key}: {text}" if key else text
    return text


def _unknown_key(error: OmegaConfBaseException) -> str | None:
    """An override of a key the config lacks, e.g. ``optimizer.lrr: no such key in optimizer=adam
    (did you mean lr?); its keys: ...``; ``None`` for any other error."""
    parent, key = getattr(error, "parent_node", None), getattr(error, "key", None)
    if not isinstance(parent, DictConfig) or not isinstance(key, str) or key in parent:
        return None
    keys = [str(name) for name in parent if name not in HIDDEN_KEYS]
    section = str(getattr(error, "full_key", None) or key).rpartition(".")[0]
    if section == OBJECTIVES:  # a map the user fills: its keys are not the only ones allowed
        return (
            f"{section}.{key}: not an objective of this search yet (it has {', '.join(keys)}); add one with "
            f"+{section}.{key}=minimize (or maximize), and drop one with ~{section}.NAME"
        )
    return no_such_key(key, section, keys, f"{section}={parent['name']}" if "name" in parent else "")


def added_keys(config: DictConfig, cls: type = ExperimentConfig, section: str = "") -> list[str]:
    """Keys that a ``+key=value`` override added outside the components (Hydra's ``+`` adds any key,
    and nothing would read it), one line each; a component's own keys are its factory's to judge."""
    hints = typing.get_type_hints(cls)
    keys = [item.name for item in dataclasses.fields(cls)]
    problems = [no_such_key(str(key), section, keys) for key in config if key not in keys and key != "hydra"]
    for name in keys:
        if dataclasses.is_dataclass(hints[name]) and isinstance(config.get(name), DictConfig):
            problems += added_keys(config[name], hints[name], f"{section}.{name}".lstrip("."))
    return problems


def _leaf_settings(cls: type = ExperimentConfig, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field[Any]]]:
    """Each top-level setting that is no section of settings, by its dotted key."""
    hints = typing.get_type_hints(cls)
    for item in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[item.name]):
            yield from _leaf_settings(hints[item.name], f"{prefix}{item.name}.")
        else:
            yield f"{prefix}{item.name}", item


def bounded_keys() -> dict[str, Bounds]:
    """Dotted top-level keys that declare an allowed range, with that range."""
    return {key: item.metadata["bounds"] for key, item in _leaf_settings() if item.metadata.get("bounds") is not None}


def choice_keys() -> dict[str, tuple[Any, ...]]:
    """Dotted top-level keys whose ``--help`` type is a ``Literal``, with its choices."""
    choices = {key: literal_choices(item.metadata.get("type")) for key, item in _leaf_settings()}
    return {key: allowed for key, allowed in choices.items() if allowed is not None}


def _config_type(annotation: Any, default: Any) -> Any:
    """The OmegaConf type for a factory annotation: a scalar, Optional scalar, else Any."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(members) == 1 and members[0] in CONFIG_SCALARS:
            return members[0] | None
        return Any
    if annotation in CONFIG_SCALARS:
        return annotation | None if default is None else annotation
    return Any


def node_class(entry: Component) -> type:
    """A dataclass for a component's config node: ``name``, group settings, factory parameters."""
    fields: list[tuple[str, Any, Any]] = [("name", str, setting(entry.name, f"the {entry.group} option"))]
    for key, framework_setting in entry.spec.settings.items():
        fields.append(
            (key, Any, setting(framework_setting.default, framework_setting.help, shown_type=framework_setting.kind))
        )
    for parameter in entry.documented_parameters():
        default = parameter.default if parameter.name in entry.defaults() else "???"
        kind = _config_type(parameter.annotation, default)
        shown = parameter.annotation if kind is Any else None
        fields.append((parameter.name, kind, setting(default, parameter.help, parameter.bounds, shown)))
    return dataclasses.make_dataclass(f"{entry.group}_{entry.name}", fields)


def first_sentence(docstring: str) -> str:
    """A docstring's first sentence, whole even where it wraps over lines: one line of help."""
    paragraph = " ".join(docstring.strip().split("\n\n")[0].split())
    end = re.search(r"\.(\s|$)", paragraph)
    return paragraph[: end.start() + 1] if end else paragraph


def register_configs(registry: Registry) -> None:
    """Store the schema, every component's node and the help page in Hydra's ConfigStore."""
    from hydra.core.config_store import ConfigStore

    from axoexp.lease import register_resolvers

    register_resolvers()  # used by the launcher presets, conf/hydra/launcher/*.yaml
    store = ConfigStore.instance()
    store.store(name=SCHEMA_NAME, node=ExperimentConfig)
    for entry in registry.components():
        store.store(group=entry.group, name=entry.name, node=node_class(entry))
    store.store(group="hydra/help", name=HELP_NAME, node=help_node(registry))


def _type_name(annotation: Any) -> str:
    if annotation is Any:
        return "any"
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return "|".join(_type_name(arg) for arg in typing.get_args(annotation))
    if origin is typing.Literal:
        return "|".join(map(_show, typing.get_args(annotation)))
    if origin is not None:  # list[int]
        return f"{getattr(origin, '__name__', origin)}[{','.join(map(_type_name, typing.get_args(annotation)))}]"
    return "null" if annotation is type(None) else getattr(annotation, "__name__", str(annotation))


def _rows(cls: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    rows = []
    hints = typing.get_type_hints(cls)
    for item in dataclasses.fields(cls):
        key, annotation = f"{prefix}{item.name}", hints[item.name]
        if dataclasses.is_dataclass(annotation):
            rows += _rows(typing.cast(type, annotation), f"{key}.")
        elif item.name not in GROUPS:
            default = item.default if item.default is not dataclasses.MISSING else "???"
            shown = item.metadata.get("type") or annotation
            rows.append((key, _type_name(shown), _show(default), item.metadata.get("help", "")))
    return rows


def _show(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def describe(registry: Registry) -> str:
    """Every key: type, default and one line, for the top level and each group option."""
    lines = ["Top-level keys (key=value):"]
    lines += _table(_rows(ExperimentConfig))
    for group, spec in GROUPS.items():
        lines.append("")
        lines.append(f"{group} (choose with {group}=NAME; {spec.contract}):")
        for entry in sorted((e for e in registry.components() if e.group == group), key=lambda e: e.name):
            origin = "" if entry.source == "builtin" else f"  [from {entry.source}]"
            lines.append(f"  {entry.name}{origin}: {first_sentence(entry.factory.__doc__ or '')}")
            lines += _table(
                [
                    (f"{group}.{key}", kind, default, text)
                    for key, kind, default, text in _rows(node_class(entry))
                    if key != "name"
                ],
                indent="    ",
            )
    return "\n".join(lines)


def _table(rows: list[tuple[str, str, str, str]], indent: str = "  ") -> list[str]:
    if not rows:
        return [f"{indent}(no parameters)"]
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    return [
        f"{indent}{key:<{widths[0]}}  {kind:<{widths[1]}}  {default:<{widths[2]}}  {text}".rstrip()
        for key, kind, default, text in rows
    ]


HELP_TEMPLATE = """${hydra.help.header}

== Groups (group=option) ==
$APP_CONFIG_GROUPS

== Keys: type, default, what it does ==
$DESCRIPTION

python -m axoexp --cfg job prints the composed config.

${hydra.help.footer}
"""


def presets_dir() -> Path:
    """Where the named experiment presets are: ``conf/experiment`` of the checkout or the installed package."""
    return Path(str(resources.files("axoexp.conf") / "experiment")).resolve()


def help_node(registry: Registry) -> dict[str, str]:
    """Hydra's help page, with every key described (``$`` escaped for Hydra's template)."""
    description = describe(registry).replace("$", "$$")
    return {
        "app_name": "axoexp",
        "header": "axoexp: time and verify fixed-shape adaptation updates of AxoSim populations.\n"
        "Usage: python -m axoexp [group=option ...] [key=value ...]   (-m for a sweep)",
        "footer": "Examples:\n"
        "  python -m axoexp executor=cudagraph device=cuda loss=causal_mse verify.enabled=true\n"
        "  python -m axoexp -m population.batch_size=1,8 executor=eager,cudagraph device=cuda\n"
        "Presets: python -m axoexp +experiment=NAME (group experiment above) sets the keys of a\n"
        f"published run; their files: {presets_dir()}/NAME.yaml.\n"
        "Plugins: *.py files in $$AXOEXP_PLUGINS_DIR (default ./plugins) and the\n"
        "'axoexp.plugins' entry-point group add options to these groups.",
        "template": HELP_TEMPLATE.replace("$DESCRIPTION", description),
    }
