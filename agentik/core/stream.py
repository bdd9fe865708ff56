"""The reading side of a conversation's events: every transport follows a conversation (or one
of its turns) through these, with sequence ids to resume from. Its turns publish with
:meth:`ConversationEvents.emit`."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

from agentik.core.events import EventLog, StreamItem, flatten, one_turn, unwrap
from agentik.core.types import End, Event, Message

if TYPE_CHECKING:
    from agentik.core.conversation import ChatConversation
    from agentik.core.runner import TurnRunner
    from agentik.core.store import Store


class ConversationEvents:
    """Mixed into :class:`~agentik.core.conversation.ChatConversation`."""

    log: EventLog
    runner: TurnRunner
    store: Store
    _evicted: bool

    async def _current(self) -> ChatConversation:
        raise NotImplementedError

    @property
    def running_turn(self) -> str | None:
        """The id of the turn running now, if any."""
        turn = self.runner.turn
        return turn.id if turn is not None else None

    def emit(self, event: Event) -> None:
        """Publish an event of the running turn to every reader."""
        turn = self.runner.turn  # running_turn inlined: this runs for every streamed token
        self.log.publish(event, turn.id if turn is not None else None)

    def events(self, after: int | None = None) -> AsyncGenerator[Event, None]:
        """The live events themselves (``StartResponse``, ``AppendText``…, ``End``) after the
        sequence id ``after``; None: from this call on, not from the first read, so a reader
        made before a send misses nothing of its turn::

            events = conv.events()
            await conv.send([TextPart("hello")])
            async for event in events:
                if event.type == "End":
                    break
        """
        return unwrap(self.event_items(after))

    def event_items(self, after: int | None = None) -> AsyncGenerator[StreamItem, None]:
        """:meth:`events` with their sequence ids (``StreamItem(seq, event)``), for transports
        that let a client resume after the last id it saw."""
        if after is None and not self._evicted:
            after = self.log.last_seq
        return flatten(self.event_batches(after))

    @property
    def last_event_id(self) -> int:
        """The sequence id of the newest event: read it before a ``send`` and pass it to
        :meth:`turn_events` so nothing of that turn is missed."""
        return self.log.last_seq

    def turn_events(
        self, turn_id: str, after: int | None = None
    ) -> AsyncGenerator[StreamItem, None]:
        """The items of one turn (``turn_id``: the id of the user message ``send`` returned),
        published after ``after``, through its ``End``; a transport that answers one send with
        one stream uses it, even when other sends queue on the conversation::

            after = conv.last_event_id
            message = await conv.send([TextPart("hello")])
            async for item in conv.turn_events(message.id, after):
                ...

        A :class:`~agentik.core.types.Gap` (the reader fell behind the replay buffer) is
        yielded too. The stream also stops when the conversation's log closes (shutdown,
        deletion) before the turn ended; a turn that ended before ``after`` yields nothing
        until then, so check the history first when the turn may be over."""
        return flatten(self.turn_batches(turn_id, after))

    def turn_batches(
        self, turn_id: str, after: int | None = None, linger: float = 0.0
    ) -> AsyncGenerator[list[StreamItem], None]:
        """:meth:`turn_events` in lists: what was published while the reader was busy comes
        at once (one socket write, and a transport may join text deltas); with ``linger``
        (seconds) the reader waits that long after news to gather more (fewer, later lists)."""
        return one_turn(self.event_batches(after, linger), turn_id)

    async def turn_end(self, turn_id: str) -> Message | None:
        """The record that ended the turn ``turn_id`` (its ``assistant`` or ``error`` record),
        once it has ended (at once when it has); None when the conversation's event log closed
        first (shutdown, deletion). For a transport that answers a request with the turn's
        outcome, from the audit log: what a listener that fell behind missed is in it."""
        after = self.last_event_id  # before the read: an End published meanwhile is not missed
        end = await self.store.turn_end(turn_id)
        if end is None:
            items = self.turn_events(turn_id, after)
            try:
                async for item in items:
                    if isinstance(item.event, End):
                        break
            finally:
                await items.aclose()
            end = await self.store.turn_end(turn_id)
        return end

    async def event_batches(
        self, after: int | None = None, linger: float = 0.0
    ) -> AsyncGenerator[list[StreamItem], None]:
        """:meth:`events` in lists: all that was published while the reader was busy (see
        :meth:`EventLog.batches`); transports write a list in one go."""
        # resolved at the first read, not when called: the object may be evicted in between
        live = await self._current() if self._evicted else self
        batches = live.log.batches(after, linger)
        try:
            async for batch in batches:
                yield batch
        finally:
            await batches.aclose()
