"""`atlas-lab ui` as a user meets it: a real MLflow server and a real headless Chromium on a finished study.

Chromium is Debian's ``chromium``, installed by the set-up step ``make system-deps`` (``make test`` runs it first),
driven by Playwright. Without it the test fails with a line naming that step.
"""
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import PIL.Image
import pytest
from mlflow.tracking import MlflowClient

from atlas_lab.cli import main
from atlas_lab.sweep.tracking import free_port, init_store
from sweep_helpers import ROOT, runs_of, write_sweep

SCREENSHOT = ROOT / "docs" / "ui-runs.png"  # kept up to date by ATLAS_LAB_UPDATE_SCREENSHOT=1


def chromium() -> str:
    """Debian's chromium, which the set-up step installs (``make system-deps``); a test never installs it."""
    found = shutil.which("chromium")
    if found is None:
        pytest.fail("Debian's chromium is not installed: run `make system-deps` (as root) first")
    return found


def test_the_ui_shows_the_study_its_children_and_the_metric_in_model_training_mode(sweep_dir, tmp_path):
    browser = chromium()
    from playwright import sync_api as playwright
    sweep = write_sweep("grid.yaml", repeats=2, grid={"model.preset": ["gla", "deltanet"], "model.lr": [1e-3, 3e-3]},
                        baseline={"model.preset": "gla", "model.lr": 1e-3})
    assert main(["sweep", sweep]) == 0
    port = free_port()
    ui = subprocess.Popen([sys.executable, "-m", "atlas_lab.cli", "ui", "--port", str(port), "--study", "s"],
                          start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = ui.stdout.readline()
        url = next(word for word in line.split() if word.startswith("http://"))
        assert url.startswith(f"http://127.0.0.1:{port}/#/experiments/") and "workflowType=machine_learning" in url
        children = [f"lr={lr} preset={m} seed={r}" for m in ("gla", "deltanet") for lr in (0.001, 0.003)
                    for r in (0, 1)]
        with playwright.sync_playwright() as p:
            page = p.chromium.launch(executable_path=browser, args=["--no-sandbox"]).new_page(
                viewport={"width": 1800, "height": 900})
            page.goto(url)
            page.get_by_text("s", exact=True).first.wait_for(timeout=90_000)  # the study's parent run
            # model-training mode: its sidebar (runs, models, the registry), not GenAI's (traces, judges, prompts)
            assert page.get_by_text("Model registry", exact=True).count() == 1
            assert page.get_by_text("Judges", exact=True).count() == 0
            for header in ("val/acc", "best/val/acc", "model.preset", "model.lr"):  # the view's columns
                assert page.get_by_text(header, exact=True).count() >= 1, header
            page.locator('button[data-component-id$="runnamecellrenderer.tsx_46"]').first.click()  # expand the parent
            for name in children:
                page.get_by_text(name, exact=True).wait_for(timeout=30_000)
            page.screenshot(path=str(tmp_path / "ui-runs.png"))
            # the parent run's quality-against-cost plot (atlas_lab/sweep/costs.py), shown whole in its artifacts
            _, (parent,), _ = runs_of()
            width = PIL.Image.open("runs/sweeps/s/quality_cost.png").size[0]
            page.goto(f"{url.split('/#/')[0]}/#/experiments/{parent.info.experiment_id}/runs/{parent.info.run_id}"
                      "/artifacts")
            page.get_by_text("summary", exact=True).first.click(timeout=60_000)
            page.get_by_text("quality_cost.png", exact=True).first.click(timeout=30_000)
            page.wait_for_function(f"[...document.images].some(i => i.complete && i.naturalWidth === {width})",
                                   timeout=30_000)
        if os.environ.get("ATLAS_LAB_UPDATE_SCREENSHOT"):
            shutil.copy(tmp_path / "ui-runs.png", SCREENSHOT)
        os.killpg(ui.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the command's process group
        out, _ = ui.communicate(timeout=120)  # the stop is bounded (stop_server: 20 s, then SIGKILL); slack for load
        assert ui.returncode == 0 and out.strip().splitlines() == ["MLflow UI stopped"], out
        with pytest.raises(OSError):  # the server went with it
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
    finally:
        if ui.poll() is None:
            os.killpg(ui.pid, signal.SIGTERM)
            ui.wait(timeout=30)


def test_ui_without_a_store_or_with_an_unknown_study_is_one_line_exit_2(sweep_dir, capsys):
    assert main(["ui", "--port", str(free_port())]) == 2
    assert not Path("runs").exists()
    Path("runs").mkdir()
    init_store(f"sqlite:///{Path('runs/mlflow.db').resolve()}")  # a store as the first fit leaves it, no study
    before = sorted(str(p) for p in Path(".").rglob("*"))
    assert main(["ui", "--port", str(free_port()), "--study", "nosuch"]) == 2
    assert sorted(str(p) for p in Path(".").rglob("*")) == before
    store = MlflowClient(f"sqlite:///{Path('runs/mlflow.db').resolve()}")  # nor in the store: no experiment retagged
    assert "mlflow.experimentKind" not in store.get_experiment_by_name("Default").tags
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors[0].startswith("error: --tracking-uri: no tracking store at") and \
        errors[1] == f"error: --study: no study named 'nosuch' in sqlite:///{Path('runs/mlflow.db').resolve()}"
