"""The Optuna side of a sweep: storage, the study, its queue of trials, heartbeats and lost workers.

Every trial is enqueued by the sweep command (a grid point × repeat, or an empty trial that the
sampler fills for tpe/random) and claimed atomically by one worker, so no point runs twice under
concurrency. Workers write a heartbeat into their running trial; a trial whose worker is gone (its
process is dead on this host, or its heartbeat is older than the grace period) is failed and
enqueued again.
"""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from .spec import SweepSpec

HEARTBEAT_SECONDS = float(os.environ.get("ATLAS_LAB_HEARTBEAT_SECONDS", "10"))
GRACE_SECONDS = float(os.environ.get("ATLAS_LAB_HEARTBEAT_GRACE_SECONDS", str(6 * HEARTBEAT_SECONDS)))
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


def default_storage(study: str) -> str:
    return str(Path("runs") / "optuna" / f"{study}.journal")


def open_storage(url: str):
    """A journal file path (safe for several local processes) or an RDB URL such as postgresql://…"""
    if "://" in url:
        return optuna.storages.RDBStorage(url)
    Path(url).parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(url))


def make_sampler(spec: SweepSpec, seed: int = 0):
    if spec.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    return optuna.samplers.RandomSampler(seed=seed)  # grid trials are all enqueued: nothing is sampled


def make_pruner(spec: SweepSpec):
    kind, warmup = spec.pruner["type"], spec.pruner["warmup_epochs"]
    if kind == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=warmup)
    if kind == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=max(1, warmup))
    return optuna.pruners.NopPruner()


def load_study(spec: SweepSpec, storage_url: str, create: bool = False) -> optuna.Study:
    storage = open_storage(storage_url)
    kwargs = dict(study_name=spec.study, storage=storage, sampler=make_sampler(spec), pruner=make_pruner(spec))
    if create:
        return optuna.create_study(direction=spec.direction, load_if_exists=True, **kwargs)
    return optuna.load_study(**kwargs)


def record_spec(study: optuna.Study, spec: SweepSpec) -> None:
    """Keep what a report needs in the study itself (metric, direction, sampler, grid axes)."""
    for key, value in (("metric", spec.metric), ("direction", spec.direction), ("sampler", spec.sampler),
                       ("grid_keys", list(spec.grid))):
        if study.user_attrs.get(key) != value:
            study.set_user_attr(key, value)


def trial_key(trial) -> tuple:
    """What makes two trials the same piece of work: grid labels and the repeat (or the queue slot)."""
    return (tuple(sorted(trial.user_attrs.get("labels", {}).items())), trial.user_attrs.get("repeat", 0),
            trial.user_attrs.get("slot", 0))


def enqueue_missing(study: optuna.Study, spec: SweepSpec) -> int:
    """Enqueue every piece of work not yet in the study (once: a re-run adds nothing new). Returns the count."""
    present = {trial_key(t) for t in study.get_trials(deepcopy=False) if not is_superseded(study, t)}
    added = 0
    if spec.sampler == "grid":
        work = [(labels, r, 0) for labels in spec.grid_points() for r in range(spec.repeats)]
    else:
        work = [({}, 0, slot) for slot in range(spec.trials)]
    for labels, repeat, slot in work:
        key = (tuple(sorted(labels.items())), repeat, slot)
        if key in present:
            continue
        study.enqueue_trial(labels, user_attrs={"labels": labels, "repeat": repeat, "slot": slot},
                            skip_if_exists=False)
        added += 1
    return added


def claim_waiting_trial(study: optuna.Study) -> optuna.Trial | None:
    """Atomically take one WAITING trial (WAITING -> RUNNING); None when the queue is empty."""
    storage = study._storage
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        if storage.set_trial_state_values(frozen._trial_id, state=TrialState.RUNNING):
            return optuna.Trial(study, frozen._trial_id)
    return None


def beat(study: optuna.Study, trial_id: int) -> None:
    study._storage.set_trial_user_attr(trial_id, "heartbeat", time.time())


def owner_attrs() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "heartbeat": time.time()}


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lost_trials(study: optuna.Study) -> list:
    """RUNNING trials whose worker is gone: dead process on this host, or no heartbeat within the grace period."""
    lost, now, host = [], time.time(), socket.gethostname()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        attrs = t.user_attrs
        if "pid" not in attrs:  # claimed a moment ago, owner not written yet
            started = t.datetime_start.timestamp() if t.datetime_start else now
            if now - started > GRACE_SECONDS:
                lost.append(t)
            continue
        dead_here = attrs.get("host") == host and not _process_alive(int(attrs["pid"]))
        if dead_here or now - float(attrs.get("heartbeat", 0)) > GRACE_SECONDS:
            lost.append(t)
    return lost


def _enqueue_again(study: optuna.Study, frozen) -> None:
    """Enqueue the same work as a superseded trial (its labels, repeat and slot)."""
    attrs = frozen.user_attrs
    study.enqueue_trial(attrs.get("labels", {}), user_attrs={k: attrs[k] for k in ("labels", "repeat", "slot")
                                                             if k in attrs})


def requeue(study: optuna.Study, frozen, reason: str) -> None:
    """Fail a trial (with its reason) and enqueue the same work again."""
    storage = study._storage  # attributes first: a finished trial cannot be updated
    storage.set_trial_user_attr(frozen._trial_id, "fail_reason", reason)
    storage.set_trial_user_attr(frozen._trial_id, "superseded", True)
    storage.set_trial_state_values(frozen._trial_id, state=TrialState.FAIL)
    _enqueue_again(study, frozen)


def retry_failed(study: optuna.Study) -> int:
    """Enqueue again every failed trial not already superseded (``--retry-failed``)."""
    failed = [t for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
              if not is_superseded(study, t)]
    if failed:  # a finished trial cannot be updated: the study keeps the list
        study.set_user_attr("superseded_trials", superseded_numbers(study) + [t.number for t in failed])
    for t in failed:
        _enqueue_again(study, t)
    return len(failed)


def superseded_numbers(study: optuna.Study) -> list[int]:
    return list(study.user_attrs.get("superseded_trials", []))


def is_superseded(study: optuna.Study, trial) -> bool:
    """A trial whose work was enqueued again (lost worker, or --retry-failed)."""
    return bool(trial.user_attrs.get("superseded")) or trial.number in superseded_numbers(study)
