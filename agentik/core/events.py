"""Live event streams with sequence ids, a bounded replay buffer and any number of readers.

Publishing appends to one bounded buffer and wakes the readers; it never waits for them, so a
slow reader cannot block a turn or the other readers. Each reader keeps its own cursor. A reader
that falls further behind than the buffer holds gets a :class:`~agentik.core.types.Gap` item
and goes on from the oldest buffered event; it fills the gap from history.

Sequence ids come from one :class:`EventIds` counter per agent that only grows, across restarts
too (the agent keeps its high-water mark in the store, ahead of use), never from the clock. A
new log starts above every id any log issued, so an id from an earlier log of the same stream
(before a restart, or before an idle conversation was dropped from memory) is smaller than any
id of this one: its reader gets a ``Gap`` and everything this log still holds. So does a reader
with an id above the highest issued (another server's, or a corrupted one): never silence.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, Callable
from itertools import islice
from typing import Any

from agentik.core.types import End, Event, Gap, UserMessage

#: event ids reserved at once (a write of the agent's mark; on many instances, one block of
#: the database's sequence)
EVENT_ID_BLOCK = 1 << 16
#: seconds a reader resuming from an id newer than its log knows waits for it to come in
RESUME_WAIT = 0.25


class StreamItem:
    """One published event. ``turn_id`` is the user message id of the turn that emitted it
    (None outside a turn); ``memo`` lets a transport cache its encoding once for all readers."""

    __slots__ = ("event", "memo", "seq", "turn_id")

    def __init__(self, seq: int, event: Event, turn_id: str | None = None) -> None:
        self.seq = seq
        self.event = event
        self.turn_id = turn_id
        self.memo: dict[str, Any] = {}


async def flatten(
    batches: AsyncGenerator[list[StreamItem], None],
) -> AsyncGenerator[StreamItem, None]:
    """The items of :meth:`EventLog.batches` one by one."""
    try:
        async for batch in batches:
            for item in batch:
                yield item
    finally:
        await batches.aclose()  # now, not when the garbage collector gets to it


async def unwrap(items: AsyncGenerator[StreamItem, None]) -> AsyncGenerator[Event, None]:
    """The events of stream items."""
    try:
        async for item in items:
            yield item.event
    finally:
        await items.aclose()


async def one_turn(
    batches: AsyncGenerator[list[StreamItem], None], turn_id: str
) -> AsyncGenerator[list[StreamItem], None]:
    """The items of one turn in ``batches`` (and any Gap), through that turn's End."""
    try:
        async for batch in batches:
            mine = [i for i in batch if i.turn_id == turn_id or isinstance(i.event, Gap)]
            if mine:
                yield mine
            if any(isinstance(i.event, End) and i.turn_id == turn_id for i in mine):
                return
    finally:
        await batches.aclose()


class EventIds:
    """The sequence ids of one agent's event logs: a counter that only grows.

    ``high`` is the highest id any log issued. A log counts on from its own last id and raises
    ``high``; a new log starts at ``high``, above everything issued before. For ids to grow
    across restarts too, the owner persists a mark ahead of use (:meth:`reserved`) and starts
    the next process's counter there: a publish does no I/O, and when ``high`` comes within
    half a block of the mark, ``refill`` (the owner's) is called once to persist a further
    one."""

    __slots__ = ("gaps", "high", "refill", "refill_at")

    def __init__(self, issued: int = 0, refill: Callable[[int], None] | None = None) -> None:
        self.high = issued
        #: called with ``high`` when the persisted mark is near; it calls :meth:`reserved`
        self.refill = refill
        self.refill_at = float("inf")  # no mark persisted: nothing to refill
        #: Gaps readers of these logs were given (fell behind the buffer, or resumed from an
        #: id it no longer holds): the ``AGENTIK_EVENT_BUFFER`` may be too small
        self.gaps = 0

    def reserved(self, mark: int, block: int) -> None:
        """Ids up to ``mark`` are persisted as used: ask for more half a block before it."""
        self.refill_at = mark - block // 2

    def near_mark(self) -> None:
        """``high`` reached ``refill_at``: ask the owner for the next mark, once."""
        self.refill_at = float("inf")  # until the owner persisted the next mark
        if self.refill is not None:
            self.refill(self.high)


class EventLog:
    def __init__(self, maxlen: int = 1024, ids: EventIds | None = None) -> None:
        self._items: deque[StreamItem] = deque(maxlen=maxlen)
        #: the agent's counter, shared by its logs (none given: a counter of its own)
        self._ids = ids = ids if ids is not None else EventIds()
        self._seq = ids.high
        self.readers = 0
        #: one per reader waiting for news; a reader that leaves takes its own out (kept, the
        #: futures of thousands of closed streams would stay until the next event, pinning
        #: the memory they were allocated in)
        self._waiters: set[asyncio.Future[None]] = set()
        self._closed = False

    @property
    def last_seq(self) -> int:
        return self._seq

    @property
    def closed(self) -> bool:
        return self._closed

    def publish(self, event: Event, turn_id: str | None = None) -> int:
        seq = self._seq = self._seq + 1
        ids = self._ids
        if seq > ids.high:
            ids.high = seq
            if seq >= ids.refill_at:
                ids.near_mark()
        self._items.append(StreamItem(seq, event, turn_id))
        self._wake()
        return seq

    async def producer_died(self, turn_id: str) -> None:
        """The instance that produced this stream's events died, maybe amid ``turn_id``,
        and this one goes on: nothing to say where one process keeps the stream (a new log,
        after a restart, gives its resuming readers a ``Gap`` by itself)."""

    def close(self) -> None:
        """End every reader (shutdown, deleted conversation)."""
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            if not waiter.done():  # a cancelled reader's own future is done
                waiter.set_result(None)

    def _pending(self, cursor: int) -> list[StreamItem]:
        if cursor >= self._seq:
            return []
        first = self._items[0].seq if self._items else self._seq + 1
        if cursor < first - 1:
            # evicted from the buffer, or an id of an earlier log (before a restart or an
            # eviction): say what was lost, then replay all we hold
            return self._gap(cursor)
        # the new items are at the right end: walk from there, not across the whole buffer
        newest = list(islice(reversed(self._items), self._seq - cursor))
        newest.reverse()
        return newest

    def _gap(self, cursor: int) -> list[StreamItem]:
        """A ``Gap`` after ``cursor``, then everything the buffer holds."""
        first = self._items[0].seq if self._items else self._seq + 1
        self._ids.gaps += 1
        return [StreamItem(first - 1, Gap(cursor)), *self._items]

    async def now(self) -> int:
        """The id a reader from now on starts after: every event published so far is at or
        below it (:attr:`last_seq`, but for the agent stream of many instances)."""
        return self._seq

    async def _start(self, cursor: int) -> list[StreamItem]:
        """What a reader resuming after ``cursor`` gets before the live events."""
        if cursor > self._seq:
            # an id above the highest issued (not ours): what it missed is unknown
            return self._gap(cursor)
        return []

    def subscribe(self, after: int | None = None) -> AsyncGenerator[StreamItem, None]:
        """Yield events published after ``after`` (None: from now on) until the log closes."""
        return flatten(self.batches(after))

    async def batches(
        self, after: int | None = None, linger: float = 0.0
    ) -> AsyncGenerator[list[StreamItem], None]:
        """Like :meth:`subscribe`, but yield everything pending at once: a reader that was busy
        gets the events published meanwhile in one list (one socket write for SSE). With
        ``linger`` (seconds) it waits that long after news before collecting it."""
        cursor = self._seq if after is None else after
        loop = asyncio.get_running_loop()
        self.readers += 1
        try:
            first = await self._start(cursor)
            if first:
                yield first
                cursor = first[-1].seq
            while True:
                batch = self._pending(cursor)
                if batch:
                    yield batch
                    cursor = batch[-1].seq
                    continue
                if self._closed:
                    return
                waiter = loop.create_future()
                self._waiters.add(waiter)
                try:
                    await waiter
                finally:
                    self._waiters.discard(waiter)
                if linger:
                    await asyncio.sleep(linger)
        finally:
            self.readers -= 1


class SharedEvents(abc.ABC):
    """How the instances of one agent on one database share their events (the store gives it:
    :meth:`~agentik.core.store.Store.shared_events`; a single instance has none).

    Each instance publishes its own conversations' events at once to its own readers, as a
    single instance does, and :meth:`put` sends them to the others (batched, in the
    background); what the others publish comes in by :meth:`start`'s relay, with its ids. Ids
    of a conversation's log come from blocks of one sequence (:meth:`reserve_ids`); the agent
    stream's come from the database in commit order, the same on every instance."""

    @abc.abstractmethod
    async def reserve_ids(self) -> int:
        """The first id of a block of ``EVENT_ID_BLOCK`` ids reserved now: above every id
        of any block reserved before, by any instance."""

    @abc.abstractmethod
    async def start(self, logs: Callable[[str], SharedEventLog | None]) -> int:
        """Relay from now on: each event of another instance (and each agent-level one, this
        instance's too) goes to ``logs(stream)`` (``stream``: a conversation id, ``""`` the
        agent's), if it gives a log. Returns the agent stream's newest id."""

    @abc.abstractmethod
    def put(self, stream: str, seq: int, event: Event, turn_id: str | None) -> None:
        """Send an event to the other instances (``stream`` ``""``: to the agent stream of
        every instance, this one's too; its id is given then). No I/O here."""

    @abc.abstractmethod
    async def last_seq(self, stream: str) -> int:
        """The newest id of a conversation's events the database holds (0: none)."""

    @abc.abstractmethod
    async def replay(self, stream: str, after: int) -> list[StreamItem] | None:
        """The events of ``stream`` after the id ``after`` that the database holds, oldest
        first; None when it does not hold the event ``after`` any more (or never did): what
        came after it may be lost."""

    #: the id the database gave this instance's newest agent-level event sent (0: none)
    agent_sent: int = 0

    @abc.abstractmethod
    async def flush(self) -> None:
        """Send what is pending now (a hand-off: before another instance produces more)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Send what is pending and stop relaying."""


class SharedEventLog(EventLog):
    """A log of an agent running as many instances (:class:`SharedEvents`): what it publishes
    also goes to the other instances, their events of its stream come in by :meth:`relay`
    with their own ids, and a reader resuming from an id this log does not hold reads the
    events after it from the database.

    Ids of one stream only grow but need not be consecutive (a takeover starts them in a new
    block): a reader's place is found by id, not by count, and ``_floor`` is the newest id
    no longer held (the log's start, or the newest item the buffer dropped)."""

    def __init__(
        self,
        maxlen: int,
        ids: EventIds,
        shared: SharedEvents,
        stream: str,
        start: int | None = None,
    ) -> None:
        super().__init__(maxlen, ids)
        self.shared = shared
        self.stream = stream
        if start is not None:
            self._seq = start
        self._floor = self._seq
        #: the sends announced in this log lately (a takeover announces again the queued
        #: sends it takes up: one its last owner announced already is not news)
        self._announced: dict[str, None] = {}

    def _repeat(self, event: Event) -> bool:
        """A ``UserMessage`` this log holds already (else noted as held)."""
        if not isinstance(event, UserMessage):
            return False
        if event.id in self._announced:
            return True
        self._announced[event.id] = None
        if len(self._announced) > (self._items.maxlen or 1024):
            del self._announced[next(iter(self._announced))]
        return False

    def publish(self, event: Event, turn_id: str | None = None) -> int:
        if self._repeat(event):
            return self._seq
        self._dropping()
        seq = super().publish(event, turn_id)
        self.shared.put(self.stream, seq, event, turn_id)
        return seq

    async def producer_died(self, turn_id: str) -> None:
        """Its readers get a ``Gap`` after the newest event the database holds: the dead
        producer's last batch may never have reached it, and the turn resumes from its last
        recorded step, not from what it streamed (a reader reads the history, as after the
        restart of a single instance)."""
        self.publish(Gap(await self.shared.last_seq(self.stream)), turn_id)

    def relay(self, seq: int, event: Event, turn_id: str | None = None) -> None:
        """An event another instance published in this stream, with its id; one not above
        the newest here is a repeat, or older than this log: dropped (a send announced
        twice, by an owner and by the instance that took it over, too)."""
        if seq <= self._seq or self._repeat(event):
            return
        self._dropping()
        self._seq = seq
        self._items.append(StreamItem(seq, event, turn_id))
        self._wake()

    def pass_over(self, seq: int) -> None:
        """Events of this stream up to ``seq`` were published elsewhere while nobody here read
        it: not kept (nor decoded: the relay's cost on instances without readers). A reader
        that comes later starts after them, or reads them from the database."""
        if seq > self._seq:
            self._seq = self._floor = seq
            self._items.clear()

    def begin_at(self, seq: int) -> None:
        """Loaded here: events of this stream up to ``seq`` were published before (the
        database's newest then); what the relay brought meanwhile stays."""
        self._floor = max(self._floor, seq)
        self._seq = max(self._seq, seq)

    def skip_to(self, seq: int) -> None:
        """This instance becomes the stream's producer: its next id is above ``seq`` (the
        start of a block reserved now, above every id another instance gave it)."""
        # nothing is lost in between: no id there was this stream's
        self._seq = max(self._seq, seq)

    def _dropping(self) -> None:
        items = self._items
        if len(items) == items.maxlen:  # the oldest goes now
            self._floor = items[0].seq

    def _pending(self, cursor: int) -> list[StreamItem]:
        if cursor >= self._seq:
            return []
        if cursor < self._floor:
            return self._gap(cursor)
        newest = []
        for item in reversed(self._items):
            if item.seq <= cursor:
                break
            newest.append(item)
        newest.reverse()
        return newest

    def _gap(self, cursor: int) -> list[StreamItem]:
        self._ids.gaps += 1
        floor = self._floor  # items at or below it (a loaded log's first relays) are not news
        return [StreamItem(floor, Gap(cursor)), *(i for i in self._items if i.seq > floor)]

    async def _start(self, cursor: int) -> list[StreamItem]:
        if self._floor <= cursor <= self._seq:
            return []
        # older than this log holds, or newer than it has heard of yet: the database's
        replayed = await self.shared.replay(self.stream, cursor)
        if replayed is None and cursor > self._seq:
            # perhaps still on its way from the instance that published it (a batch goes
            # out every ~20 ms): asked once more before it is a Gap
            await asyncio.sleep(RESUME_WAIT)
            replayed = await self.shared.replay(self.stream, cursor)
        if replayed is None:
            return self._gap(cursor)
        seen: set[str] = set()  # a send announced twice (see _repeat) is read once
        return [i for i in replayed if not _announced_before(i.event, seen)]


def _announced_before(event: Event, seen: set[str]) -> bool:
    if not isinstance(event, UserMessage):
        return False
    if event.id in seen:
        return True
    seen.add(event.id)
    return False


class AgentEventLog(SharedEventLog):
    """The agent-level stream of many instances: its events come from every instance, so
    its ids are the database's, in commit order; a publish goes there only, and comes back
    to every instance (this one too) by the relay."""

    def publish(self, event: Event, turn_id: str | None = None) -> int:
        self.shared.put(self.stream, 0, event, turn_id)
        return 0

    async def now(self) -> int:
        # this instance's events come back by the relay: a reader from now on starts after
        # those it published before, not only after those relayed so far
        with contextlib.suppress(Exception):  # the database is away: they come later
            await self.shared.flush()
        return max(self._seq, self.shared.agent_sent)
