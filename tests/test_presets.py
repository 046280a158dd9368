"""Every named preset in conf/experiment composes, and the published row it names exists."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
from helpers import REPO
from hydra import compose, initialize_config_module
from omegaconf import DictConfig

from axoexp import metadata, names
from axoexp.registry import Registry

PRESETS = sorted(path.stem for path in (REPO / "conf" / "experiment").glob("*.yaml"))
PUBLISHED_ROW = re.compile(
    r'the row "(?P<shape>\S+) \| (?P<variant>\S+)" of\s+#\s*(?P<file>benchmarks/results/\S+\.md)'
    r" \(median (?P<median>[\d.]+) ms; commit (?P<commit>[0-9a-f]{7,})"
)


@functools.cache
def composed(name: str, *overrides: str) -> DictConfig:
    """The preset composed with ``overrides``, once per session (both tests below read each preset)."""
    with initialize_config_module(config_module="axoexp.conf", version_base="1.3"):
        return compose("config", overrides=[f"+experiment={name}", *overrides], return_hydra_config=True)


def test_presets_are_named_what_hardware() -> None:
    assert len(PRESETS) >= 10
    for name in PRESETS:
        assert re.fullmatch(r"[a-z0-9_x]+_(cpu|h200)", name), name


@pytest.mark.parametrize("name", PRESETS)
def test_preset_composes_to_what_its_name_says(name: str, loaded_registry: Registry) -> None:
    config = composed(name)
    hardware = name.rsplit("_", 1)[1]
    assert config.device == ("cpu" if hardware == "cpu" else "cuda")
    shape = re.search(r"_(\d+)x(\d+)x(\d+)_", name)
    if shape:  # <executor>_<neurons>x<time_steps>x<contacts>_<hardware>
        executor = name[: shape.start()]
        assert config.executor.name == executor
        population = config.population
        assert (population.neurons, population.time_steps, population.contacts) == tuple(map(int, shape.groups()))
    for key, values in (config.hydra.sweeper.get("params") or {}).items():  # a sweep preset: every job composes too
        for value in str(values).split(","):
            composed(name, f"{key}={value}")


@pytest.mark.parametrize("name", [name for name in PRESETS if name.endswith("_h200")])
def test_h200_preset_names_a_published_row(name: str, loaded_registry: Registry) -> None:
    text = (REPO / "conf" / "experiment" / f"{name}.yaml").read_text()
    if "-m +experiment" in text:  # a sweep: it names its results file and commit
        (file,) = re.findall(r"benchmarks/results/\S+\.md", text)
        assert (REPO / file).is_file()
        return
    match = PUBLISHED_ROW.search(text)
    assert match, f"{name}.yaml names no published row"
    table = (REPO / match["file"]).read_text()
    row = f"| {match['shape']} | {match['variant']} | {match['median']} |"
    assert row in table, f"{match['file']} has no row {row}"
    assert match["commit"] in table, f"{match['file']} was not measured at commit {match['commit']}"
    config = composed(name)
    assert config.executor.name == match["variant"]
    assert f"{config.population.neurons}x{config.population.time_steps}x{config.population.contacts}" == match["shape"]


def test_presets_are_shipped_with_the_configs() -> None:
    assert (REPO / "axoexp" / "conf" / "experiment").resolve() == (REPO / "conf" / "experiment").resolve()
    assert Path(REPO / "axoexp" / "conf").resolve() == (REPO / "conf").resolve()


def test_the_code_hash_covers_the_linked_configs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's result key must change with its configs, which a checkout links in as axoexp/conf."""
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "package").mkdir()
    (tmp_path / "package" / "module.py").write_text("x = 1\n")
    (tmp_path / "package" / "conf").symlink_to(tmp_path / "conf")
    preset = tmp_path / "conf" / "experiment" / "some_cpu.yaml"
    preset.write_text("device: cpu\n")
    monkeypatch.setattr(metadata, "PACKAGE_DIR", tmp_path / "package")
    before = metadata.code_state()[names.CODE_HASH]
    preset.write_text("device: cuda\n")
    assert metadata.code_state()[names.CODE_HASH] != before
