"""Helpers shared by sub-commands (no ``register``: not a command itself)."""

from __future__ import annotations

import errno
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from ioe.settings import Settings

# typer and the settings models are imported where they are used: a collector-only sidecar
# (ioe/sidecar.py) uses the port and store helpers here without either


def settings_or_exit(config: Path | None, **args: Any) -> Settings:
    """The settings for a command, or exit 2 printing which field is wrong and where it came from."""
    import typer

    from ioe.settings import SettingsError, load_settings

    try:
        return load_settings(config, args=args)
    except SettingsError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc


def exposure_or_exit(settings: Settings) -> None:
    """Exit 2 with one line when a server would listen beyond loopback without a token."""
    problem = settings.exposure_problem()
    if problem:
        import typer

        typer.echo(problem, err=True)
        raise typer.Exit(2)


def fail(message: str) -> NoReturn:
    """Exit 2 with ``message`` as one line on stderr (a usage or environment error, not a bug)."""
    import typer

    typer.echo(" ".join(message.split()), err=True)
    raise typer.Exit(2)


def bind_or_exit(command: str, host: str, port: int, *, keep: bool = True) -> socket.socket | None:
    """A listening TCP socket on ``host:port`` (handed to the server), or exit 2 with one line
    when the address is taken or cannot be bound. With ``keep=False`` the port is only checked
    (for servers that bind their own sockets) and ``None`` comes back."""
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as exc:
        fail(f"{command}: cannot listen on {host}:{port}: {_reason(exc)}")
    family, _, _, _, address = info[0]
    try:
        sock = socket.create_server(address, family=family)
    except OSError as exc:
        taken = exc.errno == errno.EADDRINUSE
        why = "the port is already in use (another ioe or server?)" if taken else _reason(exc)
        fail(f"{command}: cannot listen on {host}:{port}: {why}")
    if keep:
        return sock
    sock.close()
    return None


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def store_missing(settings: Settings) -> bool:
    """True when the settings name a store file that does not exist (DuckDB would create it)."""
    return (
        settings.store_backend != "ducklake"
        and settings.store_path != ":memory:"
        and (not Path(settings.store_path).exists())
    )


def open_store_or_exit(command: str, settings: Settings, *, create: bool, threads: int | None = None) -> Any:
    """The writable store of ``settings`` (:func:`collector.agent.open_store`), or exit 2 with one
    line: a missing file without ``create`` (a mistyped ``--store`` must not start an empty
    store), a file another process holds, a corrupt or truncated file."""
    from collector.agent import open_store

    if store_missing(settings) and not create:
        path = settings.store_path
        fail(f"{command}: store {path}: no such file (pass --create to start a new, empty store)")
    try:
        return open_store(settings, threads=threads)
    except Exception as exc:  # StoreError, DuckDB's errors, a DuckLake catalog that does not answer
        fail(f"{command}: {store_problem(settings.store_path, exc)}")


def store_problem(path: str | Path, exc: BaseException) -> str:
    """One line saying why the store at ``path`` cannot be opened."""
    text = " ".join(str(exc).split())
    held = _HELD.search(text)
    if held:
        return (f"store {path} is in use by another process (PID {held[1]}): stop it, or read it with "
                "ioe analyze / ioe query, which take a snapshot")  # fmt: skip
    if text.startswith(f"store {path}"):
        return text
    return f"store {path}: cannot open ({text})"


_HELD = re.compile(r"Conflicting lock is held in .*?\(PID (\d+)\)")
SNAPSHOT_TRIES = 3


@contextmanager
def readable_store(command: str, path: Path) -> Iterator[Path]:
    """The path to read ``path`` from, or exit 2 with one line (missing, corrupt, truncated).

    A store a running writer holds (the sidecar, ``ioe serve``) cannot be opened by a second
    process, even read-only; it is then read from a snapshot: the file and its write-ahead log
    copied to a temporary directory (deleted afterwards), which holds what was committed when the
    copy was taken. A copy torn by a concurrent checkpoint fails to open and is taken again, up to
    :data:`SNAPSHOT_TRIES` times."""
    from collector.store import Store

    if not path.exists():
        fail(f"{command}: store {path}: no such file")
    try:
        Store(path, read_only=True).close()
    except Exception as exc:
        held = _HELD.search(" ".join(str(exc).split()))
        if not held:
            fail(f"{command}: {store_problem(path, exc)}")
        with tempfile.TemporaryDirectory(prefix="ioe-snapshot-") as tmp:
            copy = _snapshot(path, Path(tmp), held[1], command)
            import typer

            typer.echo(f"{command}: store {path} is in use by PID {held[1]}: reading a snapshot", err=True)
            yield copy
        return
    yield path


def _snapshot(path: Path, tmp: Path, pid: str, command: str) -> Path:
    from collector.store import Store

    copy = tmp / path.name
    problem: BaseException | None = None
    for _ in range(SNAPSHOT_TRIES):
        wal = Path(f"{path}.wal")
        try:
            shutil.copyfile(path, copy)
            if wal.exists():
                shutil.copyfile(wal, Path(f"{copy}.wal"))
            Store(copy, read_only=True).close()
            return copy
        except Exception as exc:  # a torn copy: take it again
            problem = exc
            Path(f"{copy}.wal").unlink(missing_ok=True)
    why = " ".join(str(problem).split())
    fail(f"{command}: store {path} is in use by PID {pid} and no consistent snapshot could be read "
         f"({why}); query it through that process's API (/api/v1/query)")  # fmt: skip


@contextmanager
def read_connection(
    command: str, store: Path | None, config: Path | None, lake_dsn: str | None, lake_data: str | None
) -> Iterator[tuple[Any, bool]]:
    """(a read-only DuckDB connection on the store a read command names, True when it is a
    lake), closed afterwards; or exit 2 with one line.

    1. ``--lake-dsn`` (with ``--lake-data``, optional: the catalog knows its data path): the
       DuckLake fleet store, attached read-only (:func:`collector.lake.open_lake_readonly`).
    2. ``--store FILE``: that file, read as :func:`readable_store` reads it (a snapshot while a
       writer holds it).
    3. Neither, with ``--config``: the store that config names (``store_backend: ducklake`` with
       its ``lake_catalog_dsn`` and ``lake_data_path``, else its ``store_path``).
    4. Neither and no config, or both ``--store`` and ``--lake-dsn``: a usage error.
    """
    if store is not None and lake_dsn:
        fail(f"{command}: give --store FILE or --lake-dsn DSN, not both")
    if store is None and not lake_dsn and config is not None:  # rule 3
        settings = settings_or_exit(config)
        if settings.store_backend == "ducklake":
            if not settings.lake_catalog_dsn:
                fail(f"{command}: config {config} names store_backend ducklake but no lake_catalog_dsn")
            lake_dsn, lake_data = settings.lake_catalog_dsn, settings.lake_data_path
        else:
            store = Path(settings.store_path)
    if lake_dsn:  # rule 1
        from collector.lake import LakeError, open_lake_readonly

        try:
            con = open_lake_readonly(lake_dsn, lake_data or "")
        except LakeError as exc:
            fail(f"{command}: {exc}")
        try:
            yield con, True
        finally:
            con.close()
        return
    if store is None:  # rule 4
        fail(f"{command}: name a store: --store FILE, --lake-dsn DSN (DuckLake), or --config FILE")
    from collector.readonly import open_readonly

    with readable_store(command, store) as path:  # rule 2
        con = open_readonly(path)
        try:
            yield con, False
        finally:
            con.close()


def epoch_ns(text: str) -> int | None:
    """Unix seconds or ISO-8601 (UTC when no zone) → ns since the epoch; None when it is neither,
    or when it is not a time in 1970-2262 (nanoseconds in 64 bits; ``inf`` and ``nan`` included)."""
    try:
        seconds = float(text)
    except ValueError:
        try:
            dt = datetime.fromisoformat(text)
        except ValueError:
            return None
        seconds = (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()
    if not 0 <= seconds < 2**63 / 1e9:  # False for NaN too
        return None
    return int(seconds * 1_000_000_000)
