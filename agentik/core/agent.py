"""The chat agent: it owns the conversations (loading, caching and evicting them), the store,
the LLM backend, the tools and the agent-level events.

A conversation lives here, not in a transport: transports only call :class:`ChatAgent` and
:class:`~agentik.core.conversation.ChatConversation` and serialise their events.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any

from agentik.core.background import Background
from agentik.core.context import TokenScale
from agentik.core.conversation import (
    RESTART_ERROR,
    ChatConversation,
    ConversationClosed,
    PromptSection,
    error_record,
    new_id,
    unwrap_events,
)
from agentik.core.embedding import EmbeddingBackend
from agentik.core.events import EventLog, StreamItem
from agentik.core.jobs import JobRunner
from agentik.core.llm import HistoryItem, LLMBackend
from agentik.core.memory import MemoryBackend
from agentik.core.plugins import call_each
from agentik.core.store import MemoryStore, Store, utcnow
from agentik.core.tools import ToolRegistry
from agentik.core.types import AgentEvent, ConversationInfo, Event, InvalidInput, Message

__all__ = ["ChatAgent", "ChatConversation", "ConversationClosed"]

log = logging.getLogger(__name__)

MAX_ALIAS = 255  # characters of a name another protocol gives a conversation
MAX_TOOL_ROUNDS = 20  # the default of AGENTIK_MAX_TOOL_ROUNDS
CLEAN_STOP = "clean_stop"  # agent state: the last stop recorded the end of every running turn


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
        memory: MemoryBackend | None = None,
        embedding: EmbeddingBackend | None = None,
        background_idle: float = 0.0,
        max_tool_rounds: int = MAX_TOOL_ROUNDS,
    ) -> None:
        self.id = agent_id
        self.store = store
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
        self.event_buffer = event_buffer
        self.jobs = JobRunner()
        #: background model calls (memory review, reflection, mining): they wait until no turn
        #: has run for ``background_idle`` seconds (agentik.core.background)
        self.background = Background(self.jobs, self.turns_under_way, idle_after=background_idle)
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
        self._events = EventLog(event_buffer)
        self.resume_queued = resume_queued
        self._opened = self._closed = False
        #: turns whose end could not be recorded: such a stop is not clean (see :meth:`close`)
        self.unrecorded_ends = 0
        #: acknowledged messages whose turns never started before the last stop, by conversation
        self._unstarted: dict[str, list[Message]] = {}

    # --- lifecycle ----------------------------------------------------------------------------

    async def open(self) -> int:
        """Open the store and close the turns a stop cut off; returns how many were closed.

        After a crash, a conversation's first unfinished turn is the one that ran (turns run
        one at a time): it is closed with a ``restart`` Error record. The messages queued
        behind it never started, nor did any after a clean stop (which records the end of the
        turns it stops): :meth:`resume` runs them (with ``resume_queued`` off they are closed
        the same way)."""
        await self.store.open()
        self._opened = True
        clean = await self.store.read_state(CLEAN_STOP) is not None
        await self.store.write_state(CLEAN_STOP, None)
        cut: list[Message] = []
        for msg in await self.store.dangling_turns():
            queued = self._unstarted.get(msg.conversation_id)
            if queued is None and not clean:
                self._unstarted[msg.conversation_id] = []
                cut.append(msg)
            elif self.resume_queued:
                self._unstarted.setdefault(msg.conversation_id, []).append(msg)
            else:
                cut.append(msg)
        for msg in cut:
            await self.store.fail_turn(
                msg.conversation_id,
                msg.id,
                error_record(msg.conversation_id, msg.id, RESTART_ERROR, "restart"),
            )
        if cut:
            log.warning("closed %d turn(s) cut off by a restart", len(cut))
        return len(cut)

    async def resume(self) -> int:
        """Run the acknowledged messages whose turns never started before the last stop, in
        order (called once the tools are up); returns how many were queued."""
        unstarted, self._unstarted = self._unstarted, {}
        count = 0
        for conversation_id, messages in unstarted.items():
            conv = await self.get_conversation(conversation_id) if messages else None
            if conv is not None:
                conv.requeue(messages)
                count += len(messages)
        if count:
            log.info("running %d message(s) queued before the restart", count)
        return count

    async def stop_turns(self) -> None:
        """Shutdown: interrupt the running turns and wait until each has recorded its end, so
        its listeners get Interrupted and End before their streams close. Queued messages stay
        in the database and run after the next start (unless ``resume_queued`` is off)."""
        busy = [conv for conv in self._live.values() if conv.busy]
        await asyncio.gather(*(conv.close() for conv in busy))

    def end_streams(self) -> None:
        """End every live event stream (shutdown): SSE handlers return, clients disconnect."""
        for conv in self._live.values():
            conv._events.close()
        self._events.close()

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
        self._events.close()
        await self.jobs.close()
        if not self.unrecorded_ends:
            # every turn that ran has recorded its end: the next start runs what is left
            await self.store.write_state(CLEAN_STOP, utcnow().isoformat())
        await self.store.close()

    # --- the protocol -------------------------------------------------------------------------

    async def create_conversation(
        self, temp: bool = False, title: str | None = None
    ) -> ChatConversation:
        now = utcnow()
        info = ConversationInfo(new_id("conv"), title, temp, now, now)
        await (self.temp_store if temp else self.store).create_conversation(info)
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
        info = await self.temp_store.get_conversation(
            conversation_id
        ) or await self.store.get_conversation(conversation_id)
        if info is None or conversation_id in self._deleting:
            return None
        conv = self._live.get(conversation_id)  # another caller may have loaded it meanwhile
        return conv if conv is not None else self._remember(ChatConversation(self, info))

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
                conv._evict()
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
            self.publish("ConversationDeleted", conversation_id)
        return deleted

    async def list_conversations(self, offset: int = 0, limit: int = 50) -> list[ConversationInfo]:
        """A page of persisted conversations, most recently updated first."""
        return await self.store.list_conversations(offset, limit)

    def is_busy(self, conversation_id: str) -> bool:
        conv = self._live.get(conversation_id)
        return conv is not None and conv.busy

    def turns_under_way(self) -> bool:
        """Whether a user turn is queued or running in any conversation (they all share the
        one LLM backend)."""
        return any(conv.busy for conv in self._live.values())

    async def count_conversations(self) -> int:
        return await self.store.count_conversations()

    def events(self, after: int | None = None) -> AsyncGenerator[Event, None]:
        """Agent-level events (``AgentEvent``: a conversation created, updated, deleted, a turn
        started or ended) after ``after``; None: from this call on."""
        return unwrap_events(self.event_items(after))

    @property
    def last_event_id(self) -> int:
        """The sequence id of the newest agent-level event."""
        return self._events.last_seq

    def event_items(self, after: int | None = None) -> AsyncGenerator[StreamItem, None]:
        """:meth:`events` with their sequence ids, for transports."""
        return self._events.subscribe(self._events.last_seq if after is None else after)

    def event_batches(
        self, after: int | None = None, linger: float = 0.0
    ) -> AsyncGenerator[list[StreamItem], None]:
        return self._events.batches(after, linger)

    # --- used by conversations ----------------------------------------------------------------

    async def forget_temporary(self, conversation_id: str) -> None:
        if await self.temp_store.delete_conversation(conversation_id):
            self.publish("ConversationDeleted", conversation_id)

    def publish(self, kind: str, conversation_id: str) -> None:
        self._events.publish(AgentEvent(kind, conversation_id))

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
            if text:
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
        blocks = []
        # context enrichment is best effort: a failing plugin's block is left out, not the turn
        for plugin, result in self._call_each("before_turn", conv, text=text):
            if isinstance(result, Awaitable):
                try:
                    result = await result
                except Exception:
                    log.exception("before_turn of plugin %s failed in %s", plugin, conv.id)
                    continue
            if result:
                blocks.append(str(result))
        return "\n\n".join(blocks)

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
                log.error(
                    "before_compaction of plugin %s failed in %s", plugin, conv.id, exc_info=outcome
                )

    def after_turn(self, conv: ChatConversation, user_text: str, assistant_text: str) -> None:
        results = self._call_each(
            "after_turn", conv, user_text=user_text, assistant_text=assistant_text
        )
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
