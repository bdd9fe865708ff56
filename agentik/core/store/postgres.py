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
import contextvars
import itertools
import os
import re
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
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
from agentik.core.db import Database, DatabaseInUse
from agentik.core.events import SharedEvents
from agentik.core.store.base import Lease, LeaseLost, SharedStore
from agentik.core.store.sql import SqlStore
from agentik.core.store.url import shown_url
from agentik.core.turns import TurnRecord, TurnState, TurnUpdate
from agentik.core.types import ConversationInfo

T = TypeVar("T")


#: the lease the writes of this task are fenced by (set by the task that runs a conversation's
#: turns; copied into the tasks it starts, and so into each write's own task)
FENCE: contextvars.ContextVar[Lease | None] = contextvars.ContextVar("agentik_fence", default=None)

_PLACEHOLDER = re.compile(r"\?|%s|%%")
_ROWS = re.compile(r"^\s*(SELECT|WITH|VALUES|SHOW|TABLE|EXPLAIN)\b|\bRETURNING\b", re.IGNORECASE)

# the append-only audit log, as SQLite's trigger keeps it (agentik.core.models)
# created once: a DROP/CREATE TRIGGER at every start locked the message table (ACCESS
# EXCLUSIVE) while the other instances ran turns
_APPEND_ONLY = """
CREATE OR REPLACE FUNCTION message_append_only() RETURNS trigger AS $$
BEGIN RAISE EXCEPTION 'message is an append-only audit log'; END $$ LANGUAGE plpgsql;
DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_trigger
                 WHERE tgname = 'message_append_only' AND tgrelid = 'message'::regclass) THEN
    CREATE TRIGGER message_append_only BEFORE UPDATE ON message
    FOR EACH ROW EXECUTE FUNCTION message_append_only();
  END IF;
END $$
"""
# the tables and indexes of the schema in use
_RELATIONS = (
    "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = current_schema()"
)
# a durable write waits for the WAL flush (see write)
_BEGIN = "BEGIN"
_BEGIN_DURABLE = "BEGIN; SET LOCAL synchronous_commit TO on"
# instances creating the tables at once: one at a time (CREATE … IF NOT EXISTS races itself)
_BEGIN_SCHEMA = "BEGIN; SELECT pg_advisory_xact_lock(7309372542)"


# the lock of one instance per schema (hashtext: the advisory lock's key from its name)
_INSTANCE_LOCK = "(hashtext('agentik instance ' || current_schema()) & 2147483647)"
_TAKE_INSTANCE_LOCK = f"SELECT pg_try_advisory_lock({_INSTANCE_LOCK})"
_INSTANCE_LOCK_HOLDER = f"""
SELECT a.application_name || ' at ' || coalesce(host(a.client_addr), 'local socket')
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.classid = 0
  AND l.objid = {_INSTANCE_LOCK}::oid
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
LIMIT 1
"""
_APPLICATION_NAME = f"agentik pid {os.getpid()} on {socket.gethostname()}"[:63]

# a periodic job's lock (two keys: never the instance lock's one-key form): held by the
# session of the instance that runs it, so it is free again the moment that session ends
_TAKE_JOB_LOCK = (
    "SELECT pg_try_advisory_lock(hashtext('agentik job ' || current_schema()), hashtext($1))"
)
#: seconds a leader's check may take before its connection counts as lost
_LEAD_TIMEOUT = 5.0

# a page of the audit log cut where its payloads' sizes (characters, as SQLite's store counts
# them) pass max_bytes; the first message always comes
_CUT_PAGE = """
SELECT id, kind, created_at, payload_json FROM (
  SELECT *, row_number() OVER (ORDER BY seq) AS n,
         sum(length(payload_json)) OVER (ORDER BY seq) AS size
  FROM (SELECT seq, id, kind, created_at, payload_json FROM message
        WHERE conversation_id = ? AND seq > ? ORDER BY seq LIMIT ? OFFSET ?) page
) cut WHERE n = 1 OR size <= ? ORDER BY seq
"""

# --- many instances on one database (issue 26, item 2): leases, fencing, claiming turns ------
_FENCE = (
    "SELECT 1 FROM conversation_lease WHERE conversation_id = ? AND owner = ? AND epoch = ? "
    "FOR SHARE"
)
_HEARTBEAT = (
    "INSERT INTO agentik_instance (id, expires_at) VALUES (?, now() + make_interval(secs => ?)) "
    "ON CONFLICT (id) DO UPDATE SET expires_at = EXCLUDED.expires_at"
)
# an instance also holds a session lock of its own while its process lives: when it dies
# (kill -9) the server drops it at once, and its conversations are taken over without waiting
# for its heartbeat to expire (which still covers one that hangs: SIGSTOP, a cut network)
_LIVE_KEY = "hashtext('agentik instance ' || current_schema()), hashtext({})"
_HOLD_LIVE = f"SELECT pg_try_advisory_lock({_LIVE_KEY.format('$1')})"
# the owner of lease l (joined with its instance i) is gone
_GONE = (
    "(i.expires_at IS NULL OR i.expires_at <= now() "
    f"OR pg_try_advisory_xact_lock({_LIVE_KEY.format('l.owner')}))"
)
# the other instances alive now (beating, and their process lives)
_OTHERS_ALIVE = (
    "SELECT count(*) FROM agentik_instance WHERE id <> ? AND expires_at > now() "
    f"AND NOT pg_try_advisory_xact_lock({_LIVE_KEY.format('id')})"
)
# the conversation's lease is held by another instance alive now
_HELD_ELSEWHERE = (
    "SELECT count(*) FROM conversation_lease l JOIN agentik_instance i ON i.id = l.owner "
    "WHERE l.conversation_id = ? AND l.owner <> ? AND i.expires_at > now() "
    f"AND NOT pg_try_advisory_xact_lock({_LIVE_KEY.format('l.owner')})"
)
# sends and answers to one conversation from several instances: one after the other
# (NO KEY: the owner's writes of the conversation's rows check their foreign key with a KEY
# SHARE lock, which this does not block)
_SERIALIZE = "SELECT 1 FROM conversation WHERE id = ? FOR NO KEY UPDATE"
# a conversation's lease for ``owner``: kept (same epoch) if it is its already, taken (epoch + 1)
# if free or if its owner's heartbeat expired; no row: a live instance holds it
# (and the owner before: a statement's CTE reads the row as it was)
_ACQUIRE = (
    """
WITH before AS (SELECT owner FROM conversation_lease WHERE conversation_id = ?)
INSERT INTO conversation_lease AS l (conversation_id, owner, epoch) VALUES (?, ?, 1)
ON CONFLICT (conversation_id) DO UPDATE
SET owner = EXCLUDED.owner,
    epoch = l.epoch + CASE WHEN l.owner = EXCLUDED.owner THEN 0 ELSE 1 END
WHERE l.owner = EXCLUDED.owner OR NOT EXISTS (
    SELECT 1 FROM agentik_instance i WHERE i.id = l.owner AND i.expires_at > now())
  OR (?::boolean AND pg_try_advisory_xact_lock("""
    + _LIVE_KEY.format("l.owner")
    + """))
RETURNING epoch, (SELECT owner FROM before)
"""
)
_RELEASE = "DELETE FROM conversation_lease WHERE conversation_id = ? AND owner = ? AND epoch = ?"
# a delete takes the lease's row first, as a fenced write (its FOR SHARE, then the conversation's
# row: a message's foreign key, a touch) and an acquire do: the cascade from the conversation's
# row reached the lease last, and a delete and the owner's write deadlocked
_DELETE_LEASE = "DELETE FROM conversation_lease WHERE conversation_id = ?"
# the temporary conversations no live instance owns (their lease free, or their owner gone),
# deleted, with no turn to run (queued, or running: the sweeper takes those over)
# the temporary conversations no live instance owns: their lease free, or their owner's
# heartbeat over (not its lock: a live instance whose connection blipped looks gone by its lock
# until it beats again, and a deletion is not undone as a sweep's take-over is)
_ORPHAN_TEMPORARIES = """
SELECT tc.conversation_id FROM temporary_conversation tc
LEFT JOIN conversation_lease l ON l.conversation_id = tc.conversation_id
LEFT JOIN agentik_instance i ON i.id = l.owner
WHERE l.owner IS NULL OR i.expires_at IS NULL OR i.expires_at <= now()
"""
# then, in one transaction: their leases first (the order of a fenced write and a delete), the
# conversations' rows locked (a send waits, then finds none), and in a statement of its own
# (which sees the sends committed before the lock) those with no turn to run are deleted
_END_LEASES = """
DELETE FROM conversation_lease WHERE conversation_id = ANY(?::text[])
  AND owner NOT IN (SELECT id FROM agentik_instance WHERE expires_at > now())
"""
_LOCK_UNOWNED = """
SELECT c.id FROM conversation c WHERE c.id = ANY(?::text[])
  AND NOT EXISTS (SELECT 1 FROM conversation_lease l WHERE l.conversation_id = c.id)
FOR UPDATE OF c
"""
_LOCK_CONVERSATION = "SELECT 1 FROM conversation WHERE id = ? FOR UPDATE"
_END_TEMPORARY = """
DELETE FROM conversation c WHERE c.id = ANY(?::text[])
  AND NOT EXISTS (SELECT 1 FROM turn t WHERE t.conversation_id = c.id
                  AND t.state IN ('queued', 'running'))
RETURNING c.id
"""
# the oldest queued turn this instance may run: first of its conversation's queue, none of its
# conversation's turns running or waiting, its conversation free, this instance's or its owner
# gone; a row another claim has locked is skipped, not waited for
_CLAIMABLE = (
    """
SELECT t.id FROM turn t
LEFT JOIN conversation_lease l ON l.conversation_id = t.conversation_id
LEFT JOIN agentik_instance i ON i.id = l.owner
WHERE t.state = 'queued'
  AND (l.owner IS NULL OR l.owner = ? OR """
    + _GONE
    + """)
  AND NOT EXISTS (SELECT 1 FROM turn o WHERE o.conversation_id = t.conversation_id
                  AND (o.state IN ('running', 'waiting') OR (o.state = 'queued' AND o.seq < t.seq)))
ORDER BY t.seq LIMIT 1
FOR UPDATE OF t SKIP LOCKED
"""
)
# conversations with turns to run (queued, or running: answered, or cut by their owner's end)
# that no other live instance owns, and whether this one holds their lease: the sweeper's.
# Those free or this instance's own are left out while a turn of theirs waits: the turns
# queued behind it cannot run before its answer, which takes them up (a sweep refreshed them
# at every beat; an evicted one was taken up again, its queue ended with resume_queued off).
# (CASE: the owner is tried for gone, its lock taken a moment, only when it is another one)
_ORPHANED = (
    """
SELECT DISTINCT t.conversation_id, l.owner IS NOT NULL AND l.owner = ? FROM turn t
LEFT JOIN conversation_lease l ON l.conversation_id = t.conversation_id
LEFT JOIN agentik_instance i ON i.id = l.owner
WHERE t.state IN ('queued', 'running') AND CASE
  WHEN l.owner IS NULL OR l.owner = ? THEN NOT EXISTS (SELECT 1 FROM turn w
                                    WHERE w.conversation_id = t.conversation_id
                                      AND w.state = 'waiting')
  ELSE """
    + _GONE
    + """ END
"""
)


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

    def __init__(self, url: str, pool_size: int = 10, *, exclusive: bool = False) -> None:
        self.url = url
        self.path = shown_url(url)  # where the data is, for messages (as Database.path)
        # peewee's side: plugins bind their models to it; its queries run on our connections
        self.db = _PeeweeDatabase(url, autoconnect=False)
        self._shapes: dict[str, Shape] = {}
        self._idle: list[asyncpg.Connection] = []
        self._slots = asyncio.Semaphore(pool_size)
        self._writing = asyncio.Lock()
        # exclusive: one instance per schema (as SQLite's file lock), a session advisory
        # lock held by a connection kept out of the pool; off by default (many instances)
        self.exclusive = exclusive
        self._holder: asyncpg.Connection | None = None
        #: the connection of this instance's heartbeat, out of the pool (a beat never waits
        #: for writes), holding the instance's session lock (see _LIVE_KEY)
        self._beating: asyncpg.Connection | None = None
        self._alive_as: str | None = None  # the instance whose lock _beating holds
        self._open = False
        #: notification channels this process listens on: callback and "caught up" callback
        self._channels: dict[str, tuple[Callable[[str], None], Callable[[], None] | None]] = {}
        self._listener: asyncpg.Connection | None = None
        self._relisten: asyncio.Task[None] | None = None
        self.schema = "public"  # the schema the tables are in (channels are per database)

    async def open(self, tables: list[type[peewee.Model]]) -> None:
        conn = await self._connect()  # fails here, at start-up, when the server is unreachable
        self.schema = str(await conn.fetchval("SELECT current_schema()"))
        if self.exclusive:
            await self._hold(conn)
        else:
            self._idle.append(conn)
        self._open = True
        self.db.bind(tables)

        await self.create_tables(lambda: self.create_missing(tables))

    async def create_tables(self, fn: Callable[[], T]) -> T:
        """A write that creates tables: one instance at a time (CREATE … IF NOT EXISTS races
        with itself)."""
        async with self._writing:
            return await self._run(fn, _BEGIN_SCHEMA)

    def create_missing(self, models: Sequence[type[peewee.Model]]) -> None:
        """Create the tables and indexes of ``models`` that the schema lacks (in a
        :meth:`create_tables` function), and touch none that is there: CREATE … IF NOT
        EXISTS locks a table it finds (SHARE, until the commit), so a starting instance's
        schema transaction, holding the locks of several tables, deadlocked with the turns
        the other instances were writing."""
        there = {str(r[0]) for r in self.execute(_RELATIONS).fetchall()}
        missing = [m for m in models if not _complete(m, there)]
        if missing:
            self.db.create_tables(missing, safe=True)

    async def beat(self, sql: str, params: Sequence[Any], instance: str) -> bool:
        """The heartbeat statement of ``instance``, on a connection of its own that holds the
        instance's session lock while this process lives (taken again after a reconnect);
        True when this beat took the lock (the first, or after the connection was lost)."""
        if not self._open:  # closed, or terminated (a crash): never alive again
            raise RuntimeError("the database is not open")
        conn = self._beating
        if conn is None or conn.is_closed():
            try:
                conn = self._beating = await self._connect()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as e:
                raise _peewee_error(e) from e
            self._alive_as = None
        took = False
        try:
            if self._alive_as != instance and await conn.fetchval(_HOLD_LIVE, instance):
                self._alive_as, took = instance, True
            await run_shape(conn, self._shapes, sql, params)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as e:
            conn.terminate()
            self._beating = None
            raise _peewee_error(e) from e
        return took

    async def _connect(self) -> asyncpg.Connection:
        # a commit waits for its WAL flush only when it is durable (write(durable=True) turns it
        # on for its transaction), as SQLite fsyncs only then: the rest is safe against a crash
        # of this process, not against the server's power loss (the store's contract)
        settings = {"synchronous_commit": "off", "application_name": _APPLICATION_NAME}
        return await asyncpg.connect(self.url, timeout=10, server_settings=settings)

    async def _hold(self, conn: asyncpg.Connection) -> None:
        """Take the schema's instance lock on a connection of its own, kept until close, or
        raise DatabaseInUse naming the holder (its application_name: pid and host)."""
        # a few tries: the server ends the session of an instance just killed (kill -9, and
        # with it its lock) when it notices the closed socket, a moment later
        for _ in range(30):
            if await conn.fetchval(_TAKE_INSTANCE_LOCK):
                self._holder = conn
                return
            await asyncio.sleep(0.1)
        holder = await conn.fetchval(_INSTANCE_LOCK_HOLDER)
        await conn.close()
        raise DatabaseInUse(
            f"it is in use by another agentik ({holder or 'unknown'}); one instance per "
            "database (and schema) for now: stop that one or give this one another database"
        )

    async def close(self) -> None:
        self._open = False
        if self._relisten is not None:
            self._relisten.cancel()
        idle, self._idle = self._idle, []
        if self._listener is not None:
            idle.append(self._listener)
            self._listener = None
        for held in (self._beating, self._holder):  # last: the locks go with them
            if held is not None:
                idle.append(held)
        self._beating = self._holder = None
        for conn in idle:
            await conn.close()

    async def _pooled(self) -> asyncpg.Connection:
        """An idle connection, or a new one: one the server closed while it was idle (a restart
        of the server) is dropped here, so the request goes on on a new connection."""
        while self._idle:
            conn = self._idle.pop()
            if not conn.is_closed():
                return conn
            conn.terminate()
        return await self._connect()

    def terminate(self) -> None:
        """Drop every connection at once, as a crash of this process would: nothing more
        reaches the server (a transaction in flight is rolled back there)."""
        self._open = False
        if self._relisten is not None:
            self._relisten.cancel()
        idle, self._idle = self._idle, []
        if self._listener is not None:
            idle.append(self._listener)
            self._listener = None
        for held in (self._beating, self._holder):
            if held is not None:
                idle.append(held)
        self._beating = self._holder = None
        for conn in idle:
            conn.terminate()

    # --- notifications between instances on one database ------------------------------------

    def channel(self, name: str) -> str:
        """The server's channel for ``name`` in this schema: channels are per database, and
        instances on other schemas of it (tests, several agents) must not hear each other."""
        return f"agentik {name} {self.schema}"[:63]

    async def notify(self, name: str, payload: str = "") -> None:
        """Tell every instance listening on ``name`` (this one too), now: outside a
        transaction, so no write waits for it. Payloads are short (the server caps them at
        8000 bytes): what changed is read from the tables."""
        channel = self.channel(name)
        await self.read(lambda: self.execute("SELECT pg_notify(?, ?)", (channel, payload)))

    async def listen(
        self,
        name: str,
        callback: Callable[[str], None],
        caught_up: Callable[[], None] | None = None,
    ) -> None:
        """Call ``callback(payload)`` on the loop for each notification on ``name``. Delivery
        is at most once: when the listening connection is lost, it is opened again (retrying
        while the server is away) and ``caught_up()`` is called once it listens again, so the
        listener reads what it may have missed from the tables."""
        self._channels[name] = (callback, caught_up)
        if self._listener is None:
            self._listener = await self._listening()
        else:
            await self._listener.add_listener(self.channel(name), self._dispatch)

    async def _listening(self) -> asyncpg.Connection:
        conn = await self._connect()
        conn.add_termination_listener(self._listener_lost)
        for name in self._channels:
            await conn.add_listener(self.channel(name), self._dispatch)
        return conn

    def _dispatch(self, _conn: Any, _pid: int, channel: str, payload: str) -> None:
        for name, (callback, _) in self._channels.items():
            if self.channel(name) == channel:
                callback(payload)

    def _listener_lost(self, _conn: Any) -> None:
        self._listener = None
        if self._open and (self._relisten is None or self._relisten.done()):
            self._relisten = asyncio.get_running_loop().create_task(self._listen_again())

    async def _listen_again(self) -> None:
        delay = 0.1
        while self._open and self._listener is None:
            try:
                self._listener = await self._listening()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            for _, caught_up in list(self._channels.values()):
                if caught_up is not None:
                    caught_up()

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

        In this process writes run one at a time, as on SQLite (whose writer holds the file): a
        plugin's read-then-insert in one write sees no other write of this process between the
        two (an asyncio lock queues them: no pooled connection waits idle). Across instances a
        conversation's writes are serialized by its owner's lease (the fence, below) and its
        sends by a lock on its row (PostgresStore._serialize)."""
        return await asyncio.shield(self._write(fn, durable))

    async def _write(self, fn: Callable[[], T], durable: bool) -> T:
        fence = FENCE.get()
        if fence is not None:
            fn = _fenced(self, fence, fn)
        async with self._writing:
            return await self._run(fn, _BEGIN_DURABLE if durable else _BEGIN)

    async def _run(self, fn: Callable[[], T], begin: str | None = None) -> T:
        if not self._open:
            raise RuntimeError("the database is not open")
        await self._slots.acquire()
        conn: asyncpg.Connection | None = None
        reusable = False
        try:
            conn = await self._pooled()
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
            if isinstance(
                e, asyncpg.PostgresError | asyncpg.InterfaceError | OSError | TimeoutError
            ):
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


def _complete(model: type[peewee.Model], there: set[str]) -> bool:
    """Whether the model's table and all its indexes are among the relations ``there``."""
    names = [model._meta.table_name, *(i._name for i in model._meta.fields_to_index())]
    return all(name in there for name in names)


def _fenced(db: PgDatabase, fence: Lease, fn: Callable[[], T]) -> Callable[[], T]:
    def checked() -> T:
        # FOR SHARE: a takeover (an UPDATE of the lease) waits for this write's commit
        row = db.execute(_FENCE, (fence.conversation_id, fence.owner, fence.epoch)).fetchone()
        if row is None:
            raise LeaseLost(
                f"conversation {fence.conversation_id}: epoch {fence.epoch} of {fence.owner} "
                "is over (another instance took it over)"
            )
        return fn()

    return checked


def _peewee_error(e: Exception) -> Exception:
    """The peewee exception a plugin catches on both databases (IntegrityError ...); a lost or
    refused connection is an OperationalError (the HTTP layer answers 503, retry), never the
    ConnectionError a client's hang-up is."""
    if not isinstance(e, asyncpg.PostgresError):
        return peewee.OperationalError(f"PostgreSQL: {type(e).__name__}: {e}")
    state = getattr(e, "sqlstate", "") or ""
    if state.startswith("23"):
        return peewee.IntegrityError(str(e))
    if state.startswith(("08", "57", "53")):
        return peewee.OperationalError(str(e))
    return peewee.DatabaseError(str(e))


class PgLeader:
    """Periodic jobs on one instance at a time (:class:`agentik.core.jobs.Leader`): a session
    advisory lock per job, taken with ``pg_try_advisory_lock`` on a connection held for them.
    The server frees a lock when its session ends (a stop, a crash, a lost connection): the
    next instance to ask takes it; this one learns it lost it when the connection is lost
    (seen at once, or at its next check) and stops the job."""

    def __init__(self, db: PgDatabase) -> None:
        self.db = db
        self._conn: asyncpg.Connection | None = None
        self._held: dict[str, asyncio.Event] = {}  # the jobs it leads: set when lost
        self._asking = asyncio.Lock()  # one question at a time on the one connection

    async def lead(self, job: str) -> asyncio.Event | None:
        async with self._asking:
            return await self._lead(job)

    async def _lead(self, job: str) -> asyncio.Event | None:
        try:
            if self._conn is None or self._conn.is_closed():
                self._lost()
                conn = self._conn = await self.db._connect()
                conn.add_termination_listener(lambda c: self._lost() if c is self._conn else None)
            if job in self._held:  # a live session still holds its session locks
                await self._conn.fetchval("SELECT 1", timeout=_LEAD_TIMEOUT)
            elif await self._conn.fetchval(_TAKE_JOB_LOCK, job, timeout=_LEAD_TIMEOUT):
                self._held[job] = asyncio.Event()
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
            self._lost()
            return None
        return self._held.get(job)

    def _lost(self) -> None:
        held, self._held = self._held, {}
        for lost in held.values():
            lost.set()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()  # its locks go with it, on the server too

    async def close(self) -> None:
        conn, self._conn, self._held = self._conn, None, {}
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()


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
    STORES_TEMPORARY = True  # every instance serves them (SqlStore)

    def __init__(self, db: PgDatabase) -> None:
        self.db = db
        (usage,) = models.for_agent(models.BackgroundUsage)
        self._usage = cast(type[models.BackgroundUsage], usage)

    def _page(
        self, conversation_id: str, after_seq: int, offset: int, limit: int, max_bytes: int | None
    ) -> Any:
        # asyncpg fetches a whole result: the server cuts the page at max_bytes instead
        if max_bytes is None:
            return super()._page(conversation_id, after_seq, offset, limit, max_bytes)
        return self.db.execute(_CUT_PAGE, (conversation_id, after_seq, limit, offset, max_bytes))

    async def open(self) -> None:
        await self.db.open(models.MODELS + models.OWNERSHIP_MODELS)
        self.db.db.bind([self._usage])
        await self.db.create_tables(lambda: self.db.execute(_APPEND_ONLY))

    def shared_events(self, instance_id: str) -> SharedEvents | None:
        """Many instances on this database (not ``exclusive``): their events go through the
        event table (agentik.core.store.pg_events); one instance keeps them in its process."""
        if self.db.exclusive:
            return None
        from agentik.core.store.pg_events import PgEvents

        return PgEvents(self.db, instance_id)

    async def add_models(self, models: list[type[peewee.Model]]) -> Database | None:
        self.db.db.bind(models)

        await self.db.create_tables(lambda: self.db.create_missing(models))
        return cast(Database, self.db)  # the same read/write/execute

    def _serialize(self, conversation_id: str) -> None:
        self.db.execute(_SERIALIZE, (conversation_id,))

    def _delete(self, conversation_id: str) -> bool:
        self.db.execute(_DELETE_LEASE, (conversation_id,))  # first: see _DELETE_LEASE
        return super()._delete(conversation_id)

    # --- many instances on one database (issue 26) ------------------------------------------

    def shared(self) -> SharedStore:
        return self

    def leader(self) -> PgLeader | None:
        """Many instances on this database (not ``exclusive``): a periodic job runs where its
        lock is held; one instance runs every job, as on SQLite."""
        return None if self.db.exclusive else PgLeader(self.db)

    async def notify(self, name: str, payload: str = "") -> None:
        await self.db.notify(name, payload)

    async def listen(
        self,
        name: str,
        callback: Callable[[str], None],
        caught_up: Callable[[], None] | None = None,
    ) -> None:
        await self.db.listen(name, callback, caught_up)

    async def heartbeat(self, instance: str, ttl: float) -> bool:
        """This instance is alive for ``ttl`` more seconds (the database server's clock): one
        statement a beat, whatever the number of conversations it owns, on a connection that
        holds the instance's lock while this process lives. True when the beat took that lock
        again (its connection was new: after a lost connection, or a restart of the server,
        which freed every instance's lock)."""
        return await self.db.beat(_HEARTBEAT, (instance, ttl), instance)

    async def acquire(
        self, conversation_id: str, instance: str, *, by_lock: bool = True
    ) -> Lease | None:
        """The conversation's lease for ``instance`` (its own again: the same epoch; free or
        its owner's heartbeat expired: taken, the epoch one more), or None while another live
        instance holds it. ``by_lock``: an owner whose session lock is free is gone too (its
        process died); not after this instance lost its connection (a restart of the server
        frees every instance's lock until it beats again)."""

        return await self.db.write(lambda: self._acquire(conversation_id, instance, by_lock))

    def _acquire(self, conversation_id: str, instance: str, by_lock: bool = True) -> Lease | None:
        """:meth:`acquire`, inside a write."""
        params = (conversation_id, conversation_id, instance, by_lock)
        row = self.db.execute(_ACQUIRE, params).fetchone()
        if row is None:
            return None
        inherited = row[1] is not None and row[1] != instance
        return Lease(conversation_id, instance, int(row[0]), inherited)

    async def create_owned(self, info: ConversationInfo, instance: str) -> Lease:
        """Store a new conversation with its lease, ``instance``'s, in one transaction (a
        temporary one is never without an owner: see end_temporaries)."""

        def q() -> Lease:
            self._insert_conversation(info)
            lease = self._acquire(info.id, instance)
            assert lease is not None  # a new conversation's lease is free
            return lease

        return await self.db.write(q)

    async def end_temporary(self, lease: Lease) -> bool:
        """Delete a temporary conversation its owner let go idle, and its lease, unless a turn
        came to run in it meanwhile (a send through another instance): then only the lease
        goes, and that send's wake takes the conversation up. In one transaction, as
        end_temporaries: the lease, the row locked, the turns checked."""
        cid = lease.conversation_id

        def q() -> bool:
            self.db.execute(_RELEASE, (cid, lease.owner, lease.epoch))
            if self.db.execute(_LOCK_CONVERSATION, (cid,)).fetchone() is None:
                return False  # deleted meanwhile
            return bool(self.db.execute(_END_TEMPORARY, ([cid],)).fetchall())

        return await self.db.write(q)

    async def end_temporaries(self) -> list[str]:
        """Delete the temporary conversations no live instance owns and nothing is to run in
        (their creator was killed, or stopped); returns their ids."""
        orphans = await self.db.read(
            lambda: [str(r[0]) for r in self.db.execute(_ORPHAN_TEMPORARIES).fetchall()]
        )
        if not orphans:  # (the usual answer: one read every AGENTIK_LEASE_TTL)
            return []

        def q() -> list[str]:
            self.db.execute(_END_LEASES, (orphans,))
            locked = [str(r[0]) for r in self.db.execute(_LOCK_UNOWNED, (orphans,)).fetchall()]
            if not locked:
                return []
            return [str(r[0]) for r in self.db.execute(_END_TEMPORARY, (locked,)).fetchall()]

        return await self.db.write(q)

    async def release(self, lease: Lease) -> None:
        """Give a conversation up (a stop): another instance takes it without waiting for this
        one's heartbeat to expire."""
        await self.db.write(
            lambda: self.db.execute(_RELEASE, (lease.conversation_id, lease.owner, lease.epoch))
        )

    @staticmethod
    @contextlib.contextmanager
    def fenced(lease: Lease | None) -> Iterator[None]:
        """Every write of this task (and of the tasks it starts) inside the block is refused
        with :class:`LeaseLost` once ``lease``'s epoch is over (None: no fence, for work that
        is not the conversation's turns)."""
        token = FENCE.set(lease)
        try:
            yield
        finally:
            FENCE.reset(token)

    async def others_alive(self, instance: str) -> int:
        """How many other instances are alive now."""
        return int(
            await self.db.read(lambda: self.db.execute(_OTHERS_ALIVE, (instance,)).fetchone()[0])
        )

    async def held_elsewhere(self, conversation_id: str, instance: str) -> bool:
        """Whether another live instance holds the conversation's lease now."""
        params = (conversation_id, instance)
        count = await self.db.read(lambda: self.db.execute(_HELD_ELSEWHERE, params).fetchone()[0])
        return int(count) > 0

    async def orphaned(self, instance: str) -> list[tuple[str, bool]]:
        """The conversations with turns to run (queued, or running) whose lease is free, or
        ``instance``'s (unless a turn of theirs waits for an answer), or whose owner is gone
        (its heartbeat expired, or its process ended): the sweeper's; each with whether
        ``instance`` holds its lease."""

        def q() -> list[tuple[str, bool]]:
            rows = self.db.execute(_ORPHANED, (instance, instance)).fetchall()
            return [(str(r[0]), bool(r[1])) for r in rows]

        return await self.db.read(q)

    async def claim_turn(self, instance: str) -> tuple[TurnRecord, Lease] | None:
        """Claim the oldest queued turn this instance may run, once: in one transaction its
        conversation's lease (taken or kept) and its move to ``running``. Two instances that
        claim at once never get the same turn, nor two turns of one conversation."""

        def q() -> tuple[TurnRecord, Lease] | None:
            row = self.db.execute(_CLAIMABLE, (instance,)).fetchone()
            if row is None:
                return None
            turn = self._turn_row(str(row[0]))
            lease = self._acquire(turn.user.conversation_id, instance)
            if lease is None:  # its owner came back meanwhile
                return None
            self._move(turn.id, TurnUpdate(TurnState.RUNNING, turn.step))
            return replace(turn, state=TurnState.RUNNING), lease

        return await self.db.write(q)
