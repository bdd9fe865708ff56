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

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, Callable
from itertools import islice
from typing import Any

from agentik.core.types import End, Event, Gap


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
            if cursor > self._seq:
                # an id above the highest issued (not ours): what it missed is unknown
                batch = self._gap(cursor)
                yield batch
                cursor = batch[-1].seq
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
