"""Shared test setup. Without a GPU, atlas_lab.kernels runs under Triton's interpreter; TRITON_INTERPRET must be
set before triton is first imported (by any module: lightning imports it too), hence here, before collection."""
import os

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
