"""The PostgreSQL store (``AGENTIK_DATABASE_URL=postgresql://…``): the statements of
:class:`~agentik.core.store.sql.SqlStore` on asyncpg, and plugins' peewee tables on the same
connections through peewee's asyncio layer (``playhouse.pwasyncio``).

How the synchronous code of the SQLite store runs here: ``read(fn)``/``write(fn)`` take a pooled
connection and run ``fn`` in a greenlet (pwasyncio's bridge); each ``execute`` inside it, and
each peewee query a plugin runs there, suspends the greenlet while asyncpg awaits the server, so
the loop goes on. A statement's ``?`` placeholders become ``$1…`` once per shape, and asyncpg
prepares each shape once per connection (its statement cache): no call parses SQL again.

Imported only when the URL selects it (asyncpg and greenlet are the ``postgres`` extra).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import asyncpg
import peewee
from playhouse.pwasyncio import (
    AsyncPostgresqlConnection,
    AsyncPostgresqlDatabase,
    CursorAdapter,
    await_,
    greenlet_spawn,
)

from agentik.core import models
from agentik.core.db import Database
from agentik.core.store.sql import SqlStore
from agentik.core.store.url import shown_url

T = TypeVar("T")

_PLACEHOLDER = re.compile(r"\?|%s|%%")
_ROWS = re.compile(r"^\s*(SELECT|WITH|VALUES|SHOW|TABLE|EXPLAIN)\b|\bRETURNING\b", re.IGNORECASE)

# the append-only audit log, as SQLite's trigger keeps it (agentik.core.models)
_APPEND_ONLY = """
CREATE OR REPLACE FUNCTION message_append_only() RETURNS trigger AS $$
BEGIN RAISE EXCEPTION 'message is an append-only audit log'; END $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS message_append_only ON message;
CREATE TRIGGER message_append_only BEFORE UPDATE ON message
FOR EACH ROW EXECUTE FUNCTION message_append_only();
"""
# one writer at a time on the database (see write); a durable one waits for the WAL flush
_WRITE_LOCK = "SELECT pg_advisory_xact_lock(7309372542)"
_BEGIN = f"BEGIN; {_WRITE_LOCK}"
_BEGIN_DURABLE = f"BEGIN; SET LOCAL synchronous_commit TO on; {_WRITE_LOCK}"


class Shape:
    """A statement as asyncpg takes it: ``$n`` placeholders, and whether it returns rows."""

    __slots__ = ("rows", "sql")

    def __init__(self, sql: str) -> None:
        numbers = itertools.count(1)
        self.sql = _PLACEHOLDER.sub(lambda m: "%" if m[0] == "%%" else f"${next(numbers)}", sql)
        self.rows = bool(_ROWS.search(sql))


class _Connection(AsyncPostgresqlConnection):  # type: ignore[misc]
    """pwasyncio's connection, running peewee's queries through the shapes (pwasyncio's own
    prepares every statement anew: a round trip more per query)."""

    def __init__(self, conn: asyncpg.Connection, shapes: dict[str, Shape]) -> None:
        super().__init__(conn)
        self.shapes = shapes

    async def _execute(self, sql: str, params: Sequence[Any] | None = None) -> CursorAdapter:
        return await run_shape(self.conn, self.shapes, sql, params or ())


async def run_shape(
    conn: asyncpg.Connection, shapes: dict[str, Shape], sql: str, params: Sequence[Any]
) -> CursorAdapter:
    shape = shapes.get(sql)
    if shape is None:
        shape = shapes[sql] = Shape(sql)
    if shape.rows:
        rows = await conn.fetch(shape.sql, *params)
        return CursorAdapter(rows, rowcount=len(rows), description=_description(rows))
    status = await conn.execute(shape.sql, *params)
    count = status.rsplit(" ", 1)[-1]
    return CursorAdapter([], rowcount=int(count) if count.isdigit() else -1)


def _description(rows: list[asyncpg.Record]) -> list[tuple[str]]:
    return [(k,) for k in rows[0].keys()] if rows else []  # noqa: SIM118 - a Record iterates values


class _PeeweeDatabase(AsyncPostgresqlDatabase):  # type: ignore[misc]
    def get_binary_type(self) -> type:
        return bytes  # asyncpg takes bytes for bytea (peewee's default is psycopg's Binary)


class PgDatabase:
    """A pool of asyncpg connections with the interface of :class:`agentik.core.db.Database`:
    ``read``/``write`` run a function that calls :meth:`execute` (and peewee queries on models
    bound to :attr:`db`) on one connection; ``write`` in one transaction."""

    def __init__(self, url: str, pool_size: int = 10) -> None:
        self.url = url
        self.path = shown_url(url)  # where the data is, for messages (as Database.path)
        # peewee's side: plugins bind their models to it; its queries run on our connections
        self.db = _PeeweeDatabase(url, autoconnect=False)
        self._shapes: dict[str, Shape] = {}
        self._idle: list[asyncpg.Connection] = []
        self._slots = asyncio.Semaphore(pool_size)
        self._writing = asyncio.Lock()
        self._open = False

    async def open(self, tables: list[type[peewee.Model]]) -> None:
        conn = await self._connect()  # fails here, at start-up, when the server is unreachable
        self._idle.append(conn)
        self._open = True
        self.db.bind(tables)

        # a write: one instance at a time (CREATE … IF NOT EXISTS races with itself)
        await self.write(lambda: self.db.create_tables(tables, safe=True))

    async def _connect(self) -> asyncpg.Connection:
        # a commit waits for its WAL flush only when it is durable (write(durable=True) turns it
        # on for its transaction), as SQLite fsyncs only then: the rest is safe against a crash
        # of this process, not against the server's power loss (the store's contract)
        return await asyncpg.connect(
            self.url, timeout=10, server_settings={"synchronous_commit": "off"}
        )

    async def close(self) -> None:
        self._open = False
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()

    def terminate(self) -> None:
        """Drop every connection at once, as a crash of this process would: nothing more
        reaches the server (a transaction in flight is rolled back there)."""
        self._open = False
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.terminate()

    # ``fn`` runs in a greenlet that the queries suspend: each runs on a connection of its own

    def execute(self, sql: str, params: Sequence[Any] = ()) -> CursorAdapter:
        """A statement (``?`` placeholders) on the connection of the ``read``/``write`` this
        runs in."""
        conn = self.db._state.conn
        if conn is None:
            raise RuntimeError("execute() outside read()/write()")
        return await_(run_shape(conn.conn, self._shapes, sql, params))

    async def read(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` outside a transaction (each statement sees what is committed)."""
        return await self._run(fn)

    async def write(self, fn: Callable[[], T], *, durable: bool = False) -> T:
        """Run ``fn`` in one transaction; resolved once committed (with ``durable``, once the
        server flushed its WAL: ``synchronous_commit``). A write that started completes even if
        its caller is cancelled (the store's contract): it runs in a task of its own.

        Writes run one at a time, as on SQLite (whose writer holds the file): a plugin's
        read-then-insert in one write sees no other write between the two. In this process an
        asyncio lock queues them (no pooled connection waits idle); across processes on one
        database an advisory lock, taken in the same round trip as ``BEGIN``."""
        return await asyncio.shield(self._write(fn, durable))

    async def _write(self, fn: Callable[[], T], durable: bool) -> T:
        async with self._writing:
            return await self._run(fn, _BEGIN_DURABLE if durable else _BEGIN)

    async def _run(self, fn: Callable[[], T], begin: str | None = None) -> T:
        if not self._open:
            raise RuntimeError("the database is not open")
        await self._slots.acquire()
        conn: asyncpg.Connection | None = None
        reusable = False
        try:
            conn = self._idle.pop() if self._idle else await self._connect()
            # pwasyncio keeps a connection per task: this task's is ours while fn runs
            self.db._state.set_connection(_Connection(conn, self._shapes))
            try:
                result = await (self._transaction(conn, fn, begin) if begin else greenlet_spawn(fn))
            finally:
                self.db._state.reset()
            reusable = True
            return cast(T, result)
        except Exception as e:
            # the server answered (an error of the statement) and the transaction is over
            reusable = conn is not None and not conn.is_closed() and not conn.is_in_transaction()
            if isinstance(e, asyncpg.PostgresError):
                raise _peewee_error(e) from e
            raise
        finally:
            if conn is not None:
                # a connection an interruption left mid-statement is never reused
                if reusable and self._open:
                    self._idle.append(conn)
                else:
                    conn.terminate()
            self._slots.release()

    @staticmethod
    async def _transaction(conn: asyncpg.Connection, fn: Callable[[], T], begin: str) -> T:
        await conn.execute(begin)
        try:
            result = await greenlet_spawn(fn)
        except Exception:
            with contextlib.suppress(Exception):  # a lost connection: the server rolled back
                await conn.execute("ROLLBACK")
            raise
        await conn.execute("COMMIT")
        return cast(T, result)


def _peewee_error(e: asyncpg.PostgresError) -> Exception:
    """The peewee exception a plugin catches on both databases (IntegrityError ...)."""
    state = getattr(e, "sqlstate", "") or ""
    if state.startswith("23"):
        return peewee.IntegrityError(str(e))
    if state.startswith(("08", "57", "53")):
        return peewee.OperationalError(str(e))
    return peewee.DatabaseError(str(e))


class PostgresStore(SqlStore):
    db: PgDatabase

    TOKEN_TOTALS_SQL = (
        "SELECT count(*), "
        "coalesce(sum((payload_json::jsonb #>> '{tokens,input}')::bigint), 0)::bigint, "
        "coalesce(sum((payload_json::jsonb #>> '{tokens,output}')::bigint), 0)::bigint, "
        "count(*) - count((payload_json::jsonb #>> '{tokens,input}')::bigint) "
        "FROM message WHERE kind = 'assistant'"
    )
    CALL_TURN_SQL = (
        "SELECT turn_id FROM message WHERE conversation_id = ? AND kind = 'tool_call' "
        "AND payload_json::jsonb ->> 'callId' = ? ORDER BY seq DESC LIMIT 1"
    )

    def __init__(self, db: PgDatabase) -> None:
        self.db = db
        (usage,) = models.for_agent(models.BackgroundUsage)
        self._usage = cast(type[models.BackgroundUsage], usage)

    async def open(self) -> None:
        await self.db.open(models.MODELS)
        self.db.db.bind([self._usage])
        await self.db.write(lambda: self.db.execute(_APPEND_ONLY))

    async def add_models(self, models: list[type[peewee.Model]]) -> Database | None:
        self.db.db.bind(models)

        await self.db.write(lambda: self.db.db.create_tables(models, safe=True))
        return cast(Database, self.db)  # the same read/write/execute
