"""The benchmarks' front door: one file-name rule, an index of every result, provenance in every script."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from helpers import REPO

from axoexp import metadata, names

BENCHMARKS = REPO / "benchmarks"
RESULT_NAME = re.compile(
    r"(?P<theme>[a-z-]+)_(?P<hardware>[a-z0-9]+)_(?P<date>\d{4}-\d{2}-\d{2})_(?P<entity>[a-z0-9-]+)"
)


def test_every_result_follows_the_naming_rule_and_is_indexed() -> None:
    index = (BENCHMARKS / "README.md").read_text()
    scripts = {path.stem.replace("_", "-") for path in BENCHMARKS.rglob("*.py")}
    results = sorted((BENCHMARKS / "results").iterdir())
    assert results
    for path in results:
        stem = path.name.split(".")[0]
        match = RESULT_NAME.fullmatch(stem)
        assert match, f"{path.name} does not follow [theme]_[hardware]_[date]_[entity]"
        assert match["theme"] in scripts, f"{path.name}: no script benchmarks/**/{match['theme']}.py"
        assert f"`{stem}" in index or f"`_{match['entity']}`" in index, f"benchmarks/README.md does not index {stem}"


def test_every_script_records_its_provenance() -> None:
    for script in BENCHMARKS.rglob("*.py"):
        assert "metadata.provenance(" in script.read_text(), f"{script.name} records no provenance"


@pytest.mark.slow
def test_provenance_names_commit_dirty_flag_command_device_and_date() -> None:
    probe = "from axoexp import metadata; import json; print(json.dumps(metadata.provenance('cpu')))"
    output = subprocess.run(
        [sys.executable, "-c", probe, "--label", "x"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    record = json.loads(output)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert record[names.GIT_COMMIT] == head
    assert record[names.GIT_DIRTY] in ("true", "false")
    assert record[names.COMMAND] == "python -c --label x"
    assert record[names.DEVICE] == "cpu"
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\+00:00", record[names.DATE])
    line = metadata.provenance_line(record)
    assert line.startswith(f"axoexp {head[:12]} (dirty: ") and "command: `python -c --label x`" in line
