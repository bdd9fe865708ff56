"""The agent protocol: what a program may use of an agent and its conversations, whether the
agent runs in this process (:class:`~agentik.core.agent.ChatAgent`) or behind its HTTP API
(:class:`agentik.client.RemoteAgent`). Code written against :class:`Agent` and
:class:`Conversation` runs unchanged against either; ``agentik/protocol_check.py`` makes
mypy prove that both implementations satisfy them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Sequence
from datetime import datetime
from typing import Protocol

from agentik.core.types import ContentPart, ConversationInfo, Event, Message, MessageContext


class EventStream(Protocol):
    """Live events (``async for event in stream``); ``aclose()`` stops reading (the turn goes
    on)."""

    def __aiter__(self) -> AsyncIterator[Event]: ...
    def __anext__(self) -> Awaitable[Event]: ...
    async def aclose(self) -> None: ...


class Conversation(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def title(self) -> str | None: ...
    @property
    def is_temporal(self) -> bool: ...
    @property
    def created_at(self) -> datetime: ...
    @property
    def updated_at(self) -> datetime: ...

    async def send(
        self,
        content: Sequence[ContentPart],
        context: MessageContext | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> Message:
        """Record the user message durably and queue its turn; returns the record."""
        ...

    def events(self, after: int | None = None) -> EventStream:
        """Turn events after the event id ``after``; None: from this call on (make the
        stream before a send to see that send's whole turn)."""
        ...

    async def get_messages(
        self, after: str | None = None, offset: int = 0, limit: int = 50
    ) -> list[Message]:
        """A page of the history, oldest first (``after``: a message id)."""
        ...

    async def rename(self, title: str | None) -> None: ...

    async def ainterrupt(self) -> bool:
        """Stop the running turn; False when none was running. (In process,
        ``ChatConversation.interrupt()`` does the same synchronously.)"""
        ...


class Agent(Protocol):
    async def create_conversation(
        self, temp: bool = False, title: str | None = None
    ) -> Conversation: ...

    async def get_conversation(self, conversation_id: str) -> Conversation | None: ...

    async def list_conversations(
        self, offset: int = 0, limit: int = 50
    ) -> list[ConversationInfo]: ...

    async def delete_conversation(self, conversation_id: str) -> bool: ...

    def events(self, after: int | None = None) -> EventStream:
        """Agent-level events (``AgentEvent``: conversations created, updated, deleted…)."""
        ...


HISTORY_PAGE = 200  # the largest page a conversation gives


async def read_history(conv: Conversation, after: str | None = None) -> list[Message]:
    """Every history record of ``conv`` after the record ``after`` (None: all), oldest first,
    page by page; in process or over HTTP alike."""
    records: list[Message] = []
    while True:
        page = await conv.get_messages(after, 0, HISTORY_PAGE)
        records += page
        if len(page) < HISTORY_PAGE:
            return records
        after = page[-1].id
