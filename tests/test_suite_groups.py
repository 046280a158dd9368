"""The suite's own set-up under pytest-xdist (tests/conftest.py): the tests that share a costly
fixture run on one worker, which builds it once."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="module")
def shared() -> str:
    return "built once"


def test_tests_sharing_a_module_fixture_carry_their_group_to_pytest_xdist(shared: str, request) -> None:
    """Under pytest 9.2 pytest-xdist 3.8 grouped no test (pytest-xdist#1386), and before that
    conftest marked the groups after xdist had read them: each worker built every module-scoped
    fixture and the killed runs again, and nothing said so."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or not request.config.getoption("loadgroup", False):
        pytest.skip("the groups are pytest-xdist's (-n 2 --dist loadgroup, the README's test command)")
    assert request.node.nodeid.endswith(f"@{request.module.__name__}")
