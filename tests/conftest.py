"""Shared test setup. Without a GPU, atlas_lab.kernels runs under Triton's interpreter; TRITON_INTERPRET must be
set before triton is first imported (by any module: lightning imports it too), hence here, before collection."""
import os
import shutil
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


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
    tests/sweep/conftest.py defines its own (a tiny experiment instead of the real ones)."""
    root = Path(__file__).resolve().parents[1]
    shutil.copy(root / "lightning_config.yaml", tmp_path / "lightning_config.yaml")
    shutil.copytree(root / "experiments", tmp_path / "experiments")
    monkeypatch.chdir(tmp_path)
    return tmp_path
