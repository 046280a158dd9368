"""Shared fixtures: composed configs and a private sqlite MLflow store (helpers: tests/helpers.py)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers import PLUGINS, REPO, registry_with_plugins
from hydra import compose, initialize_config_module
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig

from axoexp.config import register_configs
from axoexp.plugins import load_plugins
from axoexp.registry import Registry

if not torch.cuda.is_available():  # before anything imports triton: it fixes the mode at import
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the fused kernels then run in Triton's CPU interpreter


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated, empty sqlite MLflow store: each test copies it, as migrating one takes seconds."""
    path = tmp_path_factory.mktemp("store") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def tracking_uri(tmp_path: Path, empty_store: Path) -> str:
    shutil.copyfile(empty_store, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture
def client(tracking_uri: str) -> MlflowClient:
    return MlflowClient(tracking_uri=tracking_uri)


@pytest.fixture(scope="session")
def loaded_registry() -> Registry:
    """The process registry with built-ins and the shipped plugins, their configs stored."""
    registry = load_plugins(REPO / "plugins")
    register_configs(registry)
    return registry


@pytest.fixture(scope="session")
def plugin_registry(loaded_registry: Registry) -> Registry:
    """The process registry plus the tests' own plugins (``helpers.PLUGINS``)."""
    return registry_with_plugins(PLUGINS)


@pytest.fixture
def registry(loaded_registry: Registry) -> Registry:
    """A copy for one test: components it registers do not leak into other tests."""
    return loaded_registry.copy()


@pytest.fixture
def make_config(tracking_uri: str, loaded_registry: Registry) -> Callable[..., DictConfig]:
    """Compose the real Hydra config with overrides, logging to this test's store."""

    def make(*overrides: str) -> DictConfig:
        with initialize_config_module(config_module="axoexp.conf", version_base="1.3"):
            return compose("config", overrides=[f"tracking.uri={tracking_uri}", *overrides])

    return make
