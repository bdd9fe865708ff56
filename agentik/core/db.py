"""SQLite through peewee: one connection, used on the event loop, short transactions.

Why on the loop and not on a writer thread: a trip to a thread and back costs ~150 µs of CPU on
the machines we measured (docs/PERFORMANCE.md, B9), while a WAL commit with
``synchronous=NORMAL`` costs 15-40 µs. Every transaction here is a few prepared statements with
no ``await`` inside, so transactions never interleave, there is never a "database is locked",
and ``:memory:`` works. What is slow goes to a thread: the fsync that makes an acknowledged
message durable (``write(..., durable=True)``).

Durability: when ``await db.write(...)`` returns the data is committed to the WAL, safe against
a process crash. With ``durable=True`` the WAL is also fsynced before it returns, safe against
power loss; it is used for what a client was promised, the acknowledged user message. A later
write that a power loss takes is recovered like a crash (the turn gets an Error record).

One process per database file: :meth:`Database.open` takes an exclusive OS lock on
``<db>.lock`` (``flock``) and holds it until :meth:`Database.close`. Two processes on one file
would each believe the other's running turns were cut off by a crash and run queued messages
twice; the second stops instead, naming the holder's pid. The OS drops the lock when its
process ends, however it ends, so no stale lock survives a crash. ``:memory:`` is exempt.

Group commit: durable writes that commit while an fsync runs share the next one, so 500
simultaneous sends cost a handful of fsyncs, not 500 in a row. The WAL file is fsynced through
a descriptor opened once: a durable write never needs a new file descriptor, so it cannot
commit and then fail with EMFILE (a client told 500 for a message that was stored would send
it again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import peewee

try:
    import fcntl
except ImportError:  # Windows: no flock, no lock
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)
T = TypeVar("T")

PRAGMAS = {
    "journal_mode": "wal",
    "synchronous": "normal",
    "foreign_keys": 1,
    "cache_size": -16000,
    "busy_timeout": 10000,
}


class DatabaseInUse(Exception):
    """Another process holds the database file (its lock file names the pid)."""


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


class Database:
    def __init__(self, path: str) -> None:
        self.path = path if path == ":memory:" else str(Path(path).expanduser())
        if path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.db = peewee.SqliteDatabase(self.path, pragmas=PRAGMAS, autoconnect=False)
        self._fsync = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentik-fsync")
        self._conn: sqlite3.Connection | None = None
        self._wal_fd: int | None = None
        self._next_sync: asyncio.Future[None] | None = None  # the fsync new commits wait for
        self._syncing: asyncio.Future[None] | None = None  # the fsync running on the thread
        self._lock_fd: int | None = None  # <db>.lock, locked while the database is open

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("the database is not open")
        return self._conn

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        """Prepared SQL on the one connection (call it from inside ``read``/``write``)."""
        return self.conn.execute(sql, params)

    async def read(self, fn: Callable[[], T]) -> T:
        return fn()

    async def write(self, fn: Callable[[], T], *, durable: bool = False) -> T:
        """Run ``fn`` in one transaction; resolved once committed (with ``durable``, once the
        commit is on disk)."""
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = fn()
        except BaseException:
            if conn.in_transaction:  # SQLite rolled back itself after some errors (a full disk)
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        if durable and self.path != ":memory:":
            await self._synced()
        return result

    async def _synced(self) -> None:
        """Wait for an fsync of the WAL that starts after this commit (one that is already
        running may have missed it); every commit that arrives meanwhile shares it."""
        waiting = self._next_sync
        if waiting is None:
            waiting = self._next_sync = asyncio.get_running_loop().create_future()
            # retrieved here, so a failure whose waiters all left is not reported as unhandled
            waiting.add_done_callback(lambda f: f.cancelled() or f.exception())
            if self._syncing is None:
                self._start_sync()  # at once: the thread syncs while the loop commits more
        # shielded: one waiter that goes away must not cancel the fsync of the others
        await asyncio.shield(waiting)

    def _start_sync(self) -> None:
        done, self._next_sync = self._next_sync, None
        assert done is not None
        running = self._syncing = asyncio.wrap_future(self._fsync.submit(self._sync_wal))

        def finished(_: asyncio.Future[None]) -> None:
            self._syncing = None
            error = running.exception()
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)
            if self._next_sync is not None:  # commits that came during this fsync
                self._start_sync()

        running.add_done_callback(finished)

    def _sync_wal(self) -> None:
        fd = self._wal_fd
        if fd is not None and os.fstat(fd).st_ino != _inode(self.path + "-wal"):
            os.close(fd)  # the WAL was recreated (only when every connection closed it)
            fd = self._wal_fd = None
        if fd is None:
            fd = self._wal_fd = os.open(self.path + "-wal", os.O_RDONLY)
        os.fsync(fd)

    def _lock(self) -> None:
        """Take ``<db>.lock`` (see the module's doc) or raise :class:`DatabaseInUse`."""
        if self.path == ":memory:" or fcntl is None:
            return
        fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DatabaseInUse(
                f"it is in use by another process (pid {holder}); one process per SQLite "
                "database: stop that one or give this one another AGENTIK_DB_PATH"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor drops the lock
            self._lock_fd = None

    async def open(self, models: list[type[peewee.Model]]) -> None:
        self._lock()
        try:
            self._open(models)
        except BaseException:
            if not self.db.is_closed():
                self.db.close()
            self._unlock()
            raise

    def _open(self, models: list[type[peewee.Model]]) -> None:
        self.db.connect()
        self.db.bind(models)
        self.db.create_tables(models, safe=True)
        self._conn = self.db.connection()
        if self.path != ":memory:":
            # opened now, while descriptors are plenty (a database without tables has no WAL
            # yet: then at its first durable write)
            with contextlib.suppress(FileNotFoundError):
                self._wal_fd = os.open(self.path + "-wal", os.O_RDONLY)

    async def close(self) -> None:
        if self._conn is None:
            return
        self._conn = None
        if self.path != ":memory:":
            try:
                self.db.execute_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            except peewee.DatabaseError:
                log.warning("WAL checkpoint failed at shutdown", exc_info=True)
        self.db.close()
        while self._syncing is not None:
            await asyncio.wait([self._syncing])
        self._fsync.shutdown(wait=True)
        if self._wal_fd is not None:
            os.close(self._wal_fd)
            self._wal_fd = None
        self._unlock()  # last: the next process finds the database closed and checkpointed
