"""The sweep tests' project folder: a copy of lightning_config.yaml and a tiny MQAR experiment."""
import os
import shutil

import pytest
import yaml

from test_sweep import ROOT, TINY


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A project folder of its own: lightning_config.yaml, a tiny MQAR experiment, runs/ created by the sweeps."""
    shutil.copy(ROOT / "lightning_config.yaml", tmp_path / "lightning_config.yaml")
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return tmp_path
