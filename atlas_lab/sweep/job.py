"""One fit of a sweep trial that needs several processes, run as a job of its own.

    python -m atlas_lab.sweep.job SWEEP_FILE [--set KEY=VALUE ...] [--study NAME] --storage URL --tracking-uri URI \
        --trial-id ID --run-id RUN \
        --overrides JSON --result PATH --parent-pid PID [--prune]

The worker that claimed the trial starts it. Lightning's launcher (``trainer.strategy: ddp``, ``devices: N``)
starts ranks 1…N−1 again from this command line, so every rank joins the same trial and none claims one.
Rank 0 (the process the worker started) writes the outcome to ``--result``: ``{"metrics": …}``,
``{"pruned": reason}`` or ``{"error": reason}``.
The process the worker started ends itself and its ranks when the worker is gone.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from pathlib import Path

import optuna

from ..noise import quiet
from . import study as studies
from .spec import load_sweep
from .worker import fit_once


def _exit_with(parent_pid: int) -> None:
    """Kill this process group (the job and the ranks it launched) once ``parent_pid`` is no longer the parent."""
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os.killpg(os.getpgrp(), signal.SIGKILL)


def main(argv=None) -> int:
    quiet()
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("sweep")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--study", default=None)
    ap.add_argument("--storage", required=True)
    ap.add_argument("--tracking-uri", required=True)
    ap.add_argument("--trial-id", type=int, required=True)
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--overrides", required=True)
    ap.add_argument("--result", required=True)
    ap.add_argument("--parent-pid", type=int, required=True)
    ap.add_argument("--prune", action="store_true")
    args = ap.parse_args(argv)
    rank_zero = os.getppid() == args.parent_pid  # the process the worker started; Lightning launches the others
    if rank_zero:
        threading.Thread(target=_exit_with, args=(args.parent_pid,), daemon=True).start()
    spec = load_sweep(args.sweep, args.sets, args.study)
    study = studies.load_study(spec, args.storage)
    trial = optuna.Trial(study, args.trial_id)
    try:
        outcome = {"metrics": fit_once(spec, trial, json.loads(args.overrides), args.run_id, args.tracking_uri,
                                       args.prune)}
    except optuna.TrialPruned as e:
        outcome = {"pruned": str(e)}
    except Exception as e:  # reported by the worker, which fails the trial
        outcome = {"error": f"{type(e).__name__}: {e}"}
    if rank_zero:
        tmp = Path(args.result + ".tmp")
        tmp.write_text(json.dumps(outcome))
        tmp.replace(args.result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
