"""Shared test setup. Without a GPU, atlas_lab.memory.ops runs under Triton's interpreter; TRITON_INTERPRET must be
set before triton is first imported (by any module: lightning imports it too), hence here, before collection."""
import os
import shutil
from pathlib import Path

import pytest
import torch
import yaml

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_addoption(parser):
    parser.addoption("--device", default="cpu",
                     help="where the memory and kernel tests run (helpers.DEVICE, the `device` fixture): cpu or cuda")


def pytest_configure(config):
    """Other packages' warnings are filtered where the command filters them (atlas_lab/noise.py); ``--device`` is
    checked and handed to the tests (helpers.DEVICE)."""
    import helpers
    from atlas_lab.noise import WARNINGS

    for message, category, _ in WARNINGS:
        config.addinivalue_line("filterwarnings", f"ignore:{message}:{category}")
    device = torch.device(config.getoption("--device"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--device cuda: torch sees no CUDA device on this machine")
    helpers.DEVICE = device


@pytest.fixture
def device():
    """The tests' device (``--device``, default cpu)."""
    import helpers

    return helpers.DEVICE


@pytest.fixture(scope="session")
def postgres():
    """The test run's own PostgreSQL server (see tests/postgres.py); ``postgres.database()`` gives a fresh database."""
    from postgres import Server

    server = Server()
    yield server
    server.stop()


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A temporary working directory holding copies of lightning_config.yaml and experiments/ (runs/ lands there).
    The sweep tests use ``sweep_dir`` instead (a tiny experiment instead of the real ones)."""
    root = Path(__file__).resolve().parents[1]
    shutil.copy(root / "lightning_config.yaml", tmp_path / "lightning_config.yaml")
    shutil.copytree(root / "experiments", tmp_path / "experiments")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def sweep_dir(tmp_path, monkeypatch):
    """A project folder for sweeps: lightning_config.yaml, a tiny MQAR experiment (experiments/tiny.yaml), runs/
    created by the sweeps; the sweep's worker processes import this checkout."""
    from sweep_helpers import ROOT, TINY

    shutil.copy(ROOT / "lightning_config.yaml", tmp_path / "lightning_config.yaml")
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return tmp_path
