"""One conversation: the public face (F1) over its parts — the inbox (sends, their order,
waiting turns), the turn runner (steps, tools, ends), the context keeper (the live LLM context,
compaction) and its event log. ``docs/architecture.md`` draws them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from agentik.core.approvals import APPROVAL, Approval, PendingApproval
from agentik.core.context import KEEP_TURNS, Compaction
from agentik.core.context_keeper import ContextKeeper
from agentik.core.events import EventLog
from agentik.core.inbox import ConversationClosed, Inbox, NotWaiting
from agentik.core.llm import HistoryItem
from agentik.core.ownership import Ownership
from agentik.core.records import utcnow
from agentik.core.runner import TurnRunner
from agentik.core.store import Store, TokenStats
from agentik.core.stream import ConversationEvents
from agentik.core.turns import TurnRecord, TurnState
from agentik.core.types import (
    ContentPart,
    ConversationInfo,
    Message,
    MessageContext,
    UnknownReference,
    Via,
)

if TYPE_CHECKING:
    from agentik.core.agent import ChatAgent

__all__ = ["ChatConversation", "ConversationClosed", "NotWaiting", "PromptSection"]

ALONE = Ownership()

#: ``(order, name, render)``: ``render(agent)`` or ``render()`` gives the section's text
PromptSection = tuple[int, str, Callable[..., str | None]]


class ChatConversation(ConversationEvents):
    supports_image_output = False

    def __init__(
        self,
        agent: ChatAgent,
        info: ConversationInfo,
        open_turns: Sequence[TurnRecord] = (),
        log: EventLog | None = None,
    ) -> None:
        self.agent = agent
        self.id = info.id
        self.title = info.title
        self.is_temporal = info.is_temporal
        self.created_at = info.created_at
        self.updated_at = info.updated_at
        self.store: Store = agent.store_of(info.is_temporal)
        #: who runs its turns: the agent's (instances sharing the store), this process for a
        #: temporary conversation in its memory only
        self.ownership: Ownership = ALONE if self.store is agent.temp_store else agent.ownership
        self.log = log if log is not None else agent.event_log(info)
        self.inbox = Inbox(self, open_turns)
        self.runner = TurnRunner(self)
        self.context = ContextKeeper(self)
        self.closed = False
        self._evicted = False  # dropped from the agent's memory while idle; see _current()
        #: plugins' per-conversation state, by plugin name (counters, caches). It lives as long
        #: as this object: an idle conversation dropped from memory and reloaded starts empty,
        #: so keep what must last in the store.
        self.state: dict[str, Any] = {}

    # --- the protocol -----------------------------------------------------------------------

    @property
    def supports_image_input(self) -> bool:
        return bool((self.agent.llm.capabilities or {}).get("image_input"))

    @property
    def busy(self) -> bool:
        """A turn is queued, running or waiting."""
        return self.inbox.running or self.inbox.held is not None

    @property
    def idle(self) -> bool:
        """No send, turn or reader in progress: safe to drop from memory (a waiting turn is
        in the store and holds nothing here)."""
        return not self.inbox.running and not self.inbox.sending and self.log.readers == 0

    def info(self) -> ConversationInfo:
        return ConversationInfo(
            self.id, self.title, self.is_temporal, self.created_at, self.updated_at
        )

    async def send(
        self,
        content: Sequence[ContentPart],
        context: MessageContext | None = None,
        *,
        idempotency_key: str | None = None,
        via: Via | None = None,
    ) -> Message:
        """Record the user message (durably), queue its turn and return the record.

        With an ``idempotency_key`` this conversation already took, nothing is stored or run
        again: the first message's record is returned (a client retrying a send whose answer it
        never got). ``via``: the transport that took it and the sender it names (a transport
        passes it; kept on the record and shown to other viewers in ``UserMessage``)."""
        if self._evicted:
            live = await self._current()
            return await live.send(content, context, idempotency_key=idempotency_key, via=via)
        if self.closed:
            raise ConversationClosed(f"conversation {self.id} is closed")
        return await self.inbox.accept(content, context, idempotency_key, via)

    async def wait_idle(self) -> None:
        """Wait until every queued turn has run or waits (for scripts, tests, benchmarks)."""
        while self.inbox.worker is not None and not self.inbox.worker.done():
            await asyncio.wait([self.inbox.worker])

    async def cancel_queued(self, message_id: str) -> bool:
        """Take a message whose turn has not started out of the queue and close it with a
        ``cancelled`` Error record: it never runs, not after a restart either. False when it
        is not waiting (running, over, or not this conversation's); :meth:`interrupt` stops a
        running turn. It never began: alone on its store, listeners get no events for it; where
        instances share the store, its Error (code ``cancelled``) and End, for a follower on
        another instance."""
        return await self.inbox.cancel_queued(message_id)

    def interrupt(self, turn_id: str | None = None) -> bool:
        """Stop the running turn, or end the waiting one (queued sends still run). False when
        there was none. ``turn_id``: only that turn (nothing when another runs or waits: a
        transport that stops one request's turn)."""
        if self._evicted:
            live = self.agent.live_conversation(self.id)
            return live.interrupt(turn_id) if live is not None and live is not self else False
        return self.inbox.interrupt(turn_id)

    async def ainterrupt(self, turn_id: str | None = None) -> bool:
        """:meth:`interrupt` for code written against the agent protocol
        (:class:`agentik.core.protocol.Conversation`), where it may be a request to a server;
        through any instance of several sharing the store (the turn runs on its owner)."""
        if self._evicted:
            return await (await self._current()).ainterrupt(turn_id)
        return await self.inbox.interrupt_anywhere(turn_id)

    async def busy_now(self) -> bool:
        """:attr:`busy`, also where another instance runs this conversation's turns (from the
        store's turn table then)."""
        if self.ownership.owns(self.id):
            return self.busy
        return bool(await self.store.open_turns(self.id))

    async def resume_turn(self, turn_id: str, call_id: str, answer: Any) -> TurnRecord:
        """Answer what a waiting turn waits for (the wait of its tool call ``call_id``); once
        every wait of its step is answered it goes on, here or after a restart. Raises
        :class:`~agentik.core.types.UnknownReference` (no such turn or wait) or
        :class:`NotWaiting` (over, running, or answered already)."""
        if self._evicted:
            return await (await self._current()).resume_turn(turn_id, call_id, answer)
        return await self.inbox.answer(turn_id, call_id, answer)

    async def turn_state(self, turn_id: str) -> tuple[str, str | None]:
        """Where the turn of the user message ``turn_id`` stands, as the HTTP API says it:
        ``queued``, ``running``, ``waiting``, ``done``, ``interrupted``, ``failed`` or
        ``cancelled``, with the error code of a failed or cancelled one (``restart``: a crash
        cut it and it was not resumed). A client that resends a message learns from it whether
        anything will still answer."""
        if self._evicted:
            return await (await self._current()).turn_state(turn_id)
        waiting = self.agent.unrecorded_state(turn_id)  # its end waits for the database
        if waiting is not None:
            return waiting
        if turn_id == self.running_turn:
            return "running", None
        record = await self.turn(turn_id)
        if record is None or not record.state.final:
            return (str(record.state) if record else "queued"), None
        if record.state is TurnState.DONE:
            return "done", None
        end = await self.store.turn_end(turn_id)
        if record.state is TurnState.CANCELLED and end is not None and end.kind == "assistant":
            return "interrupted", None
        code = end.payload.get("code") if end is not None else None
        return ("cancelled" if record.state is TurnState.CANCELLED else "failed"), code

    async def approvals(self) -> list[PendingApproval]:
        """The tool calls of this conversation waiting for a person's approval, in order."""
        turn = await self.waiting_turn()
        if turn is None:
            return []
        waits = [w for w in turn.waits if w.kind == APPROVAL and not w.answered]
        return [PendingApproval.of(turn.id, w) for w in waits]

    async def approve(
        self, call_id: str, *, note: str | None = None, args: dict[str, Any] | None = None
    ) -> TurnRecord:
        """Approve a waiting tool call, with ``args`` to run it with instead of the model's
        (checked against the tool's schema: :class:`~agentik.core.types.InvalidInput`); the
        turn goes on once every call of its step is answered. Raises
        :class:`~agentik.core.types.UnknownReference` for a call that does not wait here and
        :class:`NotWaiting` for one answered already."""
        answer = Approval(True, note, args).to_json()
        return await self.resume_turn(await self._waiting_for(call_id), call_id, answer)

    async def deny(self, call_id: str, *, note: str | None = None) -> TurnRecord:
        """Deny a waiting tool call: the model gets a result saying a person denied it (with
        the ``note``); see :meth:`approve`."""
        answer = Approval(False, note).to_json()
        return await self.resume_turn(await self._waiting_for(call_id), call_id, answer)

    async def waiting_turn(self) -> TurnRecord | None:
        """This conversation's turn that waits for answers, if one does."""
        if self._evicted:
            return await (await self._current()).waiting_turn()
        held = self.inbox.held
        # held only where this instance runs its turns (elsewhere the store says)
        if held is not None and held.state is TurnState.WAITING and self.ownership.owns(self.id):
            return held
        waiting = [t for t in await self.store.open_turns(self.id) if t.state is TurnState.WAITING]
        return waiting[0] if waiting else None

    async def _waiting_for(self, call_id: str) -> str:
        """The id of the turn whose wait ``call_id`` is (any turn that ever held it)."""
        turn = await self.waiting_turn()
        if turn is not None and any(w.call_id == call_id for w in turn.waits):
            return turn.id
        answered = await self.store.tool_call_turn(self.id, call_id)
        if answered is None:
            raise UnknownReference(f"no tool call {call_id!r} waits for an approval here")
        return answered

    async def turn(self, turn_id: str) -> TurnRecord | None:
        """One of this conversation's turns as it stands (state, steps, waits), or None."""
        record = await self.store.get_turn(turn_id)
        return record if record is not None and record.conversation_id == self.id else None

    # --- history and the rest ---------------------------------------------------------------

    async def get_messages(
        self,
        after: str | None = None,
        offset: int = 0,
        limit: int = 50,
        *,
        max_bytes: int | None = None,
    ) -> list[Message]:
        """A page of the history (``max_bytes``: see :meth:`Store.list_messages`)."""
        return await self.store.list_messages(self.id, after, offset, limit, max_bytes=max_bytes)

    async def rename(self, title: str | None) -> None:
        if self._evicted:
            return await (await self._current()).rename(title)
        now = utcnow()
        await self.store.update_conversation(self.id, updated_at=now, title=title, set_title=True)
        self.title, self.updated_at = title, now
        self.agent.publish("ConversationUpdated", self.id)
        self.ownership.tell(self.id, "rename")

    async def reload_info(self) -> None:
        """Take the title as the store has it (renamed through another instance)."""
        info = await self.store.get_conversation(self.id)
        if info is not None:
            self.title, self.updated_at = info.title, info.updated_at

    async def compact(
        self,
        summarize: Callable[[list[HistoryItem]], Awaitable[str | None]],
        keep_turns: int = KEEP_TURNS,
        min_tokens: int = 0,
    ) -> Compaction | None:
        """Replace the old turns of working memory by one summary (F10's atomic operation).

        The last ``keep_turns`` whole turns (and the running turn) stay as they are; the entries
        before them, an earlier summary included, go to ``summarize``, which returns the summary
        text. Then, in one transaction, they are replaced by one ``summary`` entry and a
        ``summary`` record is added to the audit log; a :class:`Compacted` event follows and the
        live LLM conversation is rebuilt before the next send. None, and nothing changed, when
        there is nothing to summarise, the entries to summarise (an earlier summary aside) hold
        fewer than ``min_tokens`` (too little to gain from a summary call), or ``summarize``
        returned no text or raised (logged). Safe to call between turns and while one runs:
        compactions of a chat run one at a time.
        """
        return await self.context.compact(summarize, keep_turns, min_tokens)

    @property
    def context_tokens(self) -> int | None:
        """Running estimate of the live LLM context in tokens (None: none is built); see
        :mod:`agentik.core.context`."""
        return self.context.tokens

    @property
    def compactions(self) -> int:
        """Compactions of this chat's working memory since it was loaded."""
        return self.context.compactions

    @property
    def llm_builds(self) -> int:
        """How many live LLM conversations were built for this chat (tests and debugging)."""
        return self.context.builds

    async def count_turns(self) -> int:
        """How many turns this conversation has had: its user messages, those still queued
        included. Counted in the store once, then kept up to date by ``send``."""
        inbox = self.inbox
        if inbox.turns is None:
            sends, busy = inbox.sends, inbox.sending
            counted = await self.store.count_turns(self.id)
            if inbox.turns is not None:
                return inbox.turns
            if busy or inbox.sends != sends:
                # a send overlapped the count (a database whose reads suspend: PostgreSQL), so
                # the count may or may not hold it: not kept, the next call counts again
                return counted
            inbox.turns = counted
        return inbox.turns

    async def recent_turns(self, turns: int) -> list[Message]:
        """The audit records of the last ``turns`` turns, oldest first."""
        return await self.store.recent_turns(self.id, turns)

    async def token_stats(self) -> TokenStats:
        return await self.store.token_stats(self.id)

    async def close(self) -> None:
        """Stop the running turn and release the live LLM conversation. Turns still queued or
        waiting stay in the database: the next start takes them up."""
        self.closed = True
        self.inbox.queue.clear()
        self.runner.interrupt()
        if self.inbox.worker is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self.inbox.worker
        await self.context.reset()
        self.log.close()

    async def _current(self) -> ChatConversation:
        """The agent's live object for this conversation (this one may have been evicted)."""
        live = await self.agent.get_conversation(self.id)
        if live is None:
            raise ConversationClosed(f"conversation {self.id} was deleted")
        return live

    def evict(self) -> None:
        """Dropped from the agent's memory while idle: later calls go to a fresh object."""
        self._evicted = True
        # nothing else keeps it: an idle temporary conversation ends here, on its owner (an
        # instance that only served it drops its copy)
        ends = self.is_temporal and self.ownership.owns(self.id)
        if not ends:  # (an ending one's lease goes with it, in one transaction)
            self.ownership.release(self.id)
        self.log.close()
        if self.context.llm is not None:
            self.agent.jobs.spawn(f"release-llm:{self.id}", self.context.reset())
        if ends:
            with self.ownership.unfenced():  # not the work of the turn that evicted it
                self.agent.jobs.spawn(f"forget:{self.id}", self.agent.forget_temporary(self.id))
