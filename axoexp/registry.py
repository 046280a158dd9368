"""The component registry: every component is found by (group, name), never by import path.

:data:`GROUPS` is the one table of what each group's factory must be and which arguments
the framework supplies to it; a factory that breaks its group's rules is refused when it
is registered, naming where it came from. A factory's other keyword parameters are its
config: their defaults, annotations (``Annotated[float, "one line of help"]``) and help
become the group option's structured Hydra config (:mod:`axoexp.config`). Each parameter's
annotation is read on its own (:func:`parameter_annotation`): one that cannot be resolved costs
only that parameter its type, never the others theirs.
Discovery of built-ins and plugins is :mod:`axoexp.plugins`.
"""

from __future__ import annotations

import builtins
import inspect
import math
import sys
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from axoexp.errors import RegistryError, first_line
from axoexp.interfaces import Executor

BUILTIN = "builtin"
INIT_FROM = "init_from"  # population.init_from: the framework loads another run's adapted banks
INIT_FROM_SHA256 = "init_from_sha256"
CONFIG_VALUE_TYPES = (type(None), bool, int, float, str)
"""What a parameter's default may be: a value a YAML config can hold."""


@dataclass(frozen=True)
class Bounds:
    """A numeric parameter's allowed range, declared in its annotation:
    ``Annotated[int, "population size", Bounds(low=1)]``. Checked while planning."""

    low: float | None = None
    high: float | None = None
    low_inclusive: bool = True
    high_inclusive: bool = True
    infinite: bool = False
    """Whether infinity is a value (a p-norm's p), within the range; NaN never is."""

    def __post_init__(self) -> None:
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"Bounds(low={self.low}, high={self.high}) holds no value: low is above high")

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value`` (``None`` when it lies in range or is not a number)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        if math.isnan(value) or (math.isinf(value) and not self.infinite):
            return f"must be a finite number, not {value}"
        too_low = self.low is not None and (value < self.low or (value == self.low and not self.low_inclusive))
        too_high = self.high is not None and (value > self.high or (value == self.high and not self.high_inclusive))
        if not (too_low or too_high):
            return None
        if self.low is not None and self.high is not None:
            opening, closing = "[" if self.low_inclusive else "(", "]" if self.high_inclusive else ")"
            return f"must lie in {opening}{_number(self.low)}, {_number(self.high)}{closing}"
        if self.low is not None:
            return f"must be {'at least' if self.low_inclusive else 'greater than'} {_number(self.low)}"
        return f"must be {'at most' if self.high_inclusive else 'less than'} {_number(cast(float, self.high))}"


def literal_choices(annotation: Any) -> tuple[Any, ...] | None:
    """The values a ``Literal[...]`` annotation (or an optional one) allows; ``None`` for any other."""
    members = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ()
    literals = [member for member in members or (annotation,) if member is not type(None)]
    if not all(typing.get_origin(member) is Literal for member in literals):
        return None
    optional = (None,) if type(None) in members else ()
    return tuple(choice for member in literals for choice in typing.get_args(member)) + optional


def _number(bound: float) -> str:
    """A bound as a message shows it: an integer whole (a seed's 2**63 - 1), else ``%g``."""
    return str(bound) if isinstance(bound, int) else f"{bound:g}"


AT_LEAST_ONE = Bounds(low=1)
NON_NEGATIVE = Bounds(low=0)
POSITIVE = Bounds(low=0, low_inclusive=False)


@dataclass(frozen=True)
class Setting:
    """A key of a group's config node that the framework reads itself (not a factory argument)."""

    default: Any
    help: str
    kind: Any
    """What values it takes, as ``--help`` shows them (the config node holds any value; planning checks it)."""


@dataclass(frozen=True)
class GroupSpec:
    """What a group's factory must be and what the framework passes it."""

    name: str
    context: tuple[str, ...]
    contract: str
    settings: Mapping[str, Setting] = field(default_factory=dict)
    executor_class: bool = False

    def problems(self, factory: Callable[..., Any]) -> list[str]:
        """Why ``factory`` cannot serve this group (empty when it can)."""
        if self.executor_class and not (inspect.isclass(factory) and issubclass(factory, Executor)):
            return [f"must be {self.contract}, got {factory!r}"]
        if not callable(factory):
            return [f"must be {self.contract}, got {factory!r}"]
        try:
            signature = inspect.signature(factory)
        except (TypeError, ValueError) as error:
            return [f"has no inspectable signature ({error})"]
        accepted = signature.parameters
        itself = self._the_function_itself(factory, accepted)
        if itself:
            return [itself]
        takes_any = any(p.kind is p.VAR_KEYWORD for p in accepted.values())
        problems = [
            f"must accept the framework's argument {name!r} ({self.contract})"
            for name in self.context
            if name not in accepted and not takes_any
        ]
        for name, parameter in accepted.items():
            if name in self.context or parameter.kind in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
                continue
            if parameter.kind is parameter.POSITIONAL_ONLY:
                problems.append(f"parameter {name!r} is positional-only; config parameters are keywords")
            elif name in self.settings:
                problems.append(f"parameter {name!r} clashes with the framework setting {self.name}.{name}")
            elif parameter.default is not parameter.empty and not isinstance(parameter.default, CONFIG_VALUE_TYPES):
                problems.append(
                    f"parameter {name!r} has default {parameter.default!r}, which a config cannot "
                    "hold (use None, a bool, int, float or str)"
                )
        return problems

    def _the_function_itself(
        self, factory: Callable[..., Any], accepted: Mapping[str, inspect.Parameter]
    ) -> str | None:
        """Why ``factory`` looks like the component itself rather than a factory of it: its config
        parameters are all positional and none has a default (``def loss(prediction, target)``).
        A value a config must set is a keyword-only parameter: ``def factory(*, weight: float)``."""
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        own = [p for name, p in accepted.items() if name not in self.context and p.kind in positional]
        if not own or any(p.kind is p.KEYWORD_ONLY for p in accepted.values()):
            return None
        if any(p.default is not p.empty for p in own):
            return None
        name = getattr(factory, "__name__", "factory")
        arguments = ", ".join(p.name for p in own)
        context = "".join(f"{argument}, " for argument in self.context)
        return (
            f"{name}({arguments}) looks like the {self.name} itself, not a factory of it (no parameter has a "
            f"default); register a factory that returns it: def {name}({context}scale: float = 1.0): "
            f"return lambda {arguments}: ... (a value the config must set is keyword-only: "
            f"def {name}({context}*, weight: float))"
        )


GROUPS: dict[str, GroupSpec] = {
    spec.name: spec
    for spec in (
        GroupSpec(
            "population",
            ("device", "dtype", "seed"),
            "a callable returning axoexp.interfaces.PopulationSetup",
            settings={
                INIT_FROM: Setting(
                    None,
                    "start from the adapted banks of this MLflow run id or banks file (docs/banks.md)",
                    str | None,
                ),
                INIT_FROM_SHA256: Setting(
                    None, "pin: init_from is refused unless its banks file has this SHA-256", str | None
                ),
            },
        ),
        GroupSpec("loss", (), "a callable returning loss_fn(prediction, target) -> scalar tensor"),
        GroupSpec(
            "optimizer",
            ("parameters", "capturable"),
            "a callable returning a torch.optim.Optimizer",
            settings={
                "capturable": Setting(
                    "auto",
                    "auto: true exactly when the executor captures the optimizer step; or true/false",
                    Literal["auto"] | bool,
                )
            },
        ),
        GroupSpec(
            "gradient_transform",
            ("parameters",),
            "a callable returning a no-argument, graph-safe transform of the gradients, or None",
        ),
        GroupSpec(
            "executor",
            ("module", "optimizer", "loss_fn", "gradient_transform"),
            f"a subclass of {Executor.__module__}.{Executor.__qualname__}",
            executor_class=True,
        ),
    )
}


class _Unresolved:
    """What a name in an annotation stands for where the factory's module does not define it (e.g. a
    type imported only under ``TYPE_CHECKING``): the parameter is then untyped, its help and bounds kept."""

    def __getattr__(self, name: str) -> _Unresolved:
        if name.startswith("__"):  # typing probes dunders (__origin__, __args__): it is none of them
            raise AttributeError(name)
        return self

    def __getitem__(self, item: object) -> _Unresolved:
        return self

    def __call__(self, *args: object, **kwargs: object) -> _Unresolved:
        return self

    def __or__(self, other: object) -> _Unresolved:
        return self

    __ror__ = __or__

    def __repr__(self) -> str:
        return "<unresolved>"


UNRESOLVED = _Unresolved()


class _Lenient(Mapping[str, Any]):
    """Local names for evaluating an annotation: :data:`UNRESOLVED` for each name that neither the
    module's globals nor the builtins define (those are looked up there, as Python would)."""

    def __init__(self, module_globals: Mapping[str, Any]) -> None:
        self._globals = module_globals

    def __getitem__(self, key: str) -> Any:
        if key in self._globals or hasattr(builtins, key):
            raise KeyError(key)
        return UNRESOLVED

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


@dataclass(frozen=True)
class Unreadable:
    """An annotation that fails to evaluate for another reason than a missing name."""

    reason: str


def factory_globals(factory: Callable[..., Any]) -> dict[str, Any]:
    """The globals a factory's annotations are written in: its (or its class's ``__init__``'s) module's."""
    target = inspect.unwrap(factory.__init__ if inspect.isclass(factory) else factory)
    found = getattr(target, "__globals__", None)
    if isinstance(found, dict):
        return found
    module = sys.modules.get(getattr(factory, "__module__", "") or "")
    return vars(module) if module is not None else {}


def parameter_annotation(parameter: inspect.Parameter, namespace: dict[str, Any]) -> Any:
    """``parameter``'s annotation evaluated in ``namespace`` (the factory's module globals), on its
    own: a name the module lacks becomes :data:`UNRESOLVED` (the annotation keeps its help and
    bounds), any other failure an :class:`Unreadable`; no annotation is ``Any``."""
    if parameter.annotation is inspect.Parameter.empty:
        return Any
    holder = types.SimpleNamespace(__annotations__={parameter.name: parameter.annotation})
    try:
        hints = typing.get_type_hints(holder, globalns=namespace, localns=_Lenient(namespace), include_extras=True)
    except Exception as error:  # a plugin's annotation may raise anything; it costs only this parameter its type
        return Unreadable(first_line(error))
    return hints[parameter.name]


def _mentions_unresolved(annotation: Any) -> bool:
    return annotation is UNRESOLVED or any(_mentions_unresolved(arg) for arg in typing.get_args(annotation))


@dataclass(frozen=True)
class ParameterDoc:
    """One config parameter of a component, for the structured config and ``--describe``."""

    name: str
    annotation: Any
    default: Any
    help: str
    bounds: Bounds | None = None


@dataclass(frozen=True)
class Component:
    """A registered factory and where it came from."""

    group: str
    name: str
    factory: Callable[..., Any]
    source: str

    @property
    def spec(self) -> GroupSpec:
        return GROUPS[self.group]

    def parameters(self) -> dict[str, inspect.Parameter]:
        """Keyword parameters a config may set (the framework's context arguments excluded)."""
        return {
            name: parameter
            for name, parameter in inspect.signature(self.factory).parameters.items()
            if name not in self.spec.context
            and parameter.kind in (parameter.KEYWORD_ONLY, parameter.POSITIONAL_OR_KEYWORD)
        }

    def defaults(self) -> dict[str, Any]:
        """The factory's keyword defaults: the component's config."""
        return {
            name: parameter.default
            for name, parameter in self.parameters().items()
            if parameter.default is not inspect.Parameter.empty
        }

    def documented_parameters(self) -> list[ParameterDoc]:
        """Each config parameter with its type, default, help line and bounds, each read from its own
        annotation (:func:`parameter_annotation`)."""
        namespace = factory_globals(self.factory)
        documented = []
        for name, parameter in self.parameters().items():
            annotation, extras = parameter_annotation(parameter, namespace), []
            if typing.get_origin(annotation) is typing.Annotated:
                annotation, *extras = typing.get_args(annotation)
            if isinstance(annotation, Unreadable):
                extras = [f"(its annotation cannot be read: {annotation.reason})"]
            if isinstance(annotation, Unreadable) or _mentions_unresolved(annotation):
                annotation = Any
            default = parameter.default if parameter.default is not inspect.Parameter.empty else None
            documented.append(
                ParameterDoc(
                    name,
                    annotation,
                    default,
                    help=next((extra for extra in extras if isinstance(extra, str)), ""),
                    bounds=next((extra for extra in extras if isinstance(extra, Bounds)), None),
                )
            )
        return documented

    def value_problems(self, params: Mapping[str, Any]) -> list[str]:
        """Out-of-range parameter values, each naming key, value and what is expected."""
        problems = []
        for parameter in self.documented_parameters():
            if parameter.name not in params:
                continue
            value, choices = params[parameter.name], literal_choices(parameter.annotation)
            problem = parameter.bounds and parameter.bounds.problem(value)
            if choices is not None and value not in choices:
                problem = f"must be one of {', '.join('null' if choice is None else str(choice) for choice in choices)}"
            if problem:
                problems.append(f"{self.group}.{parameter.name}={value!r}: {problem}")
        return problems

    def check_params(self, params: Mapping[str, Any]) -> None:
        """Raise :class:`RegistryError` for config keys the factory does not accept."""
        accepted = self.parameters()
        unknown = sorted(set(params) - set(accepted))
        if unknown:
            raise RegistryError(
                f"{self.group}={self.name} does not accept {', '.join(map(repr, unknown))}; "
                f"its parameters are: {', '.join(sorted(accepted)) or '(none)'}"
            )
        missing = sorted(
            name
            for name, parameter in accepted.items()
            if parameter.default is inspect.Parameter.empty and params.get(name) is None
        )
        if missing:
            raise RegistryError(f"{self.group}={self.name} needs {', '.join(missing)}")

    def build(self, params: Mapping[str, Any], **context: Any) -> Any:
        """Check ``params`` and call the factory with them and the framework's context."""
        self.check_params(params)
        return self.factory(**context, **params)


@dataclass
class Registry:
    """Components by group and name."""

    _components: dict[str, dict[str, Component]] = field(default_factory=lambda: {group: {} for group in GROUPS})

    def register(self, group: str, name: str, factory: Callable[..., Any], *, source: str) -> None:
        """Add a component; a broken factory, an unknown group or a name already taken is an error
        naming the source."""
        try:
            entries = self._group(group)
        except RegistryError as error:
            raise RegistryError(f"{group}={name} from {source}: {error}") from None
        if name in entries:
            raise RegistryError(f"{group}={name} is registered twice: by {entries[name].source} and by {source}")
        problems = GROUPS[group].problems(factory)
        if problems:
            raise RegistryError(f"{group}={name} from {source}: " + "; ".join(problems))
        entries[name] = Component(group, name, factory, source)

    def get(self, group: str, name: str) -> Component:
        """The component, or an error naming the bad value and the valid choices."""
        entries = self._group(group)
        if name not in entries:
            raise RegistryError(f"unknown {group} {name!r}; valid {group} names: {', '.join(sorted(entries))}")
        return entries[name]

    def names(self, group: str) -> list[str]:
        return sorted(self._group(group))

    def components(self) -> list[Component]:
        return [entry for group in GROUPS for entry in self._components[group].values()]

    def copy(self) -> Registry:
        """An independent registry with the same components (e.g. one per test)."""
        return Registry({group: dict(entries) for group, entries in self._components.items()})

    def _group(self, group: str) -> dict[str, Component]:
        if group not in self._components:
            raise RegistryError(f"unknown component group {group!r}; groups: {', '.join(GROUPS)}")
        return self._components[group]


REGISTRY = Registry()
"""The process's registry: built-ins and plugins (:func:`axoexp.plugins.load_plugins`)."""
_current_source = BUILTIN


@contextmanager
def registering_from(source: str) -> Iterator[None]:
    """Attribute the components registered inside the block to ``source`` (a plugin's file)."""
    global _current_source
    previous, _current_source = _current_source, source
    try:
        yield
    finally:
        _current_source = previous


def component(group: str, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering a factory (function or class) in :data:`REGISTRY`."""

    def decorate(factory: Callable[..., Any]) -> Callable[..., Any]:
        REGISTRY.register(group, name, factory, source=_current_source)
        return factory

    return decorate
