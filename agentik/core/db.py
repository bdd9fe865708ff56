"""SQLite through peewee, off the event loop, on one dedicated thread.

One thread owns the one connection and runs every read and write in order, so there is never a
"database is locked" and ``:memory:`` works. Writes commit before their awaitable resolves:
when ``await db.write(...)`` returns, the data is in the WAL, safe against a process crash.
``durable=True`` also fsyncs the WAL first (safe against power loss; ~0.2 ms here): it is used
for what a client was promised, the acknowledged user message. A later write that a power loss
takes is recovered like a crash (the turn gets an Error record at the next start).
"""

from __future__ import annotations

import asyncio
import logging
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
        self.db = peewee.SqliteDatabase(
            self.path, pragmas=PRAGMAS, check_same_thread=False, autoconnect=False
        )
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentik-db")
        self._closed = False

    def _run(self, fn: Callable[[], T], atomic: bool, durable: bool = False) -> T:
        if not atomic:
            return fn()
        if not durable:
            with self.db.atomic():
                return fn()
        self.db.execute_sql("PRAGMA synchronous = FULL")
        try:
            with self.db.atomic():
                return fn()
        finally:
            self.db.execute_sql("PRAGMA synchronous = NORMAL")

    async def read(self, fn: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._run, fn, False)

    async def write(self, fn: Callable[[], T], *, durable: bool = False) -> T:
        """Run ``fn`` in one transaction on the database thread; resolved after the commit
        (with ``durable``, after the commit reached the disk)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._run, fn, True, durable)

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        """Prepared SQL for hot paths (call it from inside ``read``/``write``)."""
        return self.db.execute_sql(sql, params)

    async def open(self, models: list[type[peewee.Model]]) -> None:
        def setup() -> None:
            self.db.connect()
            self.db.bind(models)
            self.db.create_tables(models, safe=True)

        await asyncio.get_running_loop().run_in_executor(self._executor, setup)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        def shutdown() -> None:
            if self.db.is_closed():
                return
            if self.path != ":memory:":
                try:
                    self.db.execute_sql("PRAGMA wal_checkpoint(TRUNCATE)")
                except peewee.DatabaseError:
                    log.warning("WAL checkpoint failed at shutdown", exc_info=True)
            self.db.close()

        await asyncio.get_running_loop().run_in_executor(self._executor, shutdown)
        self._executor.shutdown(wait=True)
