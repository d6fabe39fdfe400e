"""Fixtures of the evaluation tests: a fitted checkpoint and a folder of local harness tasks, made once a session."""
from pathlib import Path

import pytest
from eval_helpers import fit, fit_shards, write_tasks


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> Path:
    """The last checkpoint of a tiny fit (eval_helpers.fit), with its MLflow run."""
    return fit(tmp_path_factory.mktemp("fit"))


@pytest.fixture(scope="session")
def tasks(tmp_path_factory) -> Path:
    return write_tasks(tmp_path_factory.mktemp("tasks"))


@pytest.fixture(scope="session")
def shards_checkpoint(tmp_path_factory) -> Path:
    """The last checkpoint of a tiny fit on a prepared corpus of bytes (eval_helpers.fit_shards); its corpus is the
    folder "corpus" beside "runs"."""
    return fit_shards(tmp_path_factory.mktemp("shards"))
