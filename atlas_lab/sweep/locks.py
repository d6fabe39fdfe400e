"""Optuna's journal write lock (``JournalFlock``). The locks of a store itself (``StorageLock``: an ``flock`` next to
a journal file or SQLite database, a PostgreSQL advisory lock) live in ``atlas_lab.store``, below ``lit`` and
``sweep``, since a fit's logger takes them too; they are imported from there for the sweep modules.
"""
from __future__ import annotations

import threading

from ..store import (LOCK_SUFFIX, SQLITE, StorageLock, advisory_lock, file_lock, is_postgres,  # noqa: F401
                     store_file)


class JournalFlock:
    """Optuna's journal write lock (``JournalFileBackend(lock_obj=...)``: acquire, release) as an ``flock`` on
    ``JOURNAL.flock``, which the kernel releases when its holder dies: a process killed while it writes (the ranks
    of a trial's job, killed when the job ends) never blocks the study. Optuna's default, a symbolic link
    ``JOURNAL.lock``, stays behind when its holder is killed, and with a relative journal path Optuna never sees it
    as stale: every writer then waits forever, spinning. Every process that writes the journal must be atlas-lab's
    (plain Optuna takes the other lock); readers take none.

    Re-entrant within a thread: a worker holds it across the claim of a trial and the record of its owner (two
    writes that a kill must never split), and the sweep command holds it while it kills its workers, so none is
    stopped in the middle of a write. Another thread of the process waits, as another process does."""

    def __init__(self, journal: str):
        self.path = journal + ".flock"
        self._held = None
        self._depth = 0
        self._thread = threading.RLock()

    def acquire(self) -> bool:
        self._thread.acquire()
        if self._depth == 0:
            try:
                held = file_lock(self.path)
                held.__enter__()
            except BaseException:
                self._thread.release()
                raise
            self._held = held
        self._depth += 1
        return True

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            held, self._held = self._held, None
            if held is not None:
                held.__exit__(None, None, None)
        self._thread.release()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()
