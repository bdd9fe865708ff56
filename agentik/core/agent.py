"""The chat agent: it owns the conversations (loading, caching and evicting them), the store,
the LLM backend, the tools and the agent-level events.

A conversation lives here, not in a transport: transports only call :class:`ChatAgent` and
:class:`~agentik.core.conversation.ChatConversation` and serialise their events.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Sequence
from typing import Any

from agentik.core.conversation import (
    RESTART_ERROR,
    ChatConversation,
    ConversationClosed,
    PromptSection,
    error_record,
    new_id,
)
from agentik.core.events import EventLog, StreamItem
from agentik.core.jobs import JobRunner
from agentik.core.llm import HistoryItem, LLMBackend
from agentik.core.memory import MemoryBackend
from agentik.core.store import MemoryStore, Store, utcnow
from agentik.core.tools import ToolRegistry
from agentik.core.types import AgentEvent, ConversationInfo

__all__ = ["ChatAgent", "ChatConversation", "ConversationClosed"]

log = logging.getLogger(__name__)


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
        memory: MemoryBackend | None = None,
    ) -> None:
        self.id = agent_id
        self.store = store
        self.temp_store = MemoryStore()
        self.llm = llm
        #: the long-term memory backend (agentik.core.memory), None when memory is off
        self.memory = memory
        self.tools = tools or ToolRegistry()
        self.prompt_sections = sorted(prompt_sections, key=lambda s: s[0])
        self.hooks = hooks  # pluggy's HookRelay, or None in bare unit tests
        self.event_buffer = event_buffer
        self.jobs = JobRunner()
        #: conversations held in memory, least recently used first (at most ``max_live`` idle)
        self._live: OrderedDict[str, ChatConversation] = OrderedDict()
        self._deleting: set[str] = set()
        self.max_live = max_live
        self._events = EventLog(event_buffer)

    # --- lifecycle ----------------------------------------------------------------------------

    async def open(self) -> int:
        """Open the store and close turns a crash cut off; returns how many were closed."""
        await self.store.open()
        dangling = await self.store.dangling_turns()
        for conversation_id, user_id in dangling:
            await self.store.fail_turn(
                conversation_id,
                user_id,
                error_record(conversation_id, user_id, RESTART_ERROR, "restart"),
            )
        if dangling:
            log.warning("closed %d turn(s) cut off by a restart", len(dangling))
        return len(dangling)

    def end_streams(self) -> None:
        """End every live event stream (shutdown): SSE handlers return, clients disconnect."""
        for conv in self._live.values():
            conv._events.close()
        self._events.close()

    async def close(self) -> None:
        for conv in list(self._live.values()):
            await conv.close()
        self._events.close()
        await self.jobs.close()
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

    async def count_conversations(self) -> int:
        return await self.store.count_conversations()

    def events(self, after: int | None = None) -> AsyncIterator[StreamItem]:
        return self._events.subscribe(after)

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

    def system_prompt(self) -> str:
        parts = []
        for _order, name, render in self.prompt_sections:
            try:
                text = render()
            except Exception:
                log.exception("system prompt section %s failed; left out", name)
                continue
            if text:
                parts.append(text.strip())
        return "\n\n".join(parts)

    async def before_turn(self, conv: ChatConversation, text: str) -> str:
        if self.hooks is None:
            return ""
        blocks = []
        try:
            for result in self.hooks.before_turn(conversation=conv, text=text):
                if isinstance(result, Awaitable):
                    result = await result
                if result:
                    blocks.append(str(result))
        except Exception:
            # context enrichment is best effort: the turn goes on without it
            log.exception("a before_turn hook failed in %s", conv.id)
        return "\n\n".join(blocks)

    async def before_compaction(self, conv: ChatConversation, items: list[HistoryItem]) -> None:
        """Run every ``before_compaction`` hook on the entries about to be summarised, at once;
        a failing one is logged and the others go on (the compaction never waits on an error)."""
        if self.hooks is None:
            return
        pending = []
        for impl in self.hooks.before_compaction.get_hookimpls():
            try:
                result = impl.function(conversation=conv, items=items)
            except Exception:
                log.exception(
                    "before_compaction of plugin %s failed in %s", impl.plugin_name, conv.id
                )
                continue
            if isinstance(result, Awaitable):
                pending.append((impl.plugin_name, result))
        outcomes = await asyncio.gather(*(r for _, r in pending), return_exceptions=True)
        for (plugin, _), outcome in zip(pending, outcomes, strict=True):
            if isinstance(outcome, Exception):
                log.error(
                    "before_compaction of plugin %s failed in %s", plugin, conv.id, exc_info=outcome
                )

    def after_turn(self, conv: ChatConversation, user_text: str, assistant_text: str) -> None:
        if self.hooks is None:
            return
        try:
            results = self.hooks.after_turn(
                conversation=conv, user_text=user_text, assistant_text=assistant_text
            )
        except Exception:
            log.exception("an after_turn hook failed in %s", conv.id)
            return
        for result in results:
            if isinstance(result, Awaitable):
                self.jobs.spawn(f"after_turn:{conv.id}", result)
