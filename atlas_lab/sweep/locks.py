"""Locks that every process of a study takes in the same place: the storage itself.

A journal file or a SQLite database is guarded by an exclusive ``flock`` on ``STORE.atlas-lab.lock`` next to it
(processes of one machine, or of machines sharing a POSIX file system; Optuna's journal writes take another,
``JournalFlock``); a PostgreSQL database by a session advisory lock, which every machine that reaches the server
shares. Work that reads and then writes shared state (enqueue the grid, find or create the MLflow parent run,
fail and re-enqueue a lost trial, create and migrate a fresh store) runs under one of these, so two processes can
never both decide to write.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
from pathlib import Path

SQLITE = "sqlite:///"
LOCK_SUFFIX = ".atlas-lab.lock"


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


class JournalFlock:
    """Optuna's journal write lock (``JournalFileBackend(lock_obj=...)``: acquire, release) as an ``flock`` on
    ``JOURNAL.flock``, which the kernel releases when its holder dies: a process killed while it writes (the ranks
    of a trial's job, killed when the job ends) never blocks the study. Optuna's default, a symbolic link
    ``JOURNAL.lock``, stays behind when its holder is killed, and with a relative journal path Optuna never sees it
    as stale: every writer then waits forever, spinning. Every process that writes the journal must be atlas-lab's
    (plain Optuna takes the other lock); readers take none."""

    def __init__(self, journal: str):
        self.path = journal + ".flock"
        self._held = None

    def acquire(self) -> bool:
        self._held = file_lock(self.path)
        self._held.__enter__()
        return True

    def release(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.__exit__(None, None, None)
