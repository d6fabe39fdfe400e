"""`make demo`'s answer survives reseeding: the shipped demo study, run from three base seeds, ends resolved (a
difference or an equivalence within its margin), with the verdict its committed journal gives."""
import csv
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from atlas_lab.sweep.report import differences, result_rows, verdict
from atlas_lab.sweep.study import load_existing

ROOT = Path(__file__).resolve().parents[2]
BASE_SEEDS = [0, 100, 200]  # reported; the pilots ran from base seed 900


def study_name(base_seed: int) -> str:
    return "demo-recall" if base_seed == 0 else f"demo-recall-{base_seed}"


def committed_verdicts(base_seed: int) -> dict[str, str]:
    """Each comparison's verdict as the committed journal of that base seed gives it."""
    name = study_name(base_seed)
    study = load_existing(str(ROOT / "docs" / "results" / f"{name}.journal"), name)
    columns, rows = result_rows(study)
    return {d["changes"]: verdict(d, study.user_attrs) for d in differences(study, columns, rows)}


@pytest.mark.parametrize("base_seed", BASE_SEEDS)
def test_the_committed_demo_journals_are_resolved_from_every_base_seed(base_seed):
    """The answer the README quotes: from every reported base seed each comparison is a difference or an equivalence
    within the margin, never "not resolved", and the journal's setting is the sweep file's (what the trials ran)."""
    demo = yaml.safe_load((ROOT / "sweeps" / "demo.yaml").read_text())
    found = committed_verdicts(base_seed)
    assert len(found) == len(demo["grid"]["model"]) - 1
    for changes, words in found.items():
        assert words.endswith(f" at {demo['setting']}"), (base_seed, changes, words)
        assert not words.startswith(("not resolved", "no value", "too few")), (base_seed, changes, words)


@pytest.mark.slow
@pytest.mark.parametrize("base_seed", BASE_SEEDS)
def test_the_demo_reaches_its_verdicts_from_any_base_seed(base_seed, tmp_path, monkeypatch):
    """sweeps/demo.yaml with seed_everything and the data seed moved to base_seed (its 5 repeats then use base_seed
    … base_seed + 4): every comparison on 5 pairs, with the verdict its committed journal gives. (slow: a whole
    demo, about 5 CPU-minutes a base seed)"""
    for name in ("lightning_config.yaml", "experiments", "sweeps"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    demo = yaml.safe_load((ROOT / "sweeps" / "demo.yaml").read_text())
    demo["study"] = study_name(base_seed)
    demo["fixed"] |= {"seed_everything": base_seed, "data.init_args.seed": base_seed}
    Path("demo.yaml").write_text(yaml.safe_dump(demo))
    done = subprocess.run([sys.executable, "-m", "atlas_lab.cli", "sweep", "demo.yaml", "--workers", "2"],
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {row["changes"]: row for row in csv.DictReader(Path(f"runs/sweeps/{demo['study']}/differences.csv")
                                                          .open())}
    expected = committed_verdicts(base_seed)
    assert set(rows) == set(expected), rows
    for changes, words in expected.items():
        assert rows[changes]["pairs"] == "5", rows[changes]
        assert rows[changes]["verdict"] == words, (base_seed, rows[changes])
