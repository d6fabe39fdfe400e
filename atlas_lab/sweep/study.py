"""The Optuna side of a sweep: storage, the study, its queue of trials, heartbeats and lost workers.

Every trial is enqueued by the sweep command (a grid point × repeat, or an empty trial that the
sampler fills for tpe/random), under the storage's lock, and claimed atomically by one worker, so no
point runs twice under concurrency, whatever the number of sweep commands. A worker has a unique id and
writes a heartbeat into its running trial; a trial is lost when its worker is a local one that has
exited, or when its heartbeat has not changed for the grace period. Host names and process ids are
kept for people to read and never used to decide: two containers may share a host name, and a PID
means nothing in another PID namespace. A lost trial is failed and its work enqueued again.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import socket
import sys
import time
from pathlib import Path

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from ..store import try_file_lock
from .locks import JournalFlock, StorageLock, is_postgres
from .spec import TUNE_REPEAT, SweepError, SweepSpec, default_storage, require_storage  # noqa: F401  (default_storage: re-exported)

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


def heartbeat_seconds() -> float:
    """How often a worker beats (``ATLAS_LAB_HEARTBEAT_SECONDS``, default 10)."""
    return float(os.environ.get("ATLAS_LAB_HEARTBEAT_SECONDS", "10"))


def grace_seconds() -> float:
    """How long a heartbeat may stand still before its trial is lost (``ATLAS_LAB_HEARTBEAT_GRACE_SECONDS``,
    default six beats)."""
    return float(os.environ.get("ATLAS_LAB_HEARTBEAT_GRACE_SECONDS", str(6 * heartbeat_seconds())))


def shown(url: str) -> str:
    """A storage or tracking URL as printed: without its password."""
    if "://" not in url or "@" not in url:
        return url
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not an SQLAlchemy URL (http://user:pw@host): drop the credentials entirely
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"


_TORN_WARNED: set[tuple[str, int]] = set()  # (journal, line): each torn record is reported once per process
RECORD_START = b'{"op_code":'  # how Optuna writes every journal record


class JournalBackend(JournalFileBackend):
    """Optuna's journal file, read past a torn record. A write cut short (the writer killed in the middle of it, or a
    full disk) leaves a partial JSON line, and Optuna appends the next record right after it, on the same line: plain
    Optuna then fails to read the journal at all, and the study, with every complete trial in it, is lost. Here such a
    line is skipped with one warning naming the file and line (a complete record appended after the torn part is
    kept), so every complete record is read; a partial last line (being written now, or torn) is left for a later
    read. Every reader of a study takes the same view (the records are numbered without the torn ones).

    A write first repairs a torn last line (``cut_torn_tail``): under the journal's write lock, which every writer
    holds, a last line without its newline is no write in progress but a torn one, and it is moved to a side file
    named in one warning before anything is appended, so the journal stays one that Optuna's own reader opens. A
    write that fails (a full disk) is taken back: the journal is never left half-written by this process."""

    def __init__(self, file_path: str, lock_obj, shown_path: str | None = None):
        super().__init__(file_path, lock_obj=lock_obj)
        self._shown = shown_path or file_path
        self._starts: dict[int, tuple[int, int]] = {0: (0, 1)}  # record number -> (byte offset, line) to read from

    def read_logs(self, log_number_from: int):
        number = log_number_from if log_number_from in self._starts else \
            max(n for n in self._starts if n <= log_number_from)  # Optuna reads on from where it stopped
        offset, line_no = self._starts[number]
        with open(self._file_path, "rb") as f:
            size = os.fstat(f.fileno()).st_size  # what is appended while this reads waits for the next read
            f.seek(offset)
            for line in f:
                if offset + len(line) > size or not line.endswith(b"\n"):
                    break
                offset, line_no = offset + len(line), line_no + 1
                record = self._parse(line, line_no - 1)
                if record is None:
                    continue
                number += 1
                self._starts[number] = (offset, line_no)
                if number > log_number_from:
                    yield record

    def _parse(self, line: bytes, line_no: int):
        try:
            return json.loads(line)
        except ValueError:
            pass
        record, at = None, line.find(RECORD_START, 1)
        while at != -1 and record is None:  # a complete record appended after the torn one, on its line
            try:
                record = json.loads(line[at:])
            except ValueError:
                at = line.find(RECORD_START, at + 1)
        if (self._file_path, line_no) not in _TORN_WARNED:
            _TORN_WARNED.add((self._file_path, line_no))
            kept = "; the complete record after it on that line is kept" if record is not None else ""
            print(f"warning: {self._shown}:{line_no}: a torn journal record (a write cut short by a kill or a full "
                  f"disk) is skipped{kept}", file=sys.stderr, flush=True)
        return record if isinstance(record, dict) else None

    def append_logs(self, logs: list[dict]) -> None:
        text = "\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n"
        self._lock.acquire()
        try:
            with open(self._file_path, "rb+" if os.path.exists(self._file_path) else "ab+") as f:
                self.cut_torn_tail(f)
                size = f.seek(0, os.SEEK_END)
                try:
                    f.write(text.encode("utf-8"))
                    f.flush()
                    os.fsync(f.fileno())
                except OSError:
                    with contextlib.suppress(OSError):
                        f.truncate(size)  # a full disk: nothing half-written is left behind
                    raise
        finally:
            self._lock.release()

    def cut_torn_tail(self, f) -> None:
        """Move a torn last line of the journal open as ``f`` (read and write) to ``JOURNAL.torn-<offset>`` (its
        bytes as they were) and cut the journal before it, with one warning naming that file; nothing where the
        journal ends with a newline. Call it under the write lock: a writer ends every record it writes with a
        newline, so without one the write was cut short (a kill, a full disk)."""
        size = f.seek(0, os.SEEK_END)
        if not size:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        f.seek(0)
        data = f.read()
        start = data.rfind(b"\n") + 1
        side = Path(f"{self._file_path}.torn-{start}")
        with open(side, "wb") as out:
            out.write(data[start:])
            out.flush()
            os.fsync(out.fileno())
        f.truncate(start)
        f.flush()
        os.fsync(f.fileno())
        line = data.count(b"\n", 0, start) + 1
        print(f"warning: {self._shown}:{line}: a torn journal record (a write cut short by a kill or a full disk), "
              f"{size - start} bytes, moved to {self._shown}.torn-{start} before the next write", file=sys.stderr,
              flush=True)


def journal_quiet(url: str, timeout: float = 5.0):
    """The write lock of a journal file, taken within ``timeout`` seconds (``with``: whether it was taken): held by
    the sweep command while it kills its workers, so none is killed in the middle of a journal write (a writer holds
    it for milliseconds). A database has none: its writes are transactions."""
    if "://" in url:
        return contextlib.nullcontext(False)
    return try_file_lock(JournalFlock(str(Path(url).resolve())).path, timeout)


def open_storage(url: str):
    """A journal file path (safe for several local processes) or a database URL (``postgresql://…`` shares a study
    across machines). A missing database driver or an unreachable server is a SweepError (one line, exit 2)."""
    if "://" not in url:
        path = Path(url).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalBackend(str(path), JournalFlock(str(path)), shown_path=url))
    with storage_errors(url):
        return optuna.storages.RDBStorage(url)


def load_existing(url: str, name: str) -> optuna.Study:
    """An existing study, opened for reading only: a missing journal file or SQLite database, a database without
    Optuna's tables or a study that is not there is a SweepError, and nothing is created on the way."""
    require_storage(url, name)
    import sqlalchemy.exc

    try:
        if "://" not in url:
            storage = open_storage(url)
        else:
            with storage_errors(url):
                storage = optuna.storages.RDBStorage(url, skip_table_creation=True)
        return optuna.load_study(study_name=name, storage=storage)
    except (KeyError, sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError):  # no study, no tables
        raise SweepError(f"report: no study named {name!r} in {shown(url)}") from None


@contextlib.contextmanager
def storage_errors(url: str):
    """A missing database driver or an unreachable server, met inside, as a SweepError (one line, exit 2)."""
    import sqlalchemy.exc

    try:
        yield
    except ImportError as e:
        hint = " For PostgreSQL: pip install 'atlas-lab[postgres]' (psycopg 3)." if is_postgres(url) else ""
        raise SweepError(f"--storage {shown(url)}: the database driver is not installed ({e}).{hint}") from None
    except sqlalchemy.exc.SQLAlchemyError as e:
        reason = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
        raise SweepError(f"--storage {shown(url)}: cannot open the database: {reason}") from None


def study_lock(url: str):
    """The storage's lock (see ``locks``): held while the study is created, the grid enqueued, the parent run found
    or created, and lost trials failed and enqueued again."""
    try:
        return StorageLock(url, "atlas-lab optuna storage")
    except ValueError as e:
        raise SweepError(f"--storage {e}") from None


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
        return optuna.create_study(direction=spec.objective_direction, load_if_exists=True, **kwargs)
    return optuna.load_study(**kwargs)


DEFINITION_KEYS = ("metric", "direction", "sampler", "grid", "search", "fixed", "base", "summary", "tune")


def definition(spec: SweepSpec) -> dict:
    """What makes a study the study it is; repeats, trials and the pruner may change (more seeds, more trials).
    The summary and the tune block are part of it where the file has them."""
    out = {"metric": spec.metric, "direction": spec.direction, "sampler": spec.sampler, "grid": spec.grid,
           "search": spec.search, "fixed": spec.fixed, "base": [str(b) for b in spec.base]}
    if spec.summary != "final":
        out["summary"] = spec.objective
    if spec.tune:
        out["tune"] = {"grid": spec.tune, "seeds": spec.tune_seeds}
    return json.loads(json.dumps(out, sort_keys=True, default=str))


def record_spec(study: optuna.Study, spec: SweepSpec, storage_url: str) -> None:
    """Keep the sweep's definition and what a report needs (metric, direction, sampler, grid axes) in the study.
    A study of that name with another definition is a SweepError that says how to proceed. Call it under the lock."""
    new, old = definition(spec), study.user_attrs.get("definition")
    if old is not None and old != new and not more_pilot_seeds(old, new):
        differ = [k for k in DEFINITION_KEYS if old.get(k) != new.get(k)]
        where = f"rm {storage_url}" if not is_postgres(storage_url) else \
            f"optuna delete-study --study-name {spec.study} --storage <the storage URL>"
        raise SweepError(f"{spec.path}: study: {spec.study!r} already exists in {shown(storage_url)} with another "
                         f"definition ({', '.join(differ)} differ); give this sweep a new study name, or delete the "
                         f"old study ({where})")
    for key, value in (("definition", new), ("metric", spec.objective), ("direction", spec.objective_direction),
                       ("summary", spec.summary), ("sampler", spec.sampler), ("grid_keys", list(spec.grid)),
                       ("grid_labels", {k: list(labels) for k, labels in spec.grid.items()}),
                       ("baseline", spec.baseline), ("tune_keys", list(spec.tune)), ("marks", spec.marks),
                       ("escape", spec.escape), ("margin", spec.margin), ("setting", spec.setting),
                       ("paper_setting", spec.paper_setting),
                       ("claims", spec.claims)):
        if study.user_attrs.get(key) != value:
            study.set_user_attr(key, value)


def more_pilot_seeds(old: dict, new: dict) -> bool:
    """Whether a definition differs from the recorded one only by more pilot seeds in its tune block: the study
    goes on (its pilots so far count; ``retune`` re-runs the points whose choice the new seeds change)."""
    if "tune" not in old or "tune" not in new or {**old, "tune": None} != {**new, "tune": None}:
        return False
    return old["tune"]["grid"] == new["tune"]["grid"] and new["tune"]["seeds"] > old["tune"]["seeds"]


def trial_key(trial) -> tuple:
    """What makes two trials the same piece of work: grid labels and the repeat (or the queue slot, or for a tune
    trial its candidate)."""
    return (tuple(sorted(trial.user_attrs.get("labels", {}).items())), trial.user_attrs.get("repeat", 0),
            trial.user_attrs.get("slot", 0))


def enqueue_missing(study: optuna.Study, spec: SweepSpec) -> int:
    """Enqueue every piece of work not yet in the study (once: a re-run adds nothing new). Returns the count.
    Reads, then writes: call it under ``study_lock``."""
    present = {trial_key(t) for t in study.get_trials(deepcopy=False) if not is_superseded(study, t)}
    added = 0
    if spec.sampler == "grid":  # a point's tune trials (slot: the candidate) first, then its reported repeats
        candidates = spec.tune_candidates()
        work = [(labels, TUNE_REPEAT + s, c, tune) for labels in spec.grid_points()
                for s in range(spec.tune_seeds) for c, tune in enumerate(candidates)]
        work += [(labels, r, 0, None) for labels in spec.grid_points() for r in range(spec.repeats)]
    else:
        work = [({}, 0, slot, None) for slot in range(spec.trials)]
    for labels, repeat, slot, tune in work:
        key = (tuple(sorted(labels.items())), repeat, slot)
        if key in present:
            continue
        attrs = {"labels": labels, "repeat": repeat, "slot": slot} | ({"tune": tune} if tune is not None else {})
        study.enqueue_trial(labels, user_attrs=attrs, skip_if_exists=False)
        added += 1
    return added


def is_tune(trial) -> bool:
    """A tune trial: one candidate setting of a grid point on one pilot seed."""
    return "tune" in trial.user_attrs


REFINE_RATIO = 1.5  # a diverged candidate and its stable neighbour this far apart (ratio) get one between them


def diverged(trial) -> bool:
    """A failed trial whose training diverged: a non-finite loss or summary (FloatingPointError)."""
    return trial.state == TrialState.FAIL and str(trial.user_attrs.get("fail_reason", "")).startswith(
        "FloatingPointError")


def tune_candidates(study: optuna.Study, labels: dict) -> list[dict]:
    """Every tune candidate of a grid point, by slot (the file's, then the finer ones added): {"slot", "tune",
    "values" (its complete pilots' summaries), "pilots", "finished", "diverged" (pilot counts), "escaped" (the share
    of complete pilots that reached a steps_to threshold)}."""
    candidates: dict[int, dict] = {}
    for t in study.get_trials(deepcopy=False):
        if is_tune(t) and t.user_attrs["labels"] == labels and not is_superseded(study, t):
            c = candidates.setdefault(t.user_attrs["slot"], {"slot": t.user_attrs["slot"], "tune": t.user_attrs["tune"],
                                                             "values": [], "out": [], "pilots": 0, "finished": 0,
                                                             "diverged": 0})
            c["pilots"] += 1
            c["finished"] += t.state in FINISHED
            c["diverged"] += diverged(t)
            if t.state == TrialState.COMPLETE:
                c["values"].append(t.value)
                c["out"] += t.user_attrs.get("censored", [False])
    return [c | {"escaped": c["out"].count(False) / len(c["out"]) if c["out"] else None}
            for _, c in sorted(candidates.items())]


def tuned_setting(study: optuna.Study, labels: dict) -> tuple[dict | None, list[dict]]:
    """(the chosen setting, every candidate as ``tune_candidates`` gives it, with "median", "low" and "high" of its
    pilot summaries) of a grid point: among the candidates none of whose pilots diverged, the one whose median over
    its complete pilot seeds is best in the study's direction (the first in slot order on a tie); None where none
    completed. Steps to a threshold rank first by the share of seeds that reached it ("escaped"), as a censored value
    is only a lower bound."""
    sign = 1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else -1.0
    rows = [c | {"median": statistics.median(c["values"]) if c["values"] else None,
                 "low": min(c["values"], default=None), "high": max(c["values"], default=None)}
            for c in tune_candidates(study, labels)]
    done = [c for c in rows if c["median"] is not None and not c["diverged"]]
    if not done:
        return None, rows
    return max(done, key=lambda c: (c["escaped"], sign * c["median"]))["tune"], rows


def _between(a, b):
    """A value between two candidate values: their geometric mean where both are positive, else their mean; three
    significant digits."""
    middle = math.sqrt(a * b) if a > 0 and b > 0 else (a + b) / 2
    return float(f"{middle:.3g}")


def refinements(study: optuna.Study, labels: dict) -> list[dict]:
    """The finer tune candidates a grid point needs now: for each candidate with a diverged pilot, and each positive
    numeric key on which it differs from its nearest candidate (the other keys equal) that finished every pilot without
    failing, a candidate between the two (``_between``) where they are at least ``REFINE_RATIO`` apart and none
    lies between them yet. [] once the point's tuning is settled."""
    rows = tune_candidates(study, labels)
    present = {json.dumps(c["tune"], sort_keys=True) for c in rows}
    out = []
    for c in (c for c in rows if c["diverged"]):
        for key, value in c["tune"].items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            line = sorted((r for r in rows if isinstance(r["tune"].get(key), (int, float))
                           and all(r["tune"].get(k) == v for k, v in c["tune"].items() if k != key)),
                          key=lambda r: r["tune"][key])
            at = next(i for i, r in enumerate(line) if r is c)
            for near in (line[at - 1] if at else None, line[at + 1] if at + 1 < len(line) else None):
                if near is None or near["diverged"] or near["finished"] < near["pilots"] or \
                        len(near["values"]) < near["pilots"]:
                    continue
                a, b = sorted((value, near["tune"][key]))
                if a <= 0 or b / a < REFINE_RATIO:  # positive values only (a rate, a step size)
                    continue
                finer = c["tune"] | {key: _between(a, b)}
                text = json.dumps(finer, sort_keys=True)
                if a < finer[key] < b and text not in present:
                    present.add(text)
                    out.append(finer)
    return out


def enqueue_refinements(study: optuna.Study, spec: SweepSpec) -> int:
    """Enqueue the finer candidates every grid point of a tuned study needs now (``refinements``), each on the
    study's pilot seeds, in the next free slots of its point. Reads, then writes: call it under ``study_lock``."""
    added = 0
    for labels in spec.grid_points() if spec.tune else []:
        finer = refinements(study, labels)
        slot = max((c["slot"] for c in tune_candidates(study, labels)), default=-1) + 1
        for tune in finer:
            for s in range(spec.tune_seeds):
                study.enqueue_trial(labels, user_attrs={"labels": labels, "repeat": TUNE_REPEAT + s, "slot": slot,
                                                        "tune": tune}, skip_if_exists=False)
                added += 1
            slot += 1
    return added


def stale_reported(study: optuna.Study, spec: SweepSpec) -> list:
    """The finished reported trials of tuned grid points that ran at a setting other than their point's choice of
    now (more pilot seeds, a finer candidate changed it; ``tuned``: the setting a trial ran at). A point still tuning
    (a pilot waiting or running, a finer candidate due) has none yet."""
    trials = study.get_trials(deepcopy=False)
    busy = {json.dumps(t.user_attrs["labels"], sort_keys=True) for t in trials
            if is_tune(t) and t.state in (TrialState.WAITING, TrialState.RUNNING)}
    reported: dict[str, list] = {}  # per point (its labels as JSON): its finished reported trials, in one pass
    for t in trials:
        if not is_tune(t) and t.state in FINISHED and "labels" in t.user_attrs and not is_superseded(study, t):
            reported.setdefault(json.dumps(t.user_attrs["labels"], sort_keys=True), []).append(t)
    stale = []
    for labels in spec.grid_points() if spec.tune else []:
        key = json.dumps(labels, sort_keys=True)
        if key in busy or key not in reported or refinements(study, labels):
            continue
        choice = tuned_setting(study, labels)[0]
        stale += [t for t in reported[key] if choice is not None and t.user_attrs.get("tuned", choice) != choice]
    return stale


def retune(study: optuna.Study, spec: SweepSpec) -> int:
    """Supersede every ``stale_reported`` trial and enqueue its work again, to run at its point's choice of now.
    Returns the count. Reads, then writes: call it under ``study_lock``."""
    stale = stale_reported(study, spec)
    if stale:  # a finished trial cannot be updated: the study keeps the list
        study.set_user_attr("superseded_trials", superseded_numbers(study) + [t.number for t in stale])
    for t in stale:
        _enqueue_again(study, t)
    return len(stale)


def claim_waiting_trial(study: optuna.Study) -> optuna.Trial | None:
    """Atomically take one WAITING trial that is ready (WAITING -> RUNNING); None when none is. A reported trial of a
    tuned point is ready once every tune trial of its point has finished and no finer candidate is due
    (``refinements``: the sweep command enqueues those)."""
    storage = study._storage
    trials = study.get_trials(deepcopy=False)
    tuning = {json.dumps(t.user_attrs["labels"], sort_keys=True) for t in trials
              if is_tune(t) and t.state in (TrialState.WAITING, TrialState.RUNNING)}
    tuned = {json.dumps(t.user_attrs["labels"], sort_keys=True): t.user_attrs["labels"] for t in trials if is_tune(t)}
    tuning |= {key for key, labels in tuned.items() if key not in tuning and refinements(study, labels)}
    for frozen in trials:
        if frozen.state != TrialState.WAITING:
            continue
        if not is_tune(frozen) and json.dumps(frozen.user_attrs.get("labels", {}), sort_keys=True) in tuning:
            continue
        if storage.set_trial_state_values(frozen._trial_id, state=TrialState.RUNNING):
            return optuna.Trial(study, frozen._trial_id)
    return None


def beat(study: optuna.Study, trial_id: int) -> None:
    study._storage.set_trial_user_attr(trial_id, "heartbeat", time.time())


def owner_attrs(worker_id: str) -> dict:
    """Who runs a trial: the worker's unique id (what counts), and its host and PID (for people to read)."""
    return {"worker_id": worker_id, "host": socket.gethostname(), "pid": os.getpid(), "heartbeat": time.time()}


class LostTrials:
    """Finds RUNNING trials whose worker is gone, by identity: the trial's worker is one of this command's that has
    exited, or its heartbeat has not changed for ``grace_seconds()`` as timed by this process's clock — so the
    machines' clocks need not agree, and a live worker, which beats every ``heartbeat_seconds()``, is never lost.
    A command that starts while another machine runs a trial watches that trial's heartbeat move before judging it."""

    def __init__(self):
        self.seen: dict[int, tuple[object, float]] = {}  # trial id -> (heartbeat, when this process saw it change)

    def __call__(self, study: optuna.Study, exited_workers: set[str] = frozenset()) -> list:
        now, lost, running = time.monotonic(), [], set()
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            running.add(t._trial_id)
            value = t.user_attrs.get("heartbeat")  # None: claimed a moment ago, owner not written yet
            if self.seen.get(t._trial_id, (object(),))[0] != value:
                self.seen[t._trial_id] = (value, now)
            if t.user_attrs.get("worker_id") in exited_workers or now - self.seen[t._trial_id][1] > grace_seconds():
                lost.append(t)
        self.seen = {k: v for k, v in self.seen.items() if k in running}
        return lost


def fail_lost(study: optuna.Study, frozen) -> bool:
    """Fail a lost trial and enqueue its work again; False (nothing done) when it finished in the meantime. The
    state moves first (RUNNING -> FAIL, atomic in the storage), then the study records it as superseded (a
    finished trial takes no attributes). Call it under ``study_lock``, so two commands never enqueue it twice."""
    try:
        study._storage.set_trial_state_values(frozen._trial_id, state=TrialState.FAIL)
    except UpdateFinishedTrialError:
        return False
    study.set_user_attr("superseded_trials", superseded_numbers(study) + [frozen.number])
    _enqueue_again(study, frozen)
    return True


def _enqueue_again(study: optuna.Study, frozen) -> None:
    """Enqueue the same work as a superseded trial (its labels, repeat and slot)."""
    attrs = frozen.user_attrs
    study.enqueue_trial(attrs.get("labels", {}), user_attrs={k: attrs[k] for k in ("labels", "repeat", "slot", "tune")
                                                             if k in attrs})


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
