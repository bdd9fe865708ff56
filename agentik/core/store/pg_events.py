"""Events across the instances of one agent on one PostgreSQL database (issue 26).

Each instance publishes its conversations' events to its own readers at once, as a single
instance does; a background flusher also writes them, at most every ``interval`` (20 ms), to
the UNLOGGED table ``agentik_event`` and says so with one ``NOTIFY`` on the ``events``
channel (:meth:`PgDatabase.channel`, payload its instance id), both in one statement: the
notification goes out with the INSERT's commit, a round trip less a batch than
:meth:`PgDatabase.notify` after it. Every instance listens (:meth:`PgDatabase.listen`): on a
notification it reads the rows of the others after the last it read and relays them to the
logs it holds (a conversation held here, the agent's), with their ids. So a reader on B of a
conversation A runs gets A's events ~20 ms late, and a reader resuming with a
``Last-Event-ID`` reads the rows after it (the replay).

Ids: a conversation's come from blocks of the sequence ``agentik_event_ids`` (one ``nextval``
a block, see :meth:`PgEvents.reserve_ids`); the agent stream's are the rows' own ids. Their
writes take one advisory lock, so ids are in commit order: a reader after id N never misses a
row committed later with a smaller one, and every instance relays the agent-level events in
one order (the producer too: its own come back to it from the table, or from memory when
no other instance's rows came between).

The table is a window: rows older than ``keep_seconds`` (5 minutes) or more than
``keep_rows`` (100 000) ids behind the newest are deleted every ``prune_every`` seconds (one
statement, by whichever instance). A resume from an id the table no longer holds gets a Gap.
UNLOGGED: no WAL for it (a crash of the server empties it: resumes get a Gap); the sequences
are logged, so ids keep growing.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import peewee

from agentik.core.events import EVENT_ID_BLOCK, SharedEventLog, SharedEvents, StreamItem
from agentik.core.models import BaseModel, for_agent
from agentik.core.types import Event, event_from_json

if TYPE_CHECKING:
    from agentik.core.store.postgres import PgDatabase

log = logging.getLogger(__name__)

#: one encoder for every event (``json.dumps`` with options builds one per call)
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

#: the advisory lock the event table's writers take turns by (ids in commit order)
EVENTS_LOCK = 7309372543
INTERVAL = 0.02  # seconds: the most a batch waits before it goes out
KEEP_SECONDS = 300.0
KEEP_ROWS = 100_000
PRUNE_EVERY = 10.0
RETRY = 1.0  # seconds before a failed batch goes out again
#: events kept for the others while the database refuses them (the oldest go first: a reader
#: elsewhere that resumes from one of them gets a Gap)
MAX_PENDING = 100_000


class _Timestamp(peewee.Field):
    field_type = "TIMESTAMPTZ"


class EventRow(BaseModel):
    """One event an instance published (``stream``: its conversation, ``""`` the agent's)."""

    id = peewee.BigIntegerField(primary_key=True, sequence="agentik_event_row")
    instance = peewee.TextField()
    stream = peewee.TextField()
    #: its id in a conversation's log (the agent stream's events: null, their id is ``id``)
    seq = peewee.BigIntegerField(null=True)
    turn_id = peewee.TextField(null=True)
    event = peewee.TextField()  # the event's JSON (Event.to_json)
    created_at = _Timestamp(constraints=[peewee.SQL("DEFAULT now()")])

    class Meta:
        table_name = "agentik_event"
        indexes = ((("stream", "seq"), False),)


_UNLOGGED = """
DO $$ BEGIN
  IF (SELECT relpersistence FROM pg_class WHERE oid = 'agentik_event'::regclass) = 'p' THEN
    ALTER TABLE agentik_event SET UNLOGGED;
  END IF;
END $$
"""
_ID_BLOCKS = (
    f"CREATE SEQUENCE IF NOT EXISTS agentik_event_ids INCREMENT BY {EVENT_ID_BLOCK} "
    f"MINVALUE 0 START WITH {EVENT_ID_BLOCK}"
)
_NEXT_BLOCK = "SELECT nextval('agentik_event_ids')"
# one statement, its own transaction: the lock is taken before any row takes its id, and
# held until the commit (a volatile CTE runs once, before the rows it is joined with), so a
# batch's ids are consecutive; the NOTIFY (PgDatabase.channel's "events") goes out with the
# commit, its payload "<instance> <first id> <last id> <streams>" (see PgEvents._heard)
_INSERT = (
    f"WITH locked AS (SELECT pg_advisory_xact_lock({EVENTS_LOCK})), "
    "added AS (INSERT INTO agentik_event (instance, stream, seq, turn_id, event) "
    "SELECT ?::text, e.* FROM locked, "
    "unnest(?::text[], ?::bigint[], ?::text[], ?::text[]) e RETURNING id), "
    "told AS (SELECT pg_notify(?, concat_ws(' ', ?::text, min(id), max(id), ?::text)) "
    "FROM added) "
    "SELECT id FROM added, told"
)
#: the streams named in a notification at most (more: "*", every instance reads the batch)
NOTIFY_STREAMS = 7000  # characters (a payload holds 8000 bytes)
#: the agent stream's name in a notification
AGENT_STREAM = "-"
_NEWEST = "SELECT coalesce(max(id), 0) FROM agentik_event"
# the others' rows after the last read, and every agent-level row (this instance's too)
_NEW_ROWS = (
    "SELECT id, stream, seq, turn_id, event FROM agentik_event "
    "WHERE id > ? AND (stream = '' OR instance <> ?) ORDER BY id LIMIT 5000"
)
_LAST_SEQ = "SELECT coalesce(max(seq), 0) FROM agentik_event WHERE stream = ?"
# from the event ``after`` itself on: its row says the table holds everything after it
_REPLAY = "SELECT seq, turn_id, event FROM agentik_event WHERE stream = ? AND seq >= ? ORDER BY seq"
_REPLAY_AGENT = (
    "SELECT id, turn_id, event FROM agentik_event WHERE stream = '' AND id >= ? ORDER BY id"
)
_PRUNE = (
    "DELETE FROM agentik_event WHERE created_at < now() - make_interval(secs => ?) "
    "OR id <= (SELECT max(id) FROM agentik_event) - ?"
)


class PgEvents(SharedEvents):
    """The event table of one agent's instances, seen from one of them (``instance``)."""

    def __init__(
        self,
        db: PgDatabase,
        instance: str,
        *,
        interval: float = INTERVAL,
        keep_seconds: float = KEEP_SECONDS,
        keep_rows: int = KEEP_ROWS,
        prune_every: float = PRUNE_EVERY,
    ) -> None:
        self.db = db
        self.instance = instance
        self.interval = interval
        self.keep_seconds = keep_seconds
        self.keep_rows = keep_rows
        self.prune_every = prune_every
        (self._model,) = for_agent(EventRow)
        self._channel = ""  # the server's name of the "events" channel (PgDatabase.channel)
        #: published here, not written yet: (stream, seq, event, turn id)
        self._pending: list[tuple[str, int, Event, str | None]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._flushing: asyncio.Task[None] | None = None
        self._reading: asyncio.Task[None] | None = None
        self._read_again = False
        self._pruning: asyncio.Task[None] | None = None
        self._last = 0  # the newest row relayed
        self._logs: Callable[[str], SharedEventLog | None] = lambda stream: None
        self._closed = False
        #: batches written, reads of the others' rows, rows relayed (tests, benchmarks)
        self.batches = self.reads = self.relayed = 0

    # --- set-up ----------------------------------------------------------------------------

    async def start(self, logs: Callable[[str], SharedEventLog | None]) -> int:
        self._logs = logs
        self.db.db.bind([self._model])
        self._channel = self.db.channel("events")

        def create() -> int:
            self.db.create_missing([self._model])
            self.db.execute(_UNLOGGED)
            self.db.execute(_ID_BLOCKS)
            return int(self.db.execute(_NEWEST).fetchone()[0])

        # one instance at a time: CREATE … IF NOT EXISTS races with itself
        self._last = await self.db.create_tables(create)
        await self.db.listen("events", self._heard, self._read_soon)
        self._pruning = asyncio.get_running_loop().create_task(self._prune_now_and_then())
        return self._last

    async def reserve_ids(self) -> int:
        return int(await self.db.read(lambda: self.db.execute(_NEXT_BLOCK).fetchone()[0]))

    async def close(self) -> None:
        self._closed = True
        for task in (self._pruning, self._reading):
            if task is not None:
                task.cancel()
        with contextlib.suppress(Exception):
            await self.flush()

    async def flush(self) -> None:
        """Send what is pending now (a stop, a hand-off, a reader of the agent stream from
        now on); raises if it could not (the timer sends it again). One batch at a time, as
        the timer's: two in flight could commit out of order, and a reader elsewhere would
        drop the earlier one's events as repeats."""
        while True:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._flushing is not None:
                await asyncio.shield(self._flushing)
                continue  # another may have begun meanwhile
            if not self._pending:
                return
            task = self._flushing = asyncio.get_running_loop().create_task(
                self._flush_then_next(quiet=False), context=contextvars.Context()
            )
            await asyncio.shield(task)  # raises what the batch raised
            return

    # --- the producer side -----------------------------------------------------------------

    def put(self, stream: str, seq: int, event: Event, turn_id: str | None) -> None:
        self._pending.append((stream, seq, event, turn_id))
        if self._timer is None and self._flushing is None and not self._closed:
            self._schedule(self.interval)

    def _schedule(self, delay: float) -> None:
        # in a context of its own: not the publishing turn's (its lease fence, its span)
        self._timer = asyncio.get_running_loop().call_later(
            delay, self._flush_soon, context=contextvars.Context()
        )

    def _flush_soon(self) -> None:
        self._timer = None
        self._flushing = asyncio.get_running_loop().create_task(self._flush_then_next())

    async def _flush_then_next(self, quiet: bool = True) -> None:
        """One batch, then the timer for what came meanwhile (``quiet``: a failure is logged,
        not raised: the timer's)."""
        delay = self.interval
        try:
            await self._flush()
        except Exception as e:
            delay = RETRY
            if not quiet:
                raise
            log.warning("could not send events to the other instances (retrying): %s", e)
        finally:
            self._flushing = None
            if self._pending and not self._closed and self._timer is None:
                self._schedule(delay)

    async def _flush(self) -> None:
        batch, self._pending = self._pending, []
        columns: tuple[list[Any], ...] = ([], [], [], [])
        for stream, seq, event, turn_id in batch:
            columns[0].append(stream)
            columns[1].append(seq if stream else None)
            columns[2].append(turn_id)
            columns[3].append(_dumps(event.to_json()))
        newest: dict[str, int] = {}  # each conversation's newest id in the batch
        for stream, seq, *_ in batch:
            newest[stream] = seq
        streams = " ".join(f"{s}:{seq}" if s else AGENT_STREAM for s, seq in newest.items())
        if len(streams) > NOTIFY_STREAMS:
            streams = "*"
        try:
            params = (self.instance, *columns, self._channel, self.instance, streams)
            rows = await self.db.read(lambda: self.db.execute(_INSERT, params).fetchall())
        except Exception:
            self._pending[:0] = batch  # sent again, in order, with what came meanwhile
            excess = len(self._pending) - MAX_PENDING
            if excess > 0:
                del self._pending[:excess]
                log.warning("%d events were not sent to the other instances", excess)
            raise
        self.batches += 1
        ids = sorted(row[0] for row in rows)
        agent = [row_id for (stream, *_), row_id in zip(batch, ids, strict=False) if not stream]
        self.agent_sent = max(self.agent_sent, *agent) if agent else self.agent_sent
        self._own_batch(batch, ids)

    def _own_batch(self, batch: list[tuple[str, int, Event, str | None]], ids: list[int]) -> None:
        """This instance's batch went out with ``ids``. When they come right after the last
        row read here (ids are taken in the batch's order, under the lock), the next read
        starts after them, and the batch's agent-level events (which every instance relays,
        in their order among every instance's) are relayed from memory; when another
        instance's rows came between, agent-level events are read from the table."""
        agent = any(not stream for stream, *_ in batch)
        if not ids or ids[0] != self._last + 1 or self._reading_now():
            if agent:
                self._read_soon()
            return
        self._last = ids[-1]
        target = self._logs("") if agent else None
        if target is None:
            return
        for (stream, _, event, turn_id), row_id in zip(batch, ids, strict=True):
            if not stream:
                target.relay(row_id, event, turn_id)

    # --- the relay -------------------------------------------------------------------------

    def _heard(self, payload: str) -> None:
        """Another instance's batch: read, unless it is of nothing held here (the usual case
        with the consistent hash: a conversation lives on its owner)."""
        instance, _, batch = payload.partition(" ")
        if instance != self.instance and not self._pass_over(batch):
            self._read_soon()

    def _pass_over(self, batch: str) -> bool:
        """Skip the batch ``"<first id> <last id> <streams>"`` unread (``<streams>``: each
        conversation's ``<id>:<newest id>``, and ``-`` for the agent stream), when it comes
        right after the last row read here and nobody here reads any of its streams: the logs
        held here move past it, as the relay moves a log nobody reads (the agent's to the
        last row id: its ids are the rows')."""
        first, _, rest = batch.partition(" ")
        last, _, streams = rest.partition(" ")
        try:
            if int(first) != self._last + 1 or self._reading_now() or streams == "*":
                return False
            newest = int(last)
        except ValueError:  # an older version's payload
            return False
        unread: list[tuple[SharedEventLog, int]] = []
        for entry in streams.split(" "):
            stream, _, seq = entry.rpartition(":") if entry != AGENT_STREAM else ("", "", last)
            log = self._logs(stream)
            if log is None:
                continue
            if log.readers or not seq.isdigit():  # read (or an older version's entry)
                return False
            unread.append((log, int(seq)))
        self._last = newest
        for log, newest_seq in unread:
            log.pass_over(newest_seq)
        return True

    def _reading_now(self) -> bool:
        return self._reading is not None and not self._reading.done()

    def _read_soon(self) -> None:
        """Read the new rows now, or once the read under way is over (coalesced)."""
        if self._closed:
            return
        if self._reading_now():
            self._read_again = True
            return
        self._reading = asyncio.get_running_loop().create_task(self._read_new())

    async def _read_new(self) -> None:
        while True:
            self._read_again = False
            try:
                rows = await self.db.read(
                    lambda: self.db.execute(_NEW_ROWS, (self._last, self.instance)).fetchall()
                )
            except Exception as e:  # the next notification (or the listener's catch-up) retries
                log.warning("could not read the other instances' events: %s", e)
                return
            self.reads += 1
            for row_id, stream, seq, turn_id, raw in rows:
                self._relay(stream, row_id if not stream else seq, turn_id, raw)
                self._last = max(self._last, row_id)
            if len(rows) < 5000 and not self._read_again:
                return

    def _relay(self, stream: str, seq: int, turn_id: str | None, raw: str) -> None:
        target = self._logs(stream)
        if target is None or seq <= target.last_seq:  # nobody here holds it, or had it
            return
        if not target.readers:
            target.pass_over(seq)
            return
        event = event_from_json(json.loads(raw))
        if event is not None:  # None: a type this version does not know
            target.relay(seq, event, turn_id)
            self.relayed += 1

    # --- reading back ----------------------------------------------------------------------

    async def last_seq(self, stream: str) -> int:
        return int(await self.db.read(lambda: self.db.execute(_LAST_SEQ, (stream,)).fetchone()[0]))

    async def replay(self, stream: str, after: int) -> list[StreamItem] | None:
        sql = _REPLAY_AGENT if not stream else _REPLAY
        params = (after,) if not stream else (stream, after)
        rows = await self.db.read(lambda: self.db.execute(sql, params).fetchall())
        if not rows or rows[0][0] != after:
            return None  # pruned, or never one of this stream's
        items = []
        for seq, turn_id, raw in rows[1:]:
            event = event_from_json(json.loads(raw))
            if event is not None:
                items.append(StreamItem(seq, event, turn_id))
        return items

    # --- the window ------------------------------------------------------------------------

    async def _prune_now_and_then(self) -> None:
        while True:
            await asyncio.sleep(self.prune_every)
            try:
                await self.prune()
            except Exception as e:
                log.warning("could not prune the event table: %s", e)

    async def prune(self) -> None:
        """Delete the rows beyond the window (older than ``keep_seconds``, or more than
        ``keep_rows`` ids behind the newest): one statement."""
        await self.db.read(lambda: self.db.execute(_PRUNE, (self.keep_seconds, self.keep_rows)))
