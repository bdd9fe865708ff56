"""Live event streams with sequence ids, a bounded replay buffer and any number of readers.

Publishing appends to one bounded buffer and wakes the readers; it never waits for them, so a
slow reader cannot block a turn or the other readers. Each reader keeps its own cursor. A reader
that falls further behind than the buffer holds gets a :class:`~agentik.core.types.Gap` item
and goes on from the oldest buffered event; it fills the gap from history.

Sequence ids start at the log's creation time in microseconds, so ids from an earlier log of the
same stream (before a restart, or before an idle conversation was dropped from memory) are
smaller than any id of this one, and a client resuming with one is replayed everything this log
still holds.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncGenerator
from itertools import islice
from typing import Any

from agentik.core.types import Event, Gap


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


class EventLog:
    _high_water = 0  # the highest id any log of this process issued

    def __init__(self, maxlen: int = 1024) -> None:
        self._items: deque[StreamItem] = deque(maxlen=maxlen)
        self._base = self._seq = max(time.time_ns() // 1000, EventLog._high_water + 1)
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
        self._seq += 1
        if self._seq > EventLog._high_water:
            EventLog._high_water = self._seq
        self._items.append(StreamItem(self._seq, event, turn_id))
        self._wake()
        return self._seq

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
            return [StreamItem(first - 1, Gap(cursor)), *self._items]
        # the new items are at the right end: walk from there, not across the whole buffer
        newest = list(islice(reversed(self._items), self._seq - cursor))
        newest.reverse()
        return newest

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
        if cursor > self._seq:
            cursor = self._seq  # an id this log never issued
        loop = asyncio.get_running_loop()
        self.readers += 1
        try:
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
