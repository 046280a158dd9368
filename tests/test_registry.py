"""The plugin registry: lookups, errors, and agreement between factories and shipped YAML."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from axoexp.registry import GROUPS, REGISTRY, Registry, RegistryError, load_plugins

CONF = Path(__file__).resolve().parents[1] / "conf"


def test_unknown_name_lists_valid_choices() -> None:
    load_plugins()
    with pytest.raises(RegistryError) as error:
        REGISTRY.get("executor", "cudagrph")
    message = str(error.value)
    assert "'cudagrph'" in message
    assert "cudagraph, eager" in message


def test_unknown_group_lists_groups() -> None:
    with pytest.raises(RegistryError, match="groups: population, loss, optimizer"):
        Registry().get("scheduler", "cosine")


def test_duplicate_name_names_both_sources() -> None:
    registry = Registry()
    registry.register("loss", "mine", lambda: None, source="plugins/a.py")
    with pytest.raises(RegistryError, match="registered twice: by plugins/a.py and by plugins/b.py"):
        registry.register("loss", "mine", lambda: None, source="plugins/b.py")


def test_bad_parameters_name_the_key_and_the_accepted_ones() -> None:
    load_plugins()
    huber = REGISTRY.get("loss", "huber")
    with pytest.raises(RegistryError, match=r"loss=huber does not accept 'delt'; its parameters are: delta, warmup_steps"):
        huber.check_params({"delt": 2.0})


def test_missing_required_parameter_is_reported() -> None:
    registry = Registry()

    def needs_scale(*, scale: float) -> None:
        del scale

    registry.register("loss", "scaled", needs_scale, source="test")
    with pytest.raises(RegistryError, match="loss=scaled needs scale"):
        registry.get("loss", "scaled").check_params({})


def test_context_arguments_are_not_config_parameters() -> None:
    load_plugins()
    adam = REGISTRY.get("optimizer", "adam")
    assert "parameters" not in adam.parameters() and "capturable" not in adam.parameters()
    assert adam.defaults()["lr"] == pytest.approx(1e-3)


@pytest.mark.parametrize("group", GROUPS)
def test_every_builtin_has_a_yaml_that_matches_its_factory(group: str) -> None:
    """The shipped YAML sets exactly the factory's parameters, to the factory's defaults."""
    load_plugins()
    files = {path.stem: path for path in (CONF / group).glob("*.yaml")}
    builtins = [entry for entry in REGISTRY.components() if entry.group == group and entry.source == "builtin"]
    assert sorted(files) == sorted(entry.name for entry in builtins)
    for entry in builtins:
        node = yaml.safe_load(files[entry.name].read_text())
        assert node.pop("name") == entry.name
        if group == "optimizer":
            assert node.pop("capturable") == "auto"
        assert node == entry.defaults(), f"conf/{group}/{entry.name}.yaml drifted from its factory"
