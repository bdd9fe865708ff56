"""The chat agent: it owns the conversations (loading, caching and evicting them), the store,
the LLM backend, the tools and the agent-level events.

A conversation lives here, not in a transport: transports only call :class:`ChatAgent` and
:class:`~agentik.core.conversation.ChatConversation` and serialise their events.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import secrets
import socket
from collections import Counter, OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from agentik.core import approvals
from agentik.core.approvals import APPROVAL
from agentik.core.background import Background
from agentik.core.context import TokenScale
from agentik.core.conversation import ChatConversation, ConversationClosed, PromptSection
from agentik.core.embedding import EmbeddingBackend
from agentik.core.events import (
    EVENT_ID_BLOCK,
    AgentEventLog,
    EventIds,
    EventLog,
    SharedEventLog,
    SharedEvents,
    StreamItem,
    unwrap,
)
from agentik.core.failures import log_failure
from agentik.core.jobs import JobRunner
from agentik.core.llm import HistoryItem, LLMBackend, ToolCallRequest
from agentik.core.memory import MemoryBackend
from agentik.core.observe import BEFORE_TURN, CONVERSATION_ID, PLUGIN, Observers
from agentik.core.ownership import Ownership, SharedOwnership
from agentik.core.plugins import call_each
from agentik.core.records import error_record, new_id, utcnow
from agentik.core.runner import RESTART_ERROR
from agentik.core.store import MemoryStore, Store
from agentik.core.tools import TOOL_NAME, ToolRegistry, ToolSpec
from agentik.core.turns import CLIENT_TOOL, TurnRecord, TurnState, Wait
from agentik.core.types import AgentEvent, ConversationInfo, Event, InvalidInput, Message

__all__ = ["ChatAgent", "ChatConversation", "ConversationClosed"]

log = logging.getLogger(__name__)

MAX_ALIAS = 255  # characters of a name another protocol gives a conversation
MAX_TOOL_ROUNDS = 20  # the default of AGENTIK_MAX_TOOL_ROUNDS
CLEAN_STOP = "clean_stop"  # agent state: the last stop recorded the end of every turn it ran
EVENT_IDS = "event_ids"  # agent state: no event id above it was issued (persisted ahead of use)
#: seconds between tries to record the ends of turns the database refused (a full disk)
RECORD_RETRY = 1.0


class ChatAgent:
    """The one agent: owns conversations, the store, the LLM backend and the tools."""

    def __init__(
        self,
        *,
        store: Store,
        llm: LLMBackend,
        tools: ToolRegistry | None = None,
        prompt_sections: Sequence[PromptSection] = (),
        hooks: Any = None,
        event_buffer: int = 1024,
        max_live: int = 256,
        agent_id: str = "agentik",
        resume_queued: bool = True,
        resume_turns: bool = True,
        memory: MemoryBackend | None = None,
        embedding: EmbeddingBackend | None = None,
        before_turn_timeout: float | None = None,
        background_idle: float = 0.0,
        max_tool_rounds: int = MAX_TOOL_ROUNDS,
        lease_ttl: float = 10.0,
    ) -> None:
        self.id = agent_id
        #: this process among the instances of the agent on one database
        self.instance_id = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.store = store
        shared = store.shared()
        #: which conversations this instance runs: all of them, unless it shares its store
        #: with other instances (PostgreSQL: agentik.core.ownership)
        self.ownership: Ownership = (
            Ownership() if shared is None else SharedOwnership(self, shared, lease_ttl)
        )
        #: temporary conversations, alone on the store (where instances share it, they are
        #: in the store with the others: store_of)
        self.temp_store = MemoryStore()
        self.llm = llm
        #: the long-term memory backend (agentik.core.memory), None when memory is off
        self.memory = memory
        #: the embedding backend the memory backend uses (agentik.core.embedding), else None
        self.embedding = embedding
        self.tools = tools or ToolRegistry()
        self.prompt_sections = sorted(prompt_sections, key=lambda s: s[0])
        # a render may take the agent (the state its plugin keeps on it) or nothing
        self._renders = [
            (name, _takes_agent(render), render) for _, name, render in self.prompt_sections
        ]
        self.hooks = hooks  # pluggy's HookRelay, or None in bare unit tests
        #: seconds a turn waits for the ``before_turn`` awaitables (AGENTIK_BEFORE_TURN_TIMEOUT)
        self.before_turn_timeout = before_turn_timeout
        self.event_buffer = event_buffer
        self.jobs = JobRunner(store.leader())
        #: what plugins registered to watch turns (``register_observers``); empty: none is told
        self.observers = Observers()
        #: background model calls (memory review, reflection, mining): they wait until no turn
        #: has run for ``background_idle`` seconds (agentik.core.background)
        self.background = Background(
            self.jobs, self.turns_under_way, idle_after=background_idle, observers=self.observers
        )
        #: how this model's token counts compare with the estimates (agentik.core.context)
        self.token_scale = TokenScale()
        #: tool rounds a turn may take before its model gets one last request without tools
        self.max_tool_rounds = max_tool_rounds
        #: plugins' per-app state, by plugin name (``agent.state.setdefault("my_plugin", …)``):
        #: it lives and dies with this agent, unlike a module global shared by every app
        self.state: dict[str, Any] = {}
        #: conversations held in memory, least recently used first (at most ``max_live`` idle)
        self._live: OrderedDict[str, ChatConversation] = OrderedDict()
        self._deleting: set[str] = set()
        self.max_live = max_live
        #: the sequence ids of every event stream of this agent: they only grow, across restarts
        self.event_ids = EventIds(refill=self._refill_event_ids)
        self._event_mark = 0  # the EVENT_IDS persisted last
        self._events = EventLog(event_buffer, self.event_ids)
        #: how this instance shares events with the others on its database (None: alone)
        self.shared_events: SharedEvents | None = None
        #: logs of conversations being loaded (many instances): the relay fills them already
        self._loading: dict[str, SharedEventLog] = {}
        self.resume_queued = resume_queued
        self.resume_turns = resume_turns
        self._opened = self._closed = False
        #: the server stops: no turn starts any more (messages sent now wait for the next start)
        self.stopping = False
        #: the Error records of turns whose end the database refused, with their store, oldest
        #: first: written once it takes writes again; while any is left a stop is not clean
        self._unrecorded: list[tuple[Store, Message]] = []
        #: conversations with turns the last stop left to run (queued, or cut while running)
        self._to_resume: list[str] = []

    # --- lifecycle ----------------------------------------------------------------------------

    async def open(self) -> int:
        """Open the store and settle the turns the last stop left open; returns how many it
        closed.

        Queued turns run again (:meth:`resume`), unless ``resume_queued`` is off. A turn a crash
        cut while it ran resumes from its last recorded step, unless ``resume_turns`` is off:
        then it ends with a ``restart`` Error record — and so does, after a stop that was not
        clean, the first queued turn of each conversation (the one that was running, before its
        first step was recorded). Waiting turns wait on, in the store: nothing of them is
        loaded until they are answered."""
        await self.store.open()
        self._opened = True
        await self._open_event_ids()
        if self.ownership.shared:
            # other instances may be running turns: nothing is closed here; the sweeper
            # (resume) takes up those whose owner is gone
            await self.ownership.open()
            return 0
        clean = await self.store.read_state(CLEAN_STOP) is not None
        await self.store.write_state(CLEAN_STOP, None)
        cut, heads = 0, set()
        for record in await self.store.open_turns():
            head = record.conversation_id not in heads
            heads.add(record.conversation_id)
            ran = record.state is TurnState.RUNNING or (head and not clean)
            resumed = self.resume_turns if ran else self.resume_queued
            if record.state is TurnState.WAITING or resumed:
                if record.state is not TurnState.WAITING:
                    self._to_resume.append(record.conversation_id)
                continue
            cid = record.conversation_id
            await self.store.fail_turn(
                cid, record.id, error_record(cid, record.id, RESTART_ERROR, "restart")
            )
            cut += 1
        if cut:
            log.warning("closed %d turn(s) cut off by a restart", cut)
        return cut

    async def _open_event_ids(self) -> None:
        """Start the event counter above every id the last process may have issued (on many
        instances: above every id any instance issued), and the relay of the others' events."""
        shared = self.shared_events = self.store.shared_events(self.instance_id)
        if shared is not None:
            # made first: the relay may bring events while it starts
            self._events = AgentEventLog(self.event_buffer, self.event_ids, shared, "", 0)
            self._events.begin_at(await shared.start(self._relayed_log))
            self.event_ids.high = max(self.event_ids.high, await self._reserve_block(shared))
            return
        issued = int(await self.store.read_state(EVENT_IDS) or 0)
        self.event_ids.high = max(self.event_ids.high, issued)
        self._events = EventLog(self.event_buffer, self.event_ids)  # starts there
        await self._reserve_event_ids(self.event_ids.high)

    def _refill_event_ids(self, high: int) -> None:
        self.jobs.spawn("reserve event ids", self._reserve_event_ids(high))

    async def _reserve_event_ids(self, high: int) -> None:
        """Persist a mark a block above ``high``: ids up to it need no write."""
        if self.shared_events is not None:
            await self._reserve_block(self.shared_events)
            return
        mark = high + EVENT_ID_BLOCK
        await self.store.write_state(EVENT_IDS, str(mark))
        self._event_mark = mark
        self.event_ids.reserved(mark, EVENT_ID_BLOCK)

    async def _reserve_block(self, shared: SharedEvents) -> int:
        """Many instances: the next block of the database's sequence (above every block any
        instance got before) is this one's to issue; returns its first id."""
        first = await shared.reserve_ids()
        self.event_ids.reserved(first + EVENT_ID_BLOCK - 1, EVENT_ID_BLOCK)
        return first

    async def produce_events(self, conv: ChatConversation) -> None:
        """This instance becomes the producer of ``conv``'s events (it took the conversation
        over, or loaded it as its owner): its next ids come from a block reserved now, above
        every id any instance gave them before, so a ``Last-Event-ID`` from the last owner
        stays valid here. Nothing to do on a single instance."""
        if self.shared_events is not None and isinstance(conv.log, SharedEventLog):
            conv.log.skip_to(await self._reserve_block(self.shared_events))

    def _relayed_log(self, stream: str) -> SharedEventLog | None:
        """Where the relay puts another instance's event of ``stream``: the agent's log, or
        the log of a conversation held here (one nobody holds here has no reader here)."""
        if not stream:
            return self._events if isinstance(self._events, SharedEventLog) else None
        conv = self._live.get(stream)
        if conv is None:
            return self._loading.get(stream)
        return conv.log if isinstance(conv.log, SharedEventLog) else None

    def event_log(self, info: ConversationInfo, start: int | None = None) -> EventLog:
        """A new event log for a conversation; on many instances one shared with the others
        (``start``: the newest id of its stream the database holds, for one loaded here)."""
        if self.shared_events is None:
            return EventLog(self.event_buffer, self.event_ids)
        # one made here (start None) has no event anywhere yet: from 0, not from this
        # instance's counter, so whatever its producer gives it is news (a producer moves its
        # log above every id issued before: produce_events)
        shared = self.shared_events
        return SharedEventLog(self.event_buffer, self.event_ids, shared, info.id, start or 0)

    async def resume(self) -> int:
        """Take up the turns the last stop left to run, in order (called once the tools are
        up); returns how many."""
        if self.ownership.shared:
            return await self.ownership.start()
        turns, self._to_resume = Counter(self._to_resume), []
        count = 0
        for conversation_id, n in turns.items():
            conv = await self.get_conversation(conversation_id)
            if conv is not None:
                conv.inbox.start()
                count += n
        if count:
            log.info("taking up %d turn(s) left by the last stop", count)
        return count

    async def stop_turns(self) -> None:
        """Shutdown: start no more turns, interrupt the running ones and wait until each has
        recorded its end, so its listeners get Interrupted and End before their streams close;
        then record that the stop is clean. Queued messages, and those sent from now on, stay
        in the database and run after the next start (unless ``resume_queued`` is off): a stop
        never closes them, even if the process is killed before it exits. A waiting turn waits
        on (it holds nothing).

        Sharing the store with other instances alive now, a stop hands its turns over
        instead: the running ones are cut as a crash would cut them (no end recorded, no
        Interrupted), the leases released and the others told: one of them resumes each from
        its last recorded step, and its clients' streams go on there (Last-Event-ID)."""
        self.stopping = True
        busy = [conv for conv in self._live.values() if conv.inbox.running]
        shared = await self.ownership.others_alive()
        for conv in busy:
            if shared:
                conv.runner.abandon()
            else:
                conv.runner.interrupt()
        await asyncio.gather(*(conv.wait_idle() for conv in busy))
        if shared:
            await self.ownership.hand_off()
        await self._mark_clean_stop()

    async def _mark_clean_stop(self) -> None:
        """No turn runs and every end is recorded: the next start runs every unfinished turn."""
        if self.unrecorded_ends:
            return
        try:
            await self.store.write_state(CLEAN_STOP, utcnow().isoformat())
        except Exception as e:  # the next start treats the stop as a crash
            log.warning("could not record the clean stop: %s", e)

    def end_streams(self) -> None:
        """End every live event stream (shutdown): SSE handlers return, clients disconnect."""
        for conv in self._live.values():
            conv.log.close()
        self._events.close()

    @property
    def unrecorded_ends(self) -> int:
        """Turns whose end the database refused and that are not recorded yet."""
        return len(self._unrecorded)

    def record_end_later(self, store: Store, record: Message) -> None:
        """Write a turn's Error ``record`` (``userMessageId``: the turn) as soon as ``store``
        takes writes again: the turn the disk filled under ends in the history once the disk is
        back, not only at the next start."""
        self._unrecorded.append((store, record))
        if len(self._unrecorded) == 1:
            self.jobs.spawn("recording the ends of turns", self._record_ends())

    def unrecorded_state(self, turn_id: str) -> tuple[str, str] | None:
        """``("failed", "storage")`` while the end of the turn ``turn_id`` waits to be
        recorded (:meth:`ChatConversation.turn_state`), else None."""
        if any(r.payload["userMessageId"] == turn_id for _, r in self._unrecorded):
            return "failed", "storage"
        return None

    async def _record_ends(self, retry: float = RECORD_RETRY) -> None:
        while self._unrecorded:
            await asyncio.sleep(retry)
            if await self._try_record_ends():
                log.info("recorded the ends of turns the database had refused")

    async def _try_record_ends(self) -> bool:
        """Write the waiting Error records, in order; False at the first that fails."""
        while self._unrecorded:
            store, record = self._unrecorded[0]
            cid, turn_id = record.conversation_id, record.payload["userMessageId"]
            try:
                if await store.get_conversation(cid) is not None:  # else deleted meanwhile
                    await store.fail_turn(cid, turn_id, record)
            except Exception:
                return False
            self._unrecorded.pop(0)
        return True

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._opened:  # start-up failed before the store opened: nothing to close
            self._events.close()
            await self.jobs.close()
            return
        for conv in list(self._live.values()):
            await conv.close()
        await self.ownership.close()
        self._events.close()
        await self.jobs.close()
        if self.shared_events is not None:
            await self.shared_events.close()
        elif self.event_ids.high > self._event_mark:  # a reservation cut by the shutdown
            await self.store.write_state(EVENT_IDS, str(self.event_ids.high))
        await self._try_record_ends()
        # every turn that ran has recorded its end: the next start runs what is left
        await self._mark_clean_stop()
        await self.store.close()

    # --- the protocol -------------------------------------------------------------------------

    async def create_conversation(
        self, temp: bool = False, title: str | None = None
    ) -> ChatConversation:
        now = utcnow()
        info = ConversationInfo(new_id("conv"), title, temp, now, now)
        await self.ownership.create(self.store_of(temp), info)
        conv = self._remember(ChatConversation(self, info))
        self.publish("ConversationCreated", info.id)
        return conv

    async def aliased_conversation(
        self, namespace: str, key: str, title: str | None = None
    ) -> ChatConversation:
        """The conversation another protocol names ``key`` (``namespace``: the protocol, e.g.
        ``"agui"`` for AG-UI thread ids), created on first use with ``title``; the name is kept
        in the database, so it finds the same conversation after a restart. A key is 1 to
        ``MAX_ALIAS`` characters (:class:`InvalidInput` otherwise): it names a conversation for
        good."""
        if not key or len(key) > MAX_ALIAS:
            raise InvalidInput(f"a conversation's name must be 1 to {MAX_ALIAS} characters")
        now = utcnow()
        new = ConversationInfo(new_id("conv"), title, False, now, now)
        info, created = await self.store.aliased_conversation(namespace, key, new)
        if created:
            conv = self._remember(ChatConversation(self, info))
            self.publish("ConversationCreated", info.id)
            return conv
        known = await self.get_conversation(info.id)
        if known is None:  # its deletion is under way; the alias goes with it
            raise ConversationClosed(f"conversation {info.id} is being deleted")
        return known

    async def get_conversation(self, conversation_id: str) -> ChatConversation | None:
        if conversation_id in self._deleting:
            return None
        conv = self._live.get(conversation_id)
        if conv is not None:
            self._live.move_to_end(conversation_id)
            return conv
        info = await self.temp_store.get_conversation(conversation_id)
        turns: list[TurnRecord] = []
        if info is None:
            info = await self.store.get_conversation(conversation_id)
            if info is not None:
                turns = await self.store.open_turns(conversation_id)
        if info is None or conversation_id in self._deleting:
            return None
        log = None
        if self.shared_events is not None:
            log = await self._load_event_log(self.shared_events, info)
        conv = self._live.get(conversation_id)  # another caller may have loaded it meanwhile
        if conv is None:
            conv = self._remember(ChatConversation(self, info, turns, log))
        return conv

    async def _load_event_log(self, shared: SharedEvents, info: ConversationInfo) -> SharedEventLog:
        """The log of a conversation loaded here, on many instances: its events go on from the
        newest any instance published (the relay brings the next ones). The relay fills it
        while that is read: nothing published meanwhile falls between the two."""
        log = self._loading.get(info.id)
        if log is None:
            log = self._loading[info.id] = SharedEventLog(
                self.event_buffer, self.event_ids, shared, info.id, 0
            )
        try:
            log.begin_at(await shared.last_seq(info.id))
        finally:
            if self._loading.get(info.id) is log:
                del self._loading[info.id]
        return log

    def conversations_in_memory(self) -> list[ChatConversation]:
        """The conversations held in memory now (for metrics: their queues, their readers)."""
        return list(self._live.values())

    @property
    def event_readers(self) -> int:
        """Readers of the agent-level event stream now."""
        return self._events.readers

    def live_conversation(self, conversation_id: str) -> ChatConversation | None:
        """The conversation's object if it is in memory now (no load)."""
        return self._live.get(conversation_id)

    def _remember(self, conv: ChatConversation) -> ChatConversation:
        self._live[conv.id] = conv
        self.evict_idle(keep=conv.id)
        return conv

    def touch(self, conversation_id: str) -> None:
        """Mark a conversation as just used (it is evicted last)."""
        if conversation_id in self._live:
            self._live.move_to_end(conversation_id)

    def evict_idle(self, keep: str | None = None) -> None:
        """Drop the least recently used idle conversations beyond ``max_live`` from memory.

        Their history is in the store and they are reloaded on demand; what is lost is the live
        LLM conversation (rebuilt from working memory) and the replay buffer of their events.
        ``keep`` (the conversation just loaded) is never dropped.
        """
        excess = len(self._live) - self.max_live
        if excess <= 0:
            return
        for cid, conv in list(self._live.items()):
            if conv.idle and cid != keep:
                del self._live[cid]
                conv.evict()
                excess -= 1
                if excess == 0:
                    return

    async def delete_conversation(self, conversation_id: str) -> bool:
        self._deleting.add(conversation_id)
        try:
            conv = self._live.pop(conversation_id, None)
            if conv is not None:
                await conv.close()
            deleted = await self.temp_store.delete_conversation(
                conversation_id
            ) or await self.store.delete_conversation(conversation_id)
        finally:
            self._deleting.discard(conversation_id)
        if deleted:
            self.ownership.forget(conversation_id)
            self.publish("ConversationDeleted", conversation_id)
        return deleted

    def drop(self, conversation_id: str, *, deleted: bool = False) -> None:
        """Another instance runs this conversation now (``deleted``: it was deleted there):
        this one forgets its copy, writing nothing more of it."""
        conv = self._live.pop(conversation_id, None)
        if conv is None:
            return
        if deleted:
            self.jobs.spawn(f"forget {conversation_id}", conv.close())
        else:
            conv.evict()

    async def list_conversations(self, offset: int = 0, limit: int = 50) -> list[ConversationInfo]:
        """A page of persisted conversations, most recently updated first."""
        return await self.store.list_conversations(offset, limit)

    def is_busy(self, conversation_id: str) -> bool:
        conv = self._live.get(conversation_id)
        return conv is not None and conv.busy

    async def busy_among(self, conversation_ids: Sequence[str]) -> set[str]:
        """Which of these conversations are busy: those this instance owns as its memory says
        (:meth:`is_busy`), the others as the store's turn table says (one query): a copy in
        memory here of a conversation another instance runs (loaded by a reader) is not kept
        up to date."""
        busy = {c for c in conversation_ids if self.ownership.owns(c) and self.is_busy(c)}
        elsewhere = [c for c in conversation_ids if not self.ownership.owns(c)]
        if elsewhere:
            busy |= await self.store.busy_conversations(elsewhere)
        return busy

    def turns_under_way(self) -> bool:
        """Whether a user turn is queued or running in any conversation (they all share the
        one LLM backend); a waiting turn asks nothing of the model."""
        return any(conv.inbox.running for conv in self._live.values())

    async def count_conversations(self) -> int:
        return await self.store.count_conversations()

    def events(self, after: int | None = None) -> AsyncGenerator[Event, None]:
        """Agent-level events (``AgentEvent``: a conversation created, updated, deleted, a turn
        started or ended; ``UserMessage``: a message accepted in a conversation) after
        ``after``; None: from this call on."""
        return unwrap(self.event_items(after))

    @property
    def last_event_id(self) -> int:
        """The sequence id of the newest agent-level event."""
        return self._events.last_seq

    async def events_now(self) -> int:
        """The id a reader of agent-level events from now on starts after (``last_event_id``,
        counting this instance's events still on their way back on many instances)."""
        return await self._events.now()

    def event_items(self, after: int | None = None) -> AsyncGenerator[StreamItem, None]:
        """:meth:`events` with their sequence ids, for transports."""
        return self._events.subscribe(self._events.last_seq if after is None else after)

    def event_batches(
        self, after: int | None = None, linger: float = 0.0
    ) -> AsyncGenerator[list[StreamItem], None]:
        return self._events.batches(after, linger)

    # --- used by conversations ----------------------------------------------------------------

    def store_of(self, temporary: bool) -> Store:
        """Where a conversation is kept: a temporary one in this process's memory, never
        written, unless instances share the store: then in it with the others (marked
        temporary: not listed, counted or summed), so that every instance serves it."""
        return self.temp_store if temporary and not self.ownership.shared else self.store

    async def forget_temporary(self, conversation_id: str) -> None:
        """A temporary conversation its owner let go idle ends: deleted (unless a send came
        through another instance meanwhile: it lives on)."""
        if await self.ownership.end_temporary(self.store_of(True), conversation_id):
            self.deleted(conversation_id)

    def deleted(self, conversation_id: str) -> None:
        """A conversation was deleted from the store, by this instance but not through
        :meth:`delete_conversation` (a temporary one that ended): this instance drops its copy,
        the others are told to, and the agent's readers get ``ConversationDeleted``."""
        self.drop(conversation_id, deleted=True)
        self.ownership.forget(conversation_id)
        self.publish("ConversationDeleted", conversation_id)

    def publish(self, kind: str, conversation_id: str) -> None:
        self._events.publish(AgentEvent(kind, conversation_id))

    def announce(self, event: Event) -> None:
        """Put an event of a conversation on the agent's stream as it is (``UserMessage``)."""
        self._events.publish(event)

    def turn_started(self, conversation_id: str) -> None:
        """A turn starts: say so, and cut short the background model call under way."""
        self.publish("TurnStarted", conversation_id)
        self.background.turn_started()

    def conversation_idle(self) -> None:
        """A conversation ran its last queued turn: idle ones may be evicted, and background
        model calls count their idle time from now."""
        self.background.turn_ended()
        self.evict_idle()

    def system_prompt(self) -> str:
        parts = []
        for name, takes_agent, render in self._renders:
            try:
                text = render(self) if takes_agent else render()
            except Exception:
                log.exception("system prompt section %s failed; left out", name)
                continue
            if isinstance(text, str) and text:
                parts.append(text.strip())
        return "\n\n".join(parts)

    def _call_each(self, hook: str, conv: ChatConversation, **kwargs: Any) -> list[tuple[str, Any]]:
        """Every implementation of a turn hook on its own: one that raises is logged with its
        plugin's name and the others' results are kept."""
        if self.hooks is None:
            return []
        caller = getattr(self.hooks, hook)
        results = call_each(caller, f" in {conv.id}", conversation=conv, **kwargs)
        return [(plugin, r) for plugin, r in results if r is not None]

    async def before_turn(self, conv: ChatConversation, text: str) -> str:
        """The blocks the ``before_turn`` hooks put before the user's text, in hook order. Their
        awaitables run at once, for at most ``before_turn_timeout`` seconds: context enrichment
        is best effort, so a failing or late plugin's block is left out, not the turn."""
        results = self._call_each("before_turn", conv, text=text)
        pending = [i for i, (_, r) in enumerate(results) if inspect.isawaitable(r)]
        if len(pending) == 1 and not self.observers:
            # the usual case, one plugin's work (memory's prefetch): awaited in the turn's own
            # task, not in a task of its own (that and asyncio.wait cost ~35 µs a turn)
            plugin, work = results[pending[0]]
            results[pending[0]] = (plugin, await self._before_turn_of(conv, plugin, work))
            return "\n\n".join(str(result) for _, result in results if result)
        tasks = {
            i: asyncio.ensure_future(r)
            for i, (_, r) in enumerate(results)
            if inspect.isawaitable(r)
        }
        if self.observers:
            for i, work in tasks.items():
                self._observe_before_turn(conv, results[i][0], work)
        late: set[asyncio.Future[Any]] = set()
        try:
            if tasks:
                _, late = await asyncio.wait(tasks.values(), timeout=self.before_turn_timeout)
        finally:
            for running in tasks.values():
                running.cancel()  # those still running: late, or the turn was interrupted
        blocks = []
        for i, (plugin, result) in enumerate(results):
            task = tasks.get(i)
            if task is not None and task in late:
                self._late_before_turn(conv, plugin)
                continue
            if task is not None:
                error = task.exception()
                if error is not None:
                    log_failure(f"before_turn of plugin {plugin} in {conv.id}", error)
                    continue
                result = task.result()
            if result:
                blocks.append(str(result))
        return "\n\n".join(blocks)

    async def _before_turn_of(self, conv: ChatConversation, plugin: str, work: Any) -> Any:
        """One plugin's ``before_turn`` awaitable, for at most ``before_turn_timeout`` seconds;
        None when it failed or was late (logged)."""
        deadline = asyncio.timeout(self.before_turn_timeout)
        try:
            async with deadline:
                return await work
        except Exception as error:
            if deadline.expired():
                self._late_before_turn(conv, plugin)
            else:
                log_failure(f"before_turn of plugin {plugin} in {conv.id}", error)
            return None

    def _late_before_turn(self, conv: ChatConversation, plugin: str) -> None:
        log.warning(
            "before_turn of plugin %s did not answer within %g s in %s "
            "(AGENTIK_BEFORE_TURN_TIMEOUT): the turn goes on without it",
            plugin,
            self.before_turn_timeout,
            conv.id,
        )

    def _observe_before_turn(self, conv: ChatConversation, plugin: str, task: Any) -> None:
        """A span for one plugin's ``before_turn`` work (memory prefetch), beside the others."""
        attributes = {CONVERSATION_ID: conv.id, PLUGIN: plugin}
        span = self.observers.start(
            BEFORE_TURN, f"{BEFORE_TURN} {plugin}", attributes, current=False
        )

        def ended(task: asyncio.Future[Any]) -> None:
            if task.cancelled():  # late (AGENTIK_BEFORE_TURN_TIMEOUT), or the turn interrupted
                span.end("cancelled")
            else:
                error = task.exception()
                span.end(None if error is None else type(error).__name__)

        task.add_done_callback(ended)

    async def before_compaction(self, conv: ChatConversation, items: list[HistoryItem]) -> None:
        """Run every ``before_compaction`` hook on the entries about to be summarised, at once;
        a failing one is logged and the others go on (the compaction never waits on an error)."""
        pending = [
            (plugin, result)
            for plugin, result in self._call_each("before_compaction", conv, items=items)
            if isinstance(result, Awaitable)
        ]
        outcomes = await asyncio.gather(*(r for _, r in pending), return_exceptions=True)
        for (plugin, _), outcome in zip(pending, outcomes, strict=True):
            if isinstance(outcome, Exception):
                log_failure(f"before_compaction of plugin {plugin} in {conv.id}", outcome)

    def tool_gates(self, conv: ChatConversation, calls: list[ToolCallRequest]) -> tuple[Wait, ...]:
        """What the ``tool_call_gate`` hooks hold of a step's tool calls (one wait per call at
        most; a gate that raises is logged and holds nothing)."""
        if self.hooks is None or not self.hooks.tool_call_gate.get_hookimpls():
            return ()
        waits = []
        for call in calls:
            for _, wait in self._call_each("tool_call_gate", conv, call=call):
                if isinstance(wait, Wait):
                    waits.append(replace(wait, call_id=call.call_id))
                    break
        return tuple(waits)

    def turn_tools(self, conv: ChatConversation, turn: TurnRecord) -> tuple[ToolSpec, ...]:
        """The tools the ``turn_tools`` hooks offer for this turn only (the first of a name;
        none that the agent's own tools name, or that no model would take)."""
        if self.hooks is None or not self.hooks.turn_tools.get_hookimpls():
            return ()
        offered: dict[str, ToolSpec] = {}
        for plugin, specs in self._call_each("turn_tools", conv, turn=turn):
            for spec in specs:
                if spec.name in self.tools or not TOOL_NAME.match(spec.name):
                    log.warning(
                        "turn tool %r of plugin %s left out: the agent has a tool of that name, "
                        "or the name is not a tool name",
                        spec.name,
                        plugin,
                    )
                    continue
                offered.setdefault(spec.name, spec)
        return tuple(offered.values())

    def tool_answer(
        self, conv: ChatConversation, call: ToolCallRequest, wait: Wait
    ) -> ToolCallRequest | tuple[str, bool]:
        """What an answered wait makes of its call: the ``tool_call_answer`` hook's verdict (a
        call to run, its arguments perhaps changed, or a result), else the default: an answer
        that is text, or ``{"result": text, "isError": bool}``, is the call's result; any
        other answer lets the call run as the model made it."""
        for _, verdict in self._call_each("tool_call_answer", conv, call=call, wait=wait):
            if isinstance(verdict, ToolCallRequest):
                return verdict
            if isinstance(verdict, tuple) and len(verdict) == 2:
                return str(verdict[0]), bool(verdict[1])
        if wait.kind == APPROVAL:
            return approvals.outcome(call, wait)
        answer = wait.answer
        if isinstance(answer, str):
            return answer, False
        if isinstance(answer, dict) and isinstance(answer.get("result"), str):
            return answer["result"], bool(answer.get("isError", False))
        if wait.kind == CLIENT_TOOL:  # the agent cannot run it: the answer had to be its result
            return "Error: the client gave no result for this call", True
        return call

    def after_turn(self, conv: ChatConversation, user_text: str, assistant_text: str) -> None:
        results = self._call_each(
            "after_turn", conv, user_text=user_text, assistant_text=assistant_text
        )
        with self.ownership.unfenced():  # the plugin's work, not the turn's: it may outlive it
            for plugin, result in results:
                if isinstance(result, Awaitable):
                    self.jobs.spawn(f"after_turn of plugin {plugin} in {conv.id}", result)


def _takes_agent(render: Callable[..., Any]) -> bool:
    """Whether a prompt section's ``render`` takes the agent: ``render(agent)``, not
    ``render()``."""
    try:
        params = inspect.signature(render).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: called as render()
        return False
    return any(
        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params
    )
