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

T = TypeVar("T")

_PLACEHOLDER = re.compile(r"\?|%s|%%")
_ROWS = re.compile(r"^\s*(SELECT|WITH|VALUES)\b|\bRETURNING\b", re.IGNORECASE)

# the append-only audit log, as SQLite's trigger keeps it (agentik.core.models)
_APPEND_ONLY = """
CREATE OR REPLACE FUNCTION message_append_only() RETURNS trigger AS $$
BEGIN RAISE EXCEPTION 'message is an append-only audit log'; END $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS message_append_only ON message;
CREATE TRIGGER message_append_only BEFORE UPDATE ON message
FOR EACH ROW EXECUTE FUNCTION message_append_only();
"""
# one instance creates the tables at a time (CREATE … IF NOT EXISTS races with itself)
_SCHEMA_LOCK = "SELECT pg_advisory_xact_lock(7309372541)"


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


class PgDatabase:
    """A pool of asyncpg connections with the interface of :class:`agentik.core.db.Database`:
    ``read``/``write`` run a function that calls :meth:`execute` (and peewee queries on models
    bound to :attr:`db`) on one connection; ``write`` in one transaction."""

    def __init__(self, url: str, pool_size: int = 10) -> None:
        self.url = url
        # peewee's side: plugins bind their models to it; its queries run on our connections
        self.db = AsyncPostgresqlDatabase(url, autoconnect=False)
        self._shapes: dict[str, Shape] = {}
        self._idle: list[asyncpg.Connection] = []
        self._slots = asyncio.Semaphore(pool_size)
        self._open = False

    async def open(self, tables: list[type[peewee.Model]]) -> None:
        conn = await self._connect()  # fails here, at start-up, when the server is unreachable
        self._idle.append(conn)
        self._open = True
        self.db.bind(tables)

        def create() -> None:
            self.execute(_SCHEMA_LOCK)
            self.db.create_tables(tables, safe=True)

        await self.write(create)

    async def _connect(self) -> asyncpg.Connection:
        return await asyncpg.connect(self.url, timeout=10)

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
        return await self._run(fn, write=False)

    async def write(self, fn: Callable[[], T], *, durable: bool = False) -> T:
        """Run ``fn`` in one transaction; resolved once committed (a commit is durable: the
        server's ``synchronous_commit``). A write that started completes even if its caller is
        cancelled (the store's contract): it runs in a task of its own."""
        return await asyncio.shield(self._run(fn, write=True))

    async def _run(self, fn: Callable[[], T], *, write: bool) -> T:
        if not self._open:
            raise RuntimeError("the database is not open")
        await self._slots.acquire()
        conn: asyncpg.Connection | None = None
        clean = False
        try:
            conn = self._idle.pop() if self._idle else await self._connect()
            # pwasyncio keeps a connection per task: this task's is ours while fn runs
            self.db._state.set_connection(_Connection(conn, self._shapes))
            try:
                if write:
                    async with conn.transaction():
                        result = await greenlet_spawn(fn)
                else:
                    result = await greenlet_spawn(fn)
            finally:
                self.db._state.reset()
            clean = True
            return cast(T, result)
        except asyncpg.PostgresError as e:
            clean = not conn.is_closed() if conn is not None else False
            raise _peewee_error(e) from e
        finally:
            if conn is not None:
                # a connection an interruption left mid-statement is not reused
                if clean and self._open and not conn.is_in_transaction():
                    self._idle.append(conn)
                else:
                    conn.terminate()
            self._slots.release()


def _peewee_error(e: asyncpg.PostgresError) -> Exception:
    """The peewee exception a plugin catches on both databases (IntegrityError ...)."""
    state = getattr(e, "sqlstate", "") or ""
    if state.startswith("23"):
        return peewee.IntegrityError(str(e))
    if state.startswith(("08", "57", "53")):
        return peewee.OperationalError(str(e))
    return peewee.DatabaseError(str(e))


class PostgresStore(SqlStore):
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

        def create() -> None:
            self.db.execute(_SCHEMA_LOCK)
            self.db.db.create_tables(models, safe=True)

        await self.db.write(create)
        return cast(Database, self.db)  # the same read/write/execute

    async def add_user_message(self, msg: Any, *, idempotency_key: str | None = None) -> Any:
        # two sends with one key at once: the second's insert fails on the key's unique index
        # (the first committed meanwhile); once more, it finds the first's turn
        try:
            return await super().add_user_message(msg, idempotency_key=idempotency_key)
        except peewee.IntegrityError:
            if idempotency_key is None:
                raise
            return await super().add_user_message(msg, idempotency_key=idempotency_key)

    async def aliased_conversation(self, namespace: str, key: str, new: Any) -> Any:
        try:
            return await super().aliased_conversation(namespace, key, new)
        except peewee.IntegrityError:  # another created it meanwhile: now it is found
            return await super().aliased_conversation(namespace, key, new)
