"""A PostgreSQL server of the test run's own: initdb into a temporary folder, started on a free loopback port.

The server binaries come from the Debian ``postgresql`` package (the set-up step ``make system-deps`` installs it;
``make test`` runs it first) or any ``initdb`` on PATH. PostgreSQL refuses to run as root, so under root the server
runs as the ``postgres`` user. Without binaries (or psycopg) the tests that need it fail with a line naming the
set-up step, so no run can pass without exercising PostgreSQL.
"""
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest


def _initdb() -> str | None:
    found = shutil.which("initdb")
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return found or (candidates[-1] if candidates else None)


def unavailable(reason: str):
    pytest.fail(f"PostgreSQL server needed: {reason}; run `make system-deps` (as root) first")


class Server:
    def __init__(self):
        try:
            import psycopg  # noqa: F401
        except ImportError:
            unavailable("psycopg is not installed (pip install 'atlas-lab[postgres]')")
        initdb = _initdb()
        if initdb is None:
            unavailable("no PostgreSQL server binaries (initdb) found")
        self.bin = os.path.dirname(initdb)
        self.user = None
        if os.geteuid() == 0:
            try:
                self.user = pwd.getpwnam("postgres")
            except KeyError:
                unavailable("running as root and no 'postgres' user to run the server as")
        # a folder of its own under /tmp: pytest's folders are private to root, and the server may run as postgres
        self.folder = folder = Path(tempfile.mkdtemp(prefix="atlas-lab-pg-"))
        self.data, self.log = folder / "data", folder / "server.log"
        if self.user:
            os.chown(folder, self.user.pw_uid, self.user.pw_gid)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o",
                  f"-p {self.port} -k {folder} -c listen_addresses=127.0.0.1 -c max_connections=200", "start")
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool, *args):
        done = subprocess.run([os.path.join(self.bin, tool), *args], capture_output=True, text=True,
                              user=self.user.pw_uid if self.user else None, timeout=120)
        if done.returncode != 0:
            unavailable(f"{tool} failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")

    def database(self) -> str:
        """A fresh, empty database; returns its URL."""
        import psycopg

        name = "t" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url.rsplit("/", 1)[0] + "/" + name

    def stop(self):
        subprocess.run([os.path.join(self.bin, "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"],
                       capture_output=True, user=self.user.pw_uid if self.user else None, timeout=60)
        shutil.rmtree(self.folder, ignore_errors=True)
