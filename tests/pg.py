"""A throwaway PostgreSQL cluster on 127.0.0.1 for the lake tests and benchmark.

Notes:
1. The binaries are found on ``PATH`` or under ``/usr/lib/postgresql/<version>/bin``;
   tests call :func:`find_binaries` through ``require_component`` so CI fails without them.
2. PostgreSQL refuses to run as root: as root, the cluster directory is given to ``nobody``
   and ``initdb``/``pg_ctl`` run through ``runuser -u nobody``.
3. Trust authentication on 127.0.0.1 only, the Unix socket inside the cluster directory,
   ``fsync=off`` (a test cluster need not survive a power cut); ``stop()`` is idempotent and
   the directory is removed on :meth:`PgCluster.close`.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

USER = "ioe"


def find_binaries() -> Path | None:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``, or None."""
    found = shutil.which("pg_ctl")
    candidates = [Path(found).resolve().parent] if found else []
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    for d in candidates:
        if all((d / b).exists() for b in ("initdb", "pg_ctl", "postgres")):
            return d
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgCluster:
    """``initdb`` + ``pg_ctl`` in a temp directory; ``dsn(db)`` for libpq."""

    def __init__(self, bindir: Path, *, port: int | None = None):
        self.bindir = bindir
        self.port = port or _free_port()
        self.root = Path(tempfile.mkdtemp(prefix="ioe-pg-"))
        self.data = self.root / "data"
        self._as: list[str] = []
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            os.chown(self.root, nobody.pw_uid, nobody.pw_gid)
            self._as = ["runuser", "-u", "nobody", "--"]
        self._run("initdb", "-D", str(self.data), "-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync")

    def _run(self, binary: str, *args: str) -> None:
        cmd = [*self._as, str(self.bindir / binary), *args]
        got = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=self.root)
        if got.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({got.returncode}): {got.stderr.strip()[-2000:]}")

    def start(self) -> None:
        opts = f"-h 127.0.0.1 -p {self.port} -k {self.root} -c fsync=off -c max_connections=200"
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.root / "log"),
            "-w",
            "-t",
            "30",
            "-o",
            opts,
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: clients are disconnected, as in a real outage)."""
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def create_db(self, name: str) -> str:
        """Create database ``name``; returns its libpq DSN."""
        psql = self.bindir / "psql"
        args = [str(psql), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, "-d", "postgres"]
        got = subprocess.run(
            [*args, "-qc", f'CREATE DATABASE "{name}"'], capture_output=True, text=True, timeout=30
        )
        if got.returncode != 0:
            raise RuntimeError(f"create database {name}: {got.stderr.strip()}")
        return self.dsn(name)

    def dsn(self, db: str) -> str:
        return f"dbname={db} host=127.0.0.1 port={self.port} user={USER}"

    def close(self) -> None:
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PgCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
