"""``atlas-lab sweep FILE``: check everything, create or resume the study, run its workers, summarise.

Order of work, so that bad input never half-runs: (1) the sweep file and every grid value / search
bound are checked against the real run configuration, and the storage opened; (2) only then, under
the storage's lock, are the Optuna study and the MLflow parent run created (or found again) and the
missing work enqueued — so any number of sweep commands, on any machines, enqueue each point once
and create one parent run; (3) N worker processes run the queue (logging through one MLflow server
on loopback when several share a SQLite store), while lost trials are failed and enqueued again,
under the lock; (4) the summary goes to the terminal, to files and to the parent run, which ends
FINISHED, or FAILED if the command itself fails.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from . import study as studies
from .report import DIGITS, summarize
from .spec import SweepError, SweepSpec, cli_args, load_sweep
from ..store import SQLITE, check_writable, store_file
from .tracking import (experiment_id, finish_run, init_store, parent_run, resolve_uri, run_exists, start_server,
                       stop_server)


def validate_configs(spec: SweepSpec) -> None:
    """Build data and model for every grid point and each search bound or choice; set up the data of each distinct
    data configuration once; check that the trials log the sweep's metric (a validation metric: that each trial
    validates, ``unvalidated_end``). No run starts, nothing is written. A bad value is a SweepError naming the file
    and the key: a failing point is narrowed down to the fixed values or the one grid value that fails on its own,
    else the point is named."""
    from ..lit.cli import ConfigChecker, ConfigError

    checker = ConfigChecker()

    @contextlib.contextmanager
    def at(where: str):
        try:
            yield
        except ConfigError as e:
            raise SweepError(f"{where if where.startswith('--') else f'{spec.path}: {where}'}: {e}") from None

    def check(where: str, overrides: dict):
        with at(where):
            return checker(cli_args(spec.base, overrides))

    def named(where: str, key: str) -> str:
        """``where``, after the --set that gave ``key`` where one did."""
        given = spec.set_for(key)
        return f"--set {given}: {where}" if given else where

    points = [(labels, f"grid point {spec.overrides(labels, {})}", spec.overrides(labels, {}))
              for labels in spec.grid_points()]
    for key, s in spec.search.items():
        for value in s.get("choices", [s.get("low"), s.get("high")]):
            points.append(({}, named(f"search.{key} = {value}", f"search.{key}"), {**spec.fixed, key: value}))
    for key, candidates in spec.tune.items():  # each candidate beside the first grid point
        first = spec.grid_points()[0]
        points += [(first, named(f"tune.grid.{key} = {value}", f"tune.grid.{key}"),
                    spec.overrides(first, {}) | {key: value}) for value in candidates]
    batches = {}  # data configuration -> the training batches of an epoch, once set up
    for labels, where, overrides in points:
        try:
            cli = check(where, overrides)
        except SweepError:  # narrowed down to the fixed values, a --set among them, or one grid value
            own = {k: v for k, v in spec.fixed.items() if spec.set_for(f"fixed.{k}") is None}
            check("fixed", own)
            for key in spec.fixed.keys() - own.keys():
                check(f"--set {spec.set_for(f'fixed.{key}')}", {**own, key: spec.fixed[key]})
            check("fixed", dict(spec.fixed))
            for key, label in labels.items():
                check(named(f"grid.{key} = {label}", f"grid.{key}"), {**spec.fixed, key: spec.grid[key][label]})
            raise
        data = str(cli.config["data"])
        if data not in batches:  # the data's own checks (corpus, lengths) run when it is set up
            with at(where):
                cli.set_up("fit")
            batches[data] = len(cli.datamodule.train_dataloader())
            logged = cli.model.logged_metrics(cli.datamodule)
            if spec.metric not in logged:
                raise SweepError(f"{spec.path}: metric: {spec.metric!r} is not logged by the trials ({where}); "
                                 f"valid choices: {', '.join(logged)}")
        reason = unvalidated_end(cli.config, batches[data]) if spec.metric.startswith("val/") else None
        if reason is not None:
            raise SweepError(f"{spec.path}: {where}: {spec.metric} would never be logged: {reason}")


def unvalidated_end(config, batches: int) -> str | None:
    """Why a fit of this resolved config, whose data has ``batches`` training batches an epoch, ends without a
    validation, naming the keys; None when it validates. With ``validate_at_end`` (the default) a fit validates at its
    end unless validation is off; without it, only if its first validation comes before its end by max_steps or
    max_epochs. What is not foreseen here counts as validating: a time limit or interval, several processes."""
    from ..lit.cli import epoch_batches
    from .worker import is_one_process

    trainer = config["trainer"]
    if trainer.get("limit_val_batches") == 0:
        return "trainer.limit_val_batches is 0 (no validation)"
    interval = trainer.get("val_check_interval")
    interval = 1.0 if interval is None else interval
    if config["validate_at_end"] or trainer.get("fast_dev_run") or trainer.get("max_time") is not None or \
            not isinstance(interval, (int, float)) or isinstance(interval, bool) or not is_one_process(config):
        return None
    epoch, every = epoch_batches(trainer, batches), trainer.get("check_val_every_n_epoch")
    first = max(1, int(epoch * interval)) if isinstance(interval, float) else interval  # as Lightning counts
    first += 0 if every is None else (every - 1) * epoch
    steps, epochs = trainer.get("max_steps"), trainer.get("max_epochs")
    ends = []
    if steps is not None and steps != -1:  # a step takes accumulate_grad_batches batches at most
        ends.append((steps * (trainer.get("accumulate_grad_batches") or 1), f"trainer.max_steps: {steps}"))
    epochs = 1000 if epochs is None and not ends else epochs  # Lightning's default without max_steps
    if epochs is not None and epochs != -1:
        ends.append((epochs * epoch, f"trainer.max_epochs: {epochs}"))
    if not ends or min(ends)[0] >= first:
        return None
    end, key = min(ends)
    return (f"validate_at_end is false and the fit ends after {end} training batch(es) ({key}), before its first "
            f"validation after batch {first} (trainer.val_check_interval: {interval}, check_val_every_n_epoch: "
            f"{every}, an epoch of {epoch} batches); expected validate_at_end: true (the default) or an earlier "
            "validation")


def _report_finished(study, reported: set, console: Console) -> set:
    """Print one line per trial that finished since the last call; returns their numbers. Labels and failure
    reasons are printed as plain text, never as markup (a reason such as ``[/__w/…/pair.cc:553]`` is text)."""
    new = set()
    for t in study.get_trials(deepcopy=False, states=studies.FINISHED):
        if t.number in reported or studies.is_superseded(study, t):
            continue
        new.add(t.number)
        labels = t.user_attrs.get("labels") or t.params
        line = Text(f"trial {t.number} {labels}: ")
        if t.state == TrialState.COMPLETE:
            line.append(f"value {t.value:.{DIGITS}f}")
        else:
            line.append(t.state.name, style="red").append(f" {t.user_attrs.get('fail_reason', '')}")
        console.print(line)
    return new


def worker_env(n_workers: int) -> dict:
    """The environment of one of n_workers local workers: the CPU cores shared out between them (OMP_NUM_THREADS =
    cores // n_workers, at least 1), and, during a fit, among every sweep worker of the machine (``CoreShare``:
    ATLAS_LAB_SHARE_CORES), unless the user has set OMP_NUM_THREADS, which is then kept as it is. Oversubscribed BLAS
    threads spin against each other and slow small matrix products several-fold. The MLflow retry settings the
    command sets for itself are not passed on."""
    from .worker import machine_cores

    env = {k: v for k, v in os.environ.items() if k not in _OWN_ENV}
    if "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, machine_cores() // n_workers))
        env["ATLAS_LAB_SHARE_CORES"] = "1"
    return env


# The command's own requests to MLflow give up after about 7 s (3 retries, back-off 1 s) instead of MLflow's minutes:
# it may hold the study's lock while it waits, and a store that fails (a full disk) must end it, not hang it.
MLFLOW_RETRIES = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
_OWN_ENV: set[str] = set()


def _limit_mlflow_retries() -> None:
    for key, value in MLFLOW_RETRIES.items():
        if key not in os.environ:
            os.environ[key] = value
            _OWN_ENV.add(key)


def open_checked(storage: str):
    """The storage's lock, after opening the storage once under it: a fresh database gets Optuna's tables once (two
    commands creating them at once collide). An unsupported storage, a missing driver or an unreachable server is a
    SweepError, before anything is created."""
    lock = studies.study_lock(storage)
    with studies.storage_errors(storage), lock:  # taking a PostgreSQL lock needs the driver and the server too
        studies.open_storage(storage)
    return lock


def prepare_study(spec: SweepSpec, storage: str, client: MlflowClient, retry_failed: bool = False):
    """Under the storage's lock: create or load the study, find or create its MLflow parent run (marked RUNNING),
    enqueue the missing work (and, with retry_failed, the failed trials). Returns (study, parent run id, enqueued,
    enqueued again). Any number of sweep commands may call it at once: each point is enqueued once, one parent run."""
    with studies.study_lock(storage):
        try:
            study = studies.load_study(spec, storage)  # an existing study is checked before anything is written
        except KeyError:
            study = studies.load_study(spec, storage, create=True)
        studies.record_spec(study, spec, storage)
        parent = study.user_attrs.get("mlflow_parent_run_id")
        if parent is None or not run_exists(client, parent):  # new, or the journal has outlived its MLflow store
            parent = parent_run(client, spec.study, storage)
            study.set_user_attr("mlflow_parent_run_id", parent)
        added = studies.enqueue_missing(study, spec)
        retried = studies.retry_failed(study) if retry_failed else 0
    client.update_run(parent, status="RUNNING")  # outside the lock: no other command waits on the tracking store
    return study, parent, added, retried


def writable_places(storage: str, tracking_uri: str) -> list[Path]:
    """The folders a sweep writes in: runs/ (logs, the tracking server's log, artifacts), the journal's folder and
    the SQLite tracking store's."""
    places = [Path("runs")]
    for store in (store_file(storage) if "://" not in storage else None,
                  store_file(tracking_uri) if tracking_uri.startswith(SQLITE) else None):
        if store is not None and store.parent not in places:
            places.append(store.parent)
    return places


class Interrupted(BaseException):
    """SIGINT (Ctrl-C) or SIGTERM reached the sweep command; ``code``: its exit code, 128 + the signal."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def code(self) -> int:
        return 128 + self.signum


INTERRUPTS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def interrupts_raise():
    """Inside, SIGINT and SIGTERM raise ``Interrupted`` in the main thread; the first one also makes the command
    ignore the next ones, so its clean-up (bounded: workers are killed, not waited for; MLflow is not retried for
    minutes; the server gets 20 s) runs to its end. Nothing is installed outside the main thread."""
    def handler(signum, frame):
        for sig in INTERRUPTS:
            signal.signal(sig, signal.SIG_IGN)
        raise Interrupted(signum)

    try:
        previous = {sig: signal.signal(sig, handler) for sig in INTERRUPTS}
    except ValueError:  # not the main thread
        previous = {}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def interrupts_deferred():
    """SIGINT and SIGTERM held back (delivered on leaving) while the study's shared state changes in steps that
    belong together: the study and its parent run prepared, a lost trial failed and its work enqueued again. No
    process may be started inside: it would inherit the mask."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, INTERRUPTS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


PR_SET_PDEATHSIG = 1


def _die_with_this_process():
    """A ``preexec_fn`` that has the kernel SIGKILL the child when this process dies, however it dies (Linux:
    ``prctl(PR_SET_PDEATHSIG)``, which survives the exec), and ends a child whose parent died before that took
    hold; None elsewhere (a worker then still sees its parent change within a second)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl, parent = ctypes.CDLL(None, use_errno=True).prctl, os.getpid()  # resolved here, not in the child

    def preexec():
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def _start_worker(spec: SweepSpec, storage: str, log_uri: str, parent: str, workers: int, logs: Path):
    """One worker process with a fresh id, in a process group of its own (its job's ranks stay with it), that dies
    with this command."""
    worker_id = uuid.uuid4().hex
    with open(logs / f"worker-{worker_id[:8]}.log", "ab") as log:  # the worker keeps its own copy of the file
        proc = subprocess.Popen([sys.executable, "-m", "atlas_lab.sweep.worker", *spec.argv(), "--storage", storage,
                                 "--tracking-uri", log_uri, "--parent", parent, "--worker-id", worker_id,
                                 "--driver-pid", str(os.getpid())],
                                stdout=log, stderr=subprocess.STDOUT, env=worker_env(workers), start_new_session=True,
                                preexec_fn=_die_with_this_process())
    return worker_id, proc


def _stop_workers(procs: dict) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def resume_command(path: str, workers: int, storage: str | None, tracking_uri: str | None, sets=(),
                   study: str | None = None) -> str:
    """The command line that resumes this sweep."""
    args = ["atlas-lab", "sweep", str(path)]
    for text in sets:
        args += ["--set", text]
    args += ["--study", study] if study is not None else []
    args += ["--workers", str(workers)] if workers != 1 else []
    args += ["--storage", studies.shown(storage)] if storage else []
    args += ["--tracking-uri", studies.shown(tracking_uri)] if tracking_uri else []
    return shlex.join(args)


class _Run:
    """What the command has made so far, for its clean-up."""

    def __init__(self):
        self.spec = self.study = self.storage = self.lock = self.client = self.parent = None
        self.procs: dict = {}
        self.summarizing = False
        self.stopped, self.cleanup_error = 0, None  # trials stopped by an interruption; why its clean-up failed


def run_sweep(path: str, workers: int = 1, storage: str | None = None, tracking_uri: str | None = None,
              retry_failed: bool = False, console: Console | None = None, sets=(), study: str | None = None) -> int:
    """Check, prepare, run and summarise a sweep (the module's docstring); returns the exit code: 0, 1 when every
    trial failed, 130 / 143 when SIGINT / SIGTERM stopped it. ``sets``: ``KEY=VALUE`` changes to the sweep file;
    ``study``: the study's name instead of the file's (needed when ``sets`` change what the trials run).

    Interrupted, the command kills its workers (never in the middle of a journal write), fails their running trials
    and enqueues their work again (the next command runs it, and nothing twice), ends their MLflow runs and the
    parent run KILLED, stops the tracking server, and prints one line: what finished and how to resume. Its workers
    and the tracking server die with it even when it is killed (SIGKILL)."""
    console = console or Console()
    state = _Run()
    resume = resume_command(path, workers, storage, tracking_uri, sets, study)
    with interrupts_raise():
        try:
            return _run(state, console, path, workers, storage, tracking_uri, retry_failed, sets, study)
        except Interrupted as e:
            if state.study is None:
                print(f"interrupted ({e}) before the study started: nothing was run; run it with: {resume}",
                      file=sys.stderr, flush=True)
                return e.code
            return _interrupted(state, e, resume)
        finally:
            while _OWN_ENV:
                os.environ.pop(_OWN_ENV.pop(), None)


def _run(state: _Run, console: Console, path, workers, storage, tracking_uri, retry_failed, sets, study) -> int:
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the driver prints its own progress lines
    spec = state.spec = load_sweep(path, sets, study)
    storage = state.storage = storage or studies.default_storage(spec.study)
    for place in writable_places(storage, resolve_uri(tracking_uri, create=False)):
        check_writable(place)  # a read-only or full folder: one line, before anything is written or imported
    validate_configs(spec)
    tracking_uri = resolve_uri(tracking_uri)
    lock = state.lock = open_checked(storage)
    Path("runs").mkdir(exist_ok=True)
    _limit_mlflow_retries()
    init_store(tracking_uri)
    if not tracking_uri.startswith("http"):  # the experiment keeps its artifacts where direct clients can write them
        experiment_id(MlflowClient(tracking_uri))

    server, procs = None, state.procs
    try:
        log_uri = tracking_uri
        if workers > 1 and tracking_uri.startswith("sqlite:"):  # never several writers on one SQLite file
            server, log_uri = start_server(tracking_uri, log_path=f"runs/mlflow-server-{spec.study}.log")
            console.print(f"MLflow tracking server for the workers: {escape(log_uri)}")
        client = state.client = MlflowClient(log_uri)
        with interrupts_deferred():
            study, parent, added, retried = prepare_study(spec, storage, client, retry_failed)
            state.study, state.parent = study, parent
            if spec.sets or spec.named:  # the command line's changes to the file, on the study's parent run
                client.set_tag(parent, "atlas_lab.sweep_file", str(spec.path))
                client.set_tag(parent, "atlas_lab.set", " ".join(f"--set {text}" for text, _, _ in spec.sets))
        changes = "".join(f" --set {text}" for text, _, _ in spec.sets)
        console.print(Text(f"study {spec.study!r} ({studies.shown(storage)}"
                           + (f"; {spec.path}{changes}" if changes else "") + f"): {added} new trial(s) enqueued"
                           + (f", {retried} failed trial(s) enqueued again" if retried else "")))

        logs = Path("runs") / "sweeps" / spec.study
        logs.mkdir(parents=True, exist_ok=True)
        find_lost = studies.LostTrials()
        reported = {t.number for t in study.get_trials(deepcopy=False, states=studies.FINISHED)}
        while True:
            exited = {wid for wid, p in procs.items() if p.poll() is not None}
            lost = find_lost(study, exited)
            if lost:
                with interrupts_deferred(), lock:
                    for t in lost:
                        if not studies.fail_lost(study, t):
                            continue
                        reason = f"worker lost (worker {t.user_attrs.get('worker_id', '?')[:8]} on " \
                                 f"{t.user_attrs.get('host', '?')}: exited, or no heartbeat for " \
                                 f"{studies.grace_seconds():g} s)"
                        for run_id in t.user_attrs.get("mlflow_run_ids", [])[-1:]:
                            finish_run(client, run_id, "FAIL", reason)
                        console.print(Text(f"trial {t.number}: {reason}; enqueued again", style="yellow"))
            reported |= _report_finished(study, reported, console)
            if spec.tune and any(studies.refinements(study, labels) for labels in spec.grid_points()):
                with interrupts_deferred(), lock:  # a diverged candidate: a finer one between it and a stable one
                    finer = studies.enqueue_refinements(study, spec)
                if finer:
                    console.print(Text(f"{finer} tune trial(s) enqueued: finer candidates between a diverged one and "
                                       "its stable neighbour"))
            if spec.tune and studies.stale_reported(study, spec):
                with interrupts_deferred(), lock:  # more pilot seeds chose another setting: its repeats run again
                    again = studies.retune(study, spec)
                if again:
                    console.print(Text(f"{again} reported trial(s) enqueued again: their point's tuned choice changed "
                                       "(more pilot seeds or a finer candidate)", style="yellow"))
            waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
            running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            alive = [p for p in procs.values() if p.poll() is None]
            if waiting and len(alive) < workers:
                for _ in range(min(workers - len(alive), len(waiting))):
                    worker_id, proc = _start_worker(spec, storage, log_uri, parent, workers, logs)
                    procs[worker_id] = proc
                console.print(f"{len(procs)} worker(s) started, {len(waiting)} trial(s) waiting; "
                              f"logs in {escape(str(logs))}/worker-*.log")
            elif not waiting and not running and not alive:
                break
            time.sleep(1.0)  # trials of workers here or elsewhere: wait for them
        _report_finished(study, reported, console)
        state.summarizing = True
        summarize(study, client, parent, console=console, tracking_uri=tracking_uri)
        states = [t.state for t in study.get_trials(deepcopy=False, states=studies.FINISHED)
                  if not studies.is_superseded(study, t)]
        if states and all(state == TrialState.FAIL for state in states):
            client.set_terminated(parent, status="FAILED")
            console.print(Text(f"error: every trial of study {spec.study!r} failed ({len(states)}); the reasons "
                               "are above", style="red"))
            return 1
        client.set_terminated(parent, status="FINISHED")
    except Interrupted:
        with studies.journal_quiet(storage):  # no worker is killed in the middle of a journal write
            _stop_workers(procs)
        _end_interrupted_trials(state)
        raise
    except BaseException:
        _stop_workers(procs)
        if state.parent is not None:
            with contextlib.suppress(Exception):  # the store may be what failed: the first error is the one told
                state.client.set_terminated(state.parent, status="FAILED")
        raise
    finally:
        stop_server(server)
    return 0


def _end_interrupted_trials(state: _Run) -> None:
    """After an interruption, with the workers dead: their running trials failed and their work enqueued again
    (under the study's lock), their MLflow runs and the parent run ended KILLED; while the tracking server still
    serves them. ``state.stopped``: how many trials were stopped."""
    study, client, mine = state.study, state.client, set(state.procs)
    if study is None:
        return
    reason = "interrupted: the sweep command was stopped; the next one runs this trial again"
    numbers = []
    try:
        with state.lock:
            for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                if t.user_attrs.get("worker_id") in mine and studies.fail_lost(study, t):
                    numbers.append(t.number)
        state.stopped = len(numbers)
        exp = client.get_run(state.parent).info.experiment_id
        runs = client.search_runs([exp], filter_string=f"tags.`atlas_lab.study` = '{state.spec.study}' and "
                                                       "tags.`atlas_lab.role` = 'trial' and "
                                                       "attributes.status = 'RUNNING'")
        for run in runs:  # the trials' runs, those not yet recorded in the trial too
            if int(run.data.tags.get("optuna.trial_number", -1)) in numbers:
                finish_run(client, run.info.run_id, "FAIL", reason, status="KILLED")
        client.set_terminated(state.parent, status="KILLED")
    except Exception as e:  # the store may be why: say so on the one line, and end
        state.cleanup_error = f"{type(e).__name__}: {e}"


def _interrupted(state: _Run, e: Interrupted, resume: str) -> int:
    """The one line of an interrupted sweep, and its exit code."""
    study = state.study
    trials = [t for t in study.get_trials(deepcopy=False) if not studies.is_superseded(study, t)]
    done = [t for t in trials if t.state in studies.FINISHED]
    counts = ", ".join(f"{sum(t.state == s for t in done)} {s.name.lower()}" for s in studies.FINISHED
                       if any(t.state == s for t in done))
    stopped = state.stopped
    what = "while writing the summary; " if state.summarizing else ""
    line = (f"interrupted ({e}) {what}study {study.study_name!r}: {len(done)} of {len(trials)} trial(s) finished"
            + (f" ({counts})" if counts else "")
            + (f", {stopped} running trial(s) stopped and queued to run again" if stopped else "")
            + (f" (the MLflow runs could not all be ended: {state.cleanup_error})" if state.cleanup_error else "")
            + f"; resume with: {resume}")
    print(line, file=sys.stderr, flush=True)
    return e.code
