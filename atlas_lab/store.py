"""The stores that runs write to, below both ``lit`` (a fit's MLflow logger) and ``sweep`` (studies, trials and
the tracking server): the MLflow tracking URI, the store locks, and the one-time creation of a database store.
It imports nothing else of atlas_lab (and MLflow only when a store is created), so a logged fit never loads the
sweep package or Optuna.

Locks that every process of a study takes in the same place: the storage itself. A journal file or a SQLite
database is guarded by an exclusive ``flock`` on ``STORE.atlas-lab.lock`` next to it (processes of one machine, or
of machines sharing a POSIX file system; Optuna's journal writes take another, ``sweep.locks.JournalFlock``); a
PostgreSQL database by a session advisory lock, which every machine that reaches the server shares. Work that reads
and then writes shared state (enqueue the grid, find or create the MLflow parent run, fail and re-enqueue a lost
trial, create and migrate a fresh store) runs under one of these, so two processes can never both decide to write.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import tempfile
import time
from pathlib import Path

DEFAULT_TRACKING_URI = "sqlite:///runs/mlflow.db"
SQLITE = "sqlite:///"
LOCK_SUFFIX = ".atlas-lab.lock"


class ServerError(RuntimeError):
    """The tracking server did not start: the message names its log and the log's last line."""


def resolve_uri(uri: str | None, create: bool = True) -> str:
    """The tracking URI (default ``DEFAULT_TRACKING_URI``) with a relative SQLite path made absolute, so that every
    process, whatever its folder, finds the same file (MLflow also caches stores by URI within a process);
    ``create`` makes its folder."""
    uri = uri or DEFAULT_TRACKING_URI
    if uri.startswith(SQLITE) and not uri[len(SQLITE):].startswith("/"):
        path = Path(uri[len(SQLITE):]).resolve()
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        return SQLITE + str(path)
    return uri


def artifact_root(uri: str | None) -> Path:
    """Where an experiment created in the store ``uri`` (default ``DEFAULT_TRACKING_URI``) keeps its runs'
    artifacts, each run's in ``<this>/<run id>/artifacts``: ``artifacts/`` beside a SQLite database (runs/artifacts
    for runs/mlflow.db), else runs/artifacts in the working folder; absolute."""
    store = store_file(resolve_uri(uri, create=False))
    return (store.parent if store is not None else Path("runs")).resolve() / "artifacts"


MIN_FREE_BYTES = 1 << 20  # what a folder must have free before a sweep writes its first byte there


class NotWritable(OSError):
    """A folder a command writes in is read-only, not writable by this user, or full (``check_writable``)."""


def check_writable(folder: str | Path, min_free: int = MIN_FREE_BYTES) -> None:
    """A NotWritable (an OSError) naming ``folder`` (as given) when nothing can be written there, or less than
    ``min_free`` bytes are free: a read-only file system, a folder without write permission, a full disk. Checked on
    the folder or, where it does not exist yet, on the nearest folder above it that does (the one it will be made
    in), by a file made and removed at once: nothing is left behind."""
    folder = Path(folder)
    place = folder
    while not place.exists() and place != place.parent:
        place = place.parent
    place = place if str(place) else Path(".")
    try:
        fd, probe = tempfile.mkstemp(dir=place, prefix=".atlas-lab-probe-")
    except OSError as e:
        raise NotWritable(e.errno, e.strerror, str(folder)) from None
    try:
        os.close(fd)
    finally:
        os.unlink(probe)
    stat = os.statvfs(place)
    free = stat.f_bavail * stat.f_frsize
    if free < min_free:
        raise NotWritable(errno.ENOSPC, f"No space left on device ({free:,} bytes free; at least {min_free:,} "
                          "needed)", str(folder))


@contextlib.contextmanager
def try_file_lock(path: str | Path, timeout: float):
    """An exclusive flock on ``path`` taken within ``timeout`` seconds; yields whether it was taken (the body runs
    either way: for work that must not wait for ever on a holder that never lets go)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        deadline, held = time.monotonic() + timeout, False
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.02)
        try:
            yield held
        finally:
            if held:
                fcntl.flock(f, fcntl.LOCK_UN)


def is_postgres(url: str) -> bool:
    return url.startswith(("postgresql://", "postgresql+", "postgres://"))


def store_file(url: str) -> Path | None:
    """The file that holds a store: a journal file path, or the database of ``sqlite:///path``; None for a server
    (``postgresql://…``, ``http://…``) or an in-memory database."""
    if "://" not in url:
        return Path(url)
    if url.startswith(SQLITE) and url[len(SQLITE):] not in ("", ":memory:"):
        return Path(url[len(SQLITE):])
    return None


@contextlib.contextmanager
def file_lock(path: str | Path):
    """An exclusive flock on ``path`` (created if missing), released on exit or when the process dies."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def advisory_lock(url: str, name: str):
    """A PostgreSQL session advisory lock keyed by ``name``, held on a connection of its own; the server drops it
    if the process dies, so a crashed holder never blocks the others."""
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
    engine = sqlalchemy.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), {"key": key})
            try:
                yield
            finally:
                conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:key)"), {"key": key})
    finally:
        engine.dispose()


class StorageLock:
    """The lock of one store: a journal file path, ``sqlite:///path`` or ``postgresql://…``; ``name`` tells apart
    locks that share a PostgreSQL server (the Optuna storage and the MLflow store may be one database). Taken with
    ``with``, as often as needed (one holder at a time); an unsupported store is a ValueError when it is made."""

    def __init__(self, url: str, name: str):
        if is_postgres(url):
            self._open = lambda: advisory_lock(url, name)
        elif url.startswith(SQLITE):
            self._open = lambda: file_lock(url[len(SQLITE):] + LOCK_SUFFIX)
        elif "://" in url:
            raise ValueError(f"{url}: no lock for this kind of store (use a journal file, sqlite:/// or postgresql://)")
        else:
            self._open = lambda: file_lock(url + LOCK_SUFFIX)
        self._held = None

    def __enter__(self):
        self._held = self._open()
        return self._held.__enter__()

    def __exit__(self, *exc):
        held, self._held = self._held, None
        return held.__exit__(*exc)


def init_store(uri: str) -> None:
    """Create and migrate a database tracking store (``sqlite:///…``, ``postgresql://…``) once, under the store's lock,
    before any server or worker opens it: MLflow builds and migrates a fresh database on first open, and two
    processes doing it at once collide (``duplicate column name``). Other URIs (an http server) are left alone."""
    if not (uri.startswith(SQLITE) or is_postgres(uri)):
        return
    from mlflow.tracking import MlflowClient

    with StorageLock(uri, "atlas-lab mlflow store"):
        MlflowClient(uri).search_experiments(max_results=1)


def run_exists(client, run_id: str) -> bool:
    """Whether the store of ``client`` (an MlflowClient) holds the run: a study's journal or a checkpoint may outlive
    the MLflow store it was tracked in."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_run(run_id)
    except MlflowException as err:
        if err.error_code == "RESOURCE_DOES_NOT_EXIST":
            return False
        raise
    return True
