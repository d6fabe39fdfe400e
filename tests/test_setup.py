"""The set-up installs what the tests need, visibly: system packages in ``make system-deps`` (which ``.ci/run`` runs and
the README names), never from inside a test; a test whose part is missing fails with a line naming that step."""
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_system_packages_are_installed_by_the_named_set_up_step_only():
    makefile, ci, readme = ((ROOT / name).read_text() for name in ("Makefile", ".ci/run", "README.md"))
    assert re.search(r"^system-deps:", makefile, re.M) and "apt-get install" in makefile
    assert "make system-deps" in ci and "apt-get" not in ci and "make system-deps" in readme
    installs = [str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.py")
                if p != Path(__file__) and re.search(r"apt-get|apt install|dnf install|yum install", p.read_text())]
    assert installs == []


def test_a_missing_part_fails_naming_the_set_up_step(monkeypatch):
    import importlib.util

    import postgres

    spec = importlib.util.spec_from_file_location("ui_test", ROOT / "tests" / "sweep" / "test_ui.py")
    test_ui = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(test_ui)

    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(pytest.fail.Exception, match=r"run `make system-deps`"):
        test_ui.chromium()
    monkeypatch.setattr(postgres, "_initdb", lambda: None)
    with pytest.raises(pytest.fail.Exception, match=r"run `make system-deps`"):
        postgres.Server()
