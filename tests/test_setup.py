"""The set-up installs what the tests need, visibly: system packages in ``make system-deps`` (which ``.ci/run`` runs and
the README names), never from inside a test; a test whose part is missing fails with a line naming that step."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_system_packages_are_installed_by_the_named_set_up_step_only():
    makefile, ci, readme = ((ROOT / name).read_text() for name in ("Makefile", ".ci/run", "README.md"))
    assert re.search(r"^system-deps:", makefile, re.M) and "apt-get install" in makefile
    assert re.search(r"^test: system-deps ", makefile, re.M)  # make test runs the system set-up first
    assert "make test" in ci and "apt-get" not in ci and "make system-deps" in readme
    start = readme[readme.index("## Start here"):readme.index("## One run")]
    commands = re.findall(r"^(make \S+)", start.split("```")[1], re.M)
    assert commands == ["make demo", "make test"]  # two commands on a fresh machine
    installs = [str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.py")
                if p != Path(__file__) and re.search(r"apt-get|apt install|dnf install|yum install", p.read_text())]
    assert installs == []


def make(*args: str) -> subprocess.CompletedProcess:
    """``make -n`` in the checkout: the commands printed, none run (nothing on the machine changes)."""
    return subprocess.run(["make", "-n", "-C", str(ROOT), "--no-print-directory", *args], capture_output=True,
                          text=True, timeout=60)


def test_make_test_runs_the_system_set_up_first_and_stops_there_without_root():
    """What a part missing does (HAVE_CHROMIUM empty: chromium not found): as another user one line naming the
    command, and make stops before the tests; as root apt-get installs it, saying which; both there, nothing."""
    for target in ("system-deps", "test"):
        done = make(target, "HAVE_CHROMIUM=", "USER_ID=1000")
        assert done.returncode == 2 and "pytest" not in done.stdout and "apt-get" not in done.stdout, done
        (line,) = done.stderr.strip().splitlines()
        assert "system-deps: chromium missing" in line and "sudo make system-deps" in line
    root = make("test", "HAVE_CHROMIUM=", "USER_ID=0")
    assert root.returncode == 0
    assert "installing chromium" in root.stdout and "apt-get install -y -q chromium" in root.stdout
    assert root.stdout.index("apt-get install") < root.stdout.index("pytest")
    present = make("system-deps", "HAVE_CHROMIUM=/usr/bin/chromium", "HAVE_POSTGRESQL=/usr/bin/initdb",
                   "USER_ID=1000")
    assert present.returncode == 0 and 'if [ -z "" ]' in present.stdout


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
