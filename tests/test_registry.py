"""The registry: lookups, errors, typed groups checked at registration, and generated configs."""

from __future__ import annotations

import importlib
import re
import typing
from typing import Annotated

import pytest
import torch
from hydra import compose, initialize_config_module

from axoexp.components import losses
from axoexp.components.population import lite
from axoexp.config import describe, first_sentence, node_class, register_configs
from axoexp.errors import AxoexpError, ConfigError, RegistryError
from axoexp.executors.eager import EagerExecutor
from axoexp.interfaces import Executor, PopulationSetup
from axoexp.plan import plan_experiment
from axoexp.plugins import load_plugins
from axoexp.registry import BUILTIN, GROUPS, POSITIVE, Bounds, Registry


def test_unknown_name_lists_valid_choices(registry: Registry) -> None:
    with pytest.raises(RegistryError) as error:
        registry.get("executor", "cudagrph")
    message = str(error.value)
    assert "'cudagrph'" in message
    assert "cudagraph, eager" in message


def test_unknown_group_lists_groups_and_names_the_plugin_registering_into_it() -> None:
    with pytest.raises(RegistryError, match="groups: population, loss, optimizer"):
        Registry().get("scheduler", "cosine")
    with pytest.raises(RegistryError, match=r"^losses=mine from plugins/a.py: unknown component group 'losses'"):
        Registry().register("losses", "mine", lambda: None, source="plugins/a.py")


def test_duplicate_name_names_both_sources() -> None:
    registry = Registry()
    registry.register("loss", "mine", lambda: None, source="plugins/a.py")
    with pytest.raises(RegistryError, match="registered twice: by plugins/a.py and by plugins/b.py"):
        registry.register("loss", "mine", lambda: None, source="plugins/b.py")


def test_bad_parameters_name_the_key_and_the_accepted_ones(registry: Registry) -> None:
    huber = registry.get("loss", "huber")
    with pytest.raises(
        RegistryError, match=r"loss=huber does not accept 'delt'; its parameters are: delta, warmup_steps"
    ):
        huber.check_params({"delt": 2.0})


def test_missing_required_parameter_is_reported() -> None:
    registry = Registry()

    def needs_scale(*, scale: float) -> None:
        del scale

    registry.register("loss", "scaled", needs_scale, source="test")
    with pytest.raises(RegistryError, match="loss=scaled needs scale"):
        registry.get("loss", "scaled").check_params({})


def test_context_arguments_are_not_config_parameters(registry: Registry) -> None:
    adam = registry.get("optimizer", "adam")
    assert "parameters" not in adam.parameters() and "capturable" not in adam.parameters()
    assert adam.defaults()["lr"] == pytest.approx(1e-3)


def test_an_executor_that_is_not_an_executor_class_is_refused_at_registration() -> None:
    def step_function(*, module, optimizer, loss_fn, gradient_transform):
        return None

    with pytest.raises(RegistryError, match=r"executor=fn from plugins/fn.py: must be a subclass of ") as refused:
        Registry().register("executor", "fn", step_function, source="plugins/fn.py")
    module, _, name = str(refused.value).split("must be a subclass of ")[1].split(",")[0].rpartition(".")
    assert getattr(importlib.import_module(module), name) is Executor, "the class named is the one to subclass"
    Registry().register("executor", "ok", EagerExecutor, source="plugins/ok.py")


def test_a_factory_missing_a_context_argument_is_refused() -> None:
    def optimizer_without_capturable(*, parameters, lr: float = 0.1):
        return torch.optim.SGD(parameters, lr=lr)

    with pytest.raises(RegistryError, match="must accept the framework's argument 'capturable'"):
        Registry().register("optimizer", "bad", optimizer_without_capturable, source="plugins/bad.py")


def test_a_default_a_config_cannot_hold_is_refused_naming_the_parameter() -> None:
    def loss_with_function_default(*, reduce=torch.mean):
        return lambda prediction, target: reduce(prediction - target)

    with pytest.raises(RegistryError, match=r"loss=fancy from plugins/fancy.py: parameter 'reduce' has default"):
        Registry().register("loss", "fancy", loss_with_function_default, source="plugins/fancy.py")


def test_declared_bounds_are_checked_with_key_value_and_expectation() -> None:
    def scaled(*, scale: Annotated[float, "multiplies the error", POSITIVE] = 1.0):
        return lambda prediction, target: scale * (prediction - target).abs().mean()

    registry = Registry()
    registry.register("loss", "scaled", scaled, source="test")
    entry = registry.get("loss", "scaled")
    assert entry.value_problems({"scale": 2.0}) == []
    assert entry.value_problems({"scale": -1.0}) == ["loss.scale=-1.0: must be greater than 0"]
    (documented,) = entry.documented_parameters()
    assert documented.help == "multiplies the error" and documented.annotation is float


def test_bounds_that_hold_no_value_are_refused_where_they_are_declared() -> None:
    """``Bounds(5, 1)`` was accepted as the plugin loaded, and every value later said ``must lie in [5, 1]``."""
    with pytest.raises(ValueError, match=re.escape("Bounds(low=5, high=1) holds no value: low is above high")):
        Bounds(5, 1)
    assert Bounds(1, 1).problem(1) is None


def test_literal_choices_and_infinite_values_are_checked_with_key_value_and_choices() -> None:
    def reduced(
        *,
        mode: Annotated[typing.Literal["mean", "sum"] | None, "reduction"] = "mean",
        norm: Annotated[float, "p", Bounds(low=0, low_inclusive=False, infinite=True)] = 2.0,
        beta: Annotated[float, "decay", Bounds(0, 1, high_inclusive=False)] = 0.9,
    ):
        return lambda prediction, target: (prediction - target).abs().mean()

    registry = Registry()
    registry.register("loss", "reduced", reduced, source="test")
    entry = registry.get("loss", "reduced")
    assert entry.value_problems({"mode": "sum", "norm": float("inf"), "beta": 0.0}) == []
    assert entry.value_problems({"mode": None}) == []
    assert entry.value_problems({"mode": "max", "norm": float("nan"), "beta": 1.0}) == [
        "loss.mode='max': must be one of mean, sum, null",
        "loss.norm=nan: must be a finite number, not nan",
        "loss.beta=1.0: must lie in [0, 1)",
    ]
    assert POSITIVE.problem(float("inf")) == "must be a finite number, not inf"


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_composes_to_its_factory_defaults(group: str, loaded_registry: Registry) -> None:
    """The config node Hydra composes is generated from the factory: one source of truth."""
    options = [entry for entry in loaded_registry.components() if entry.group == group]
    assert options
    for entry in options:
        with initialize_config_module(config_module="axoexp.conf", version_base="1.3"):
            node = dict(compose("config", overrides=[f"{group}={entry.name}"])[group])
        assert node.pop("name") == entry.name
        for key, setting in entry.spec.settings.items():
            assert node.pop(key) == setting.default
        assert node == entry.defaults(), f"{group}={entry.name}"
        assert node_class(entry).__name__ == f"{group}_{entry.name}"


def test_the_component_itself_registered_as_its_factory_is_refused_showing_the_factory_form() -> None:
    registry = Registry()

    def broken(prediction, target):
        return (prediction - target).abs().mean()

    with pytest.raises(RegistryError) as error:
        registry.register("loss", "broken", broken, source="plugins/broken.py")
    assert str(error.value) == (
        "loss=broken from plugins/broken.py: broken(prediction, target) looks like the loss itself, not a "
        "factory of it (no parameter has a default); register a factory that returns it: "
        "def broken(scale: float = 1.0): return lambda prediction, target: ... "
        "(a value the config must set is keyword-only: def broken(*, weight: float))"
    )

    def gradient_step(parameters, clip):  # the framework's argument comes first in the form shown
        del parameters, clip

    with pytest.raises(RegistryError, match=r"def gradient_step\(parameters, scale: float = 1.0\)"):
        registry.register("gradient_transform", "bare", gradient_step, source="plugins/bare.py")

    def weighted(*, weight: float):  # a mandatory config value, keyword-only: a factory
        return lambda prediction, target: weight * (prediction - target).abs().mean()

    registry.register("loss", "weighted", weighted, source="plugins/weighted.py")
    registry.register("loss", "plain", lambda: None, source="plugins/plain.py")


def test_a_mandatory_value_left_unset_is_refused_while_planning_naming_the_key(make_config, registry) -> None:
    def weighted(*, weight: float):
        assert weight != "???", "the factory must not be called with '???'"
        return lambda prediction, target: weight * (prediction - target).abs().mean()

    registry.register("loss", "weighted_mandatory", weighted, source="tests/test_registry.py")
    register_configs(registry)
    with pytest.raises(ConfigError) as error:
        plan_experiment(make_config("loss=weighted_mandatory"), registry)
    assert str(error.value) == (
        "invalid experiment config: loss.weight is mandatory and not set: set it, e.g. loss.weight=VALUE"
    )
    plan = plan_experiment(make_config("loss=weighted_mandatory", "loss.weight=2.5"), registry)
    assert plan.params["loss"] == {"weight": 2.5}

    def sized(*, device: torch.device, dtype: torch.dtype, seed: int, size: int) -> PopulationSetup:
        return lite(device=device, dtype=dtype, seed=seed, neurons=size)

    registry.register("population", "sized", sized, source="tests/test_registry.py")  # the group with settings
    register_configs(registry)
    with pytest.raises(ConfigError) as error:
        plan_experiment(make_config("population=sized"), registry)
    assert str(error.value) == (
        "invalid experiment config: population.size is mandatory and not set: set it, e.g. population.size=VALUE"
    )


def test_help_gives_each_option_its_whole_first_sentence(loaded_registry: Registry) -> None:
    wrapped = "Compiled regions of ``n`` blocks (and the code\n    before the loop), then more.\n\nDetails."
    assert first_sentence(wrapped) == "Compiled regions of ``n`` blocks (and the code before the loop), then more."
    assert first_sentence("No full stop") == "No full stop" and first_sentence("") == ""
    page = describe(loaded_registry)
    executors = [line for line in page.splitlines() if line.startswith(("  regional", "  fused", "  compiled"))]
    assert executors and all(line.rstrip().endswith(".") for line in executors), executors


def test_every_builtin_parameter_is_typed_in_help(loaded_registry: Registry) -> None:
    """A parameter shown as ``any`` lost its annotation (as every loss's did to an unresolvable
    return type), or declares none: both leave its values unchecked."""
    builtins = Registry()
    for entry in loaded_registry.components():
        if entry.source == BUILTIN:
            builtins.register(entry.group, entry.name, entry.factory, source=BUILTIN)
    keys = [line.split() for line in describe(builtins).splitlines() if line.startswith("    ")]
    assert len(keys) > 40 and not [key for key in keys if key[1] == "any"], describe(builtins)
    losses = {(key[0], key[1], key[2]) for key in keys if key[0].startswith("loss.")}
    assert losses == {
        ("loss.warmup_steps", "int", "4"),
        ("loss.delta", "float", "1.0"),
        ("loss.warmup_steps", "int", "0"),
    }


def test_the_builtin_losses_resolve_their_annotations_and_declare_their_bounds(registry: Registry) -> None:
    assert typing.get_type_hints(losses.huber)["delta"] is float  # LossFn resolves where losses.py imports torch
    huber = registry.get("loss", "huber")
    assert huber.value_problems({"delta": -1.0, "warmup_steps": -1}) == [
        "loss.delta=-1.0: must be greater than 0",
        "loss.warmup_steps=-1: must be at least 0",
    ]
    (warmup,) = registry.get("loss", "causal_mse").documented_parameters()
    assert (warmup.annotation, warmup.help) == (int, "leading output steps left out of the loss")


PLUGIN_WITH_UNRESOLVABLE_ANNOTATIONS = '''
from __future__ import annotations
from typing import TYPE_CHECKING, Annotated
from axoexp.registry import POSITIVE
if TYPE_CHECKING:
    from somewhere import Scale, Returned

def factory(
    *,
    weight: Annotated[float, "multiplies the error", POSITIVE] = 1.0,
    scale: Annotated[Scale | None, "a type only a type checker sees", POSITIVE] = 2.0,
    broken: Annotated[int, 1 / 0] = 3,
) -> Returned:
    """A loss."""
'''


def test_an_unresolvable_annotation_costs_only_its_own_parameter_its_type() -> None:
    namespace: dict[str, typing.Any] = {"__name__": "plugin_with_unresolvable_annotations"}
    exec(PLUGIN_WITH_UNRESOLVABLE_ANNOTATIONS, namespace)
    registry = Registry()
    registry.register("loss", "partly_typed", namespace["factory"], source="plugins/partly_typed.py")
    entry = registry.get("loss", "partly_typed")
    weight, scale, broken = entry.documented_parameters()
    assert (weight.annotation, weight.help, weight.bounds) == (float, "multiplies the error", POSITIVE)
    assert (scale.annotation, scale.help, scale.bounds) == (typing.Any, "a type only a type checker sees", POSITIVE)
    assert (broken.annotation, broken.bounds) == (typing.Any, None)
    assert broken.help == "(its annotation cannot be read: ZeroDivisionError: division by zero)"
    assert entry.value_problems({"weight": 0.0, "scale": -1.0}) == [
        "loss.weight=0.0: must be greater than 0",
        "loss.scale=-1.0: must be greater than 0",
    ]


def test_a_plugin_with_a_syntax_error_is_named_with_its_file_line_and_column(tmp_path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\n\ndef loss(prediction, target)\n    return prediction\n")
    failed = tmp_path / "failed.py"
    failed.write_text("import math\n\nSCALE = 1 / 0\n")
    errors: list[AxoexpError] = []
    load_plugins(tmp_path, on_error=errors.append)
    assert [str(error) for error in errors] == [
        f"plugin {broken} failed to import: {broken}:3:29: SyntaxError: expected ':'",
        f"plugin {failed} failed to import: ZeroDivisionError: division by zero (at {failed}:3)",
    ]
