"""The sweep tests run in a project folder of their own (``sweep_dir``, tests/conftest.py)."""
import pytest


@pytest.fixture
def workdir(sweep_dir):
    return sweep_dir
