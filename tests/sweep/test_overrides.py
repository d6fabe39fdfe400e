"""A sweep shortened from the command line: `atlas-lab sweep FILE --set KEY=VALUE ... --study NAME`.

The --set values are checked as the file's own keys are (a bad one is one line naming it, exit 2, nothing written),
recorded on the study's MLflow parent run, and a change to what the trials run needs a study name of its own, so a
shortened study never joins the full one's journal.
"""
import subprocess

import pytest
from optuna.trial import TrialState

from atlas_lab.cli import main
from sweep_helpers import load, runs_of, sweep_command, write_sweep


def test_a_shortened_sweep_is_a_study_of_its_own(workdir):
    """The file: 2 points × 3 repeats of 4 steps each. `--set fixed.trainer.max_steps=2 --set repeats=1 --study
    s-short` runs 2 trials of 2 steps in study s-short (its own journal; s is never created), its trials' runs
    record the shortened value, and its parent run the --set values. The same command again resumes it: nothing
    new runs."""
    sweep = write_sweep("grid.yaml", grid={"model.lr": [1e-3, 2e-3]}, repeats=3, fixed={"trainer.max_steps": 4})
    args = ["sweep", sweep, "--set", "fixed.trainer.max_steps=2", "--set", "repeats=1", "--study", "s-short"]
    done = subprocess.run(sweep_command(*args), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "study 's-short' (runs/optuna/s-short.journal; grid.yaml --set fixed.trainer.max_steps=2 --set " \
           "repeats=1): 2 new trial(s) enqueued" in " ".join(done.stdout.split())
    trials = load("s-short").get_trials()
    assert len(trials) == 2 and all(t.state == TrialState.COMPLETE for t in trials)
    assert not __import__("pathlib").Path("runs/optuna/s.journal").exists()
    _, parents, children = runs_of("s-short")
    assert parents[0].info.run_name == "s-short" and parents[0].info.status == "FINISHED"
    assert parents[0].data.tags["atlas_lab.set"] == "--set fixed.trainer.max_steps=2 --set repeats=1"
    assert parents[0].data.tags["atlas_lab.sweep_file"] == sweep
    assert [c.data.params["trainer.max_steps"] for c in children] == ["2", "2"]
    assert load("s-short").user_attrs["definition"]["fixed"] == {"trainer.max_steps": 2}
    assert main(args) == 0 and len(load("s-short").get_trials()) == 2


BAD_SETS = {  # name: (the command line's changes, the one line's text after "error: ")
    "unknown key": (["--set", "bogus=1", "--study", "x"], "--set bogus=1: unknown key 'bogus'; valid keys: base, "),
    "bad repeats": (["--set", "repeats=0", "--study", "x"], "--set repeats=0: repeats: expected an int >= 1, got 0"),
    "bool warmup": (["--set", "pruner.warmup_epochs=true", "--study", "x"],
                    "--set pruner.warmup_epochs=true: pruner.warmup_epochs: expected an int >= 0, got True"),
    "unknown pruner key": (["--set", "pruner.warmup=1", "--study", "x"],
                           "--set pruner.warmup=1: pruner: unknown key(s) ['warmup']; valid keys: type, warmup_epochs"),
    "no value": (["--set", "repeats", "--study", "x"], "--set repeats: expected KEY=VALUE"),
    "bad YAML": (["--set", "grid.model.lr=[1", "--study", "x"], "--set grid.model.lr=[1: expected a YAML value"),
    "bad config value": (["--set", "fixed.trainer.max_steps=abc", "--study", "x"],
                         "--set fixed.trainer.max_steps=abc: trainer.max_steps: "),
    "bad grid value": (["--set", "grid.model.lr=[0.001, -1]", "--study", "x"],
                       "--set grid.model.lr=[0.001, -1]: grid.model.lr = -1: model.lr: "),
    "study by --set": (["--set", "study=x"], "--set study=x: a study is named with --study NAME, not --set"),
    "no study name": (["--set", "fixed.trainer.max_steps=2"],
                      "--set fixed.trainer.max_steps=2: changes what the trials of study 's' run; name this study "
                      "with --study NAME"),
    "the file's name": (["--set", "repeats=2", "--study", "s"],
                        "--study s: --set repeats=2 changes what the trials run; name the changed study other than "
                        "the file's own study 's'"),
    "bad study name": (["--study", "a b"], "--study 'a b': use letters, digits, '_', '-' and '.' only"),
}


@pytest.mark.parametrize("case", list(BAD_SETS))
def test_a_bad_set_is_one_line_exit_2_and_nothing_is_written(case, workdir, capsys):
    sweep = write_sweep("grid.yaml", grid={"model.lr": [1e-3]}, pruner={"type": "median", "warmup_epochs": 1})
    args, message = BAD_SETS[case]
    assert main(["sweep", sweep, *args]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), err
    assert not __import__("pathlib").Path("runs").exists()


@pytest.mark.parametrize("value, message", [
    ("often", "model.memory.learning_rule.init_args.reset_every: expected int or null; got often"),
    ("6", "model.memory.learning_rule.reset_every: expected a multiple of chunk_size=16"),
])
def test_a_sets_component_option_is_checked_by_its_class(value, message, workdir, capsys):
    """--set of an option of a component given by class_path, in LightningCLI's init_args form: its type checked by
    the class's annotation (reset_every: int | None), its range by the class: one line naming the --set, exit 2,
    nothing written."""
    sweep = write_sweep("grid.yaml", grid={"model.lr": [1e-3]},
                        fixed={"model.memory.learning_rule": {"class_path": "atlas_lab.memory.ChunkCommit"}})
    given = f"fixed.model.memory.learning_rule.init_args.reset_every={value}"
    assert main(["sweep", sweep, "--set", given, "--study", "x"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: --set {given}: {message}"), lines
    assert not __import__("pathlib").Path("runs").exists()


def test_what_only_the_report_uses_needs_no_study_name(workdir, capsys):
    """--set marks (or baseline) changes no trial: the file's study, no --study needed; a value equal to the file's
    is no change either."""
    from atlas_lab.sweep import load_sweep

    sweep = write_sweep("grid.yaml", grid={"model.lr": [1e-3, 2e-3]}, fixed={"trainer.max_steps": 4})
    spec = load_sweep(sweep, ["marks.chance=0.25", "baseline.model.lr=0.002", "fixed.trainer.max_steps=4"])
    assert spec.study == "s" and spec.marks == {"chance": 0.25} and spec.baseline == {"model.lr": 0.002}
    assert spec.argv() == [sweep, "--set", "marks.chance=0.25", "--set", "baseline.model.lr=0.002", "--set",
                           "fixed.trainer.max_steps=4"]


def test_warmup_epochs_true_in_the_file_is_refused(workdir, capsys):
    """`warmup_epochs: true` is a bool (an int in Python): refused with one line, not taken as 1."""
    sweep = write_sweep("grid.yaml", grid={"model.lr": [1e-3]}, pruner={"type": "median", "warmup_epochs": True})
    assert main(["sweep", sweep]) == 2
    assert capsys.readouterr().err.strip() == "error: grid.yaml: pruner.warmup_epochs: expected an int >= 0, got True"
