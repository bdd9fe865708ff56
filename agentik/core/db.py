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
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import peewee

log = logging.getLogger(__name__)
T = TypeVar("T")

PRAGMAS = {
    "journal_mode": "wal",
    "synchronous": "normal",
    "foreign_keys": 1,
    "cache_size": -16000,
    "busy_timeout": 10000,
}


class Database:
    def __init__(self, path: str) -> None:
        self.path = path if path == ":memory:" else str(Path(path).expanduser())
        if path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.db = peewee.SqliteDatabase(self.path, pragmas=PRAGMAS, autoconnect=False)
        self._fsync = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentik-fsync")
        self._conn: sqlite3.Connection | None = None

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
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        if durable and self.path != ":memory:":
            await asyncio.get_running_loop().run_in_executor(self._fsync, self._sync_wal)
        return result

    def _sync_wal(self) -> None:
        # opened by path each time: SQLite may recreate the file after a checkpoint
        fd = os.open(self.path + "-wal", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    async def open(self, models: list[type[peewee.Model]]) -> None:
        self.db.connect()
        self.db.bind(models)
        self.db.create_tables(models, safe=True)
        self._conn = self.db.connection()

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
        self._fsync.shutdown(wait=True)
