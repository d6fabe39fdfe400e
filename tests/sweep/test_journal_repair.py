"""A journal torn at its end, as a kill in the middle of a write leaves it (half a record, no line end), is repaired by
the next write: the torn tail moved to a side file named in one warning, under the journal's write lock, before
anything is appended; the study resumes, and stays one that Optuna's own API reads."""
import subprocess
from pathlib import Path

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from atlas_lab.sweep import study as studies
from atlas_lab.sweep.spec import load_sweep
from sweep_helpers import sweep_command, write_sweep


def test_a_journal_torn_at_its_end_is_cut_before_the_next_write_and_optuna_reads_the_resumed_study(workdir):
    sweep = write_sweep("grid.yaml", grid={"model.lr": [1e-3]})
    spec = load_sweep(sweep)
    storage = studies.default_storage(spec.study)
    study = studies.load_study(spec, storage, create=True)  # the study as the sweep command creates it: queued
    studies.record_spec(study, spec, storage)
    assert studies.enqueue_missing(study, spec) == 1
    journal = Path(storage)
    whole = journal.read_bytes()
    last = whole.splitlines(keepends=True)[-1]
    torn = last[: len(last) // 2]  # the writer killed in the middle of its write: half a record, no line end
    with open(journal, "ab") as f:
        f.write(torn)

    done = subprocess.run(sweep_command("sweep", sweep), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    side = f"{storage}.torn-{len(whole)}"
    warnings = [line for line in done.stderr.splitlines() if line.strip()]
    line = len(whole.splitlines()) + 1
    assert warnings == [f"warning: {storage}:{line}: a torn journal record (a write cut short by a "
                        f"kill or a full disk), {len(torn)} bytes, moved to {side} before the next write"], done.stderr
    assert Path(side).read_bytes() == torn
    repaired = journal.read_bytes()
    assert repaired.startswith(whole) and repaired.endswith(b"\n") and torn not in repaired[len(whole):]
    plain = optuna.load_study(study_name=spec.study, storage=JournalStorage(JournalFileBackend(str(journal))))
    trials = plain.get_trials()
    assert [(t.state, t.params["model.lr"]) for t in trials] == [(TrialState.COMPLETE, 1e-3)]
    assert trials[0].value is not None
