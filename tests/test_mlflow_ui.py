"""The MLflow UI as a researcher opens it: ``mlflow ui`` on a real sweep, in headless Chromium.

Needs Debian's ``chromium`` (``apt-get install chromium``) and Playwright's Python package
(installed with ``.[dev]``); Playwright drives the system browser and downloads none. Set
``AXOEXP_UI_SCREENSHOT=PATH`` to keep the screenshot (the README's comes from here).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import free_port, start_mlflow
from mlflow.tracking import MlflowClient
from test_faults import start_cli

from axoexp import names

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEW = f"runs?workflowType=machine_learning&viewStateShareKey={names.RUNS_VIEW}"  # the README's link

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not CHROMIUM.is_file(), reason=f"needs Debian's chromium at {CHROMIUM} (apt-get install chromium)"
    ),
]
sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[dev]')")


@pytest.fixture(scope="module")
def swept_ui(tmp_path_factory: pytest.TempPathFactory, empty_store: Path) -> Iterator[tuple[str, MlflowClient]]:
    """A real two-job sweep in a new store, and ``mlflow ui`` serving it on 127.0.0.1. The sweep
    runs while the UI starts (the store is migrated first, so neither process creates it)."""
    root = tmp_path_factory.mktemp("ui")
    shutil.copyfile(empty_store, root / "mlflow.db")
    sweep = start_cli("-m", "population.neurons=2,3", "run.measured_updates=5", cwd=root)
    port = free_port()
    try:
        server = start_mlflow("ui", root, port)
    finally:
        _, stderr = sweep.communicate(timeout=300)
    url = f"http://127.0.0.1:{port}"
    try:
        assert sweep.returncode == 0, stderr
        yield url, MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_runs_view_shows_the_sweep_its_children_and_their_medians(
    swept_ui: tuple[str, MlflowClient], tmp_path: Path
) -> None:
    url, client = swept_ui
    experiment = client.get_experiment_by_name("axoexp")
    runs = client.search_runs([experiment.experiment_id])
    (parent,) = [run for run in runs if run.data.tags.get(names.SWEEP_ROLE) == "parent"]
    children = sorted((run for run in runs if run is not parent), key=lambda run: run.info.run_name)

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            # Wide enough that every column of the view is rendered: the grid leaves columns out
            # of the page while they lie beyond its right edge (an open side panel narrows it).
            page = browser.new_page(viewport={"width": 2800, "height": 560})
            page.goto(f"{url}/#/experiments/{experiment.experiment_id}/{VIEW}")
            page.get_by_text(parent.info.run_name, exact=True).wait_for(timeout=60_000)
            for button in ("Close", "Hide banner"):  # the assistant panel, the shared-view banner
                if page.get_by_role("button", name=button).count():
                    page.get_by_role("button", name=button).first.click()
            median = page.locator(f"[col-id='metrics.`{names.UPDATE_MEDIAN}`']")
            assert median.first.inner_text().startswith("update_ms_med"), "the median column is shown"
            for tag in (names.TIMING_CONTENTION, names.TIMING_NOISE):  # shown with the numbers they qualify
                assert page.locator(f"[col-id='tags.`{tag}`']").count(), tag
            page.locator("[row-index='0'] [col-id='attributes.`Run Name`'] button").first.click()
            for child in children:
                page.get_by_text(child.info.run_name, exact=True).wait_for(timeout=30_000)
            cells = [text.strip() for text in median.all_inner_texts()[1:]]
            assert sum(text not in ("", "-") for text in cells) == len(children), cells
            page.set_viewport_size({"width": 1500, "height": 560})
            page.wait_for_timeout(500)
            page.screenshot(path=str(tmp_path / "mlflow-ui.png"))
        finally:
            browser.close()
    if os.environ.get("AXOEXP_UI_SCREENSHOT"):
        shutil.copyfile(tmp_path / "mlflow-ui.png", os.environ["AXOEXP_UI_SCREENSHOT"])
