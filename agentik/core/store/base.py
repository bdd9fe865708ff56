"""The store contract: conversations, their audit log and their working memory.

The agent only talks to :class:`Store`, so another database can replace SQLite without touching
the turn engine; ``tests/store_contract.py`` is the suite every implementation passes.
"""

from __future__ import annotations

import abc
import contextlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import peewee

from agentik.core.db import Database
from agentik.core.events import SharedEvents
from agentik.core.jobs import Leader
from agentik.core.llm import HistoryItem
from agentik.core.turns import TurnRecord, TurnState, TurnStateError, TurnUpdate, answered
from agentik.core.types import ConversationInfo, Message


def ts(dt: datetime) -> str:
    return dt.isoformat()


def dt(raw: str) -> datetime:
    return datetime.fromisoformat(raw)


@dataclass(frozen=True, slots=True)
class MemoryRow:
    """A working-memory entry with its position and the turn that wrote it."""

    order_idx: int
    turn_id: str | None
    item: HistoryItem


_ITEM_FIELDS = ("text", "call_id", "tool_name", "args_json", "extra")


def item_json(item: HistoryItem) -> str:
    # by hand: dataclasses.asdict deep-copies and was 19% of an in-process turn (B3)
    data = {}
    for name in _ITEM_FIELDS:
        value = getattr(item, name)
        if value not in (None, "", {}):
            data[name] = value
    return json.dumps(data, ensure_ascii=False)


def item_from(role: str, raw: str) -> HistoryItem:
    return HistoryItem(role=role, **json.loads(raw))


class LeaseLost(Exception):
    """A fenced write of a conversation whose lease another instance took over (its epoch is
    not the lease's any more): nothing of the write was stored, and this instance must stop
    running that conversation's turns."""


@dataclass(frozen=True, slots=True)
class Lease:
    """An instance's ownership of a conversation, under an epoch (a fencing token: it grows
    each time another instance takes the conversation over)."""

    conversation_id: str
    owner: str
    epoch: int
    #: taken from another instance that never gave it up (it died, or hung past its
    #: heartbeat): what that owner left is settled as after a crash
    inherited: bool = False


class SharedStore(Protocol):
    """What a store that several instances share (PostgreSQL) gives them to coordinate:
    heartbeats, a lease per conversation, writes fenced by it, and notifications."""

    async def heartbeat(self, instance: str, ttl: float) -> bool: ...
    async def acquire(
        self, conversation_id: str, instance: str, *, by_lock: bool = True
    ) -> Lease | None: ...
    async def create_owned(self, info: ConversationInfo, instance: str) -> Lease: ...
    async def end_temporaries(self) -> list[str]: ...
    async def end_temporary(self, lease: Lease) -> bool: ...
    async def release(self, lease: Lease) -> None: ...
    def fenced(self, lease: Lease | None) -> contextlib.AbstractContextManager[None]: ...
    async def orphaned(self, instance: str) -> list[tuple[str, bool]]: ...
    async def others_alive(self, instance: str) -> int: ...
    async def held_elsewhere(self, conversation_id: str, instance: str) -> bool: ...
    async def notify(self, name: str, payload: str = "") -> None: ...
    async def listen(
        self,
        name: str,
        callback: Callable[[str], None],
        caught_up: Callable[[], None] | None = None,
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class TokenStats:
    turns: int
    input: int
    output: int
    #: turns whose backend could not count (not in input and output)
    uncounted: int = 0
    #: of one conversation: the last turn's context size (its input plus its growth), if known
    context: int | None = None

    def to_json(self) -> dict[str, int]:
        """The totals as the HTTP API shows them (``contextTokens`` is the caller's)."""
        return {
            "turns": self.turns,
            "input": self.input,
            "output": self.output,
            "total": self.input + self.output,
        }


@dataclass(frozen=True, slots=True)
class FeatureUsage:
    """The token counts of one background feature's model calls, summed."""

    calls: int
    input: int
    output: int
    #: calls whose counts were estimated (the server sent none)
    estimated: int = 0

    def to_json(self) -> dict[str, int]:
        return {
            "calls": self.calls,
            "input": self.input,
            "output": self.output,
            "total": self.input + self.output,
            "estimatedCalls": self.estimated,
        }


class Store(abc.ABC):
    """Conversations, their audit log and their working memory."""

    async def open(self) -> None:  # noqa: B027 - optional
        """Create tables; called once before use."""

    def shared(self) -> SharedStore | None:
        """How instances sharing this store coordinate (PostgreSQL); None for a store one
        process has to itself (SQLite, memory)."""
        return None

    async def close(self) -> None:  # noqa: B027 - optional
        """Flush and close."""

    # conversations
    @abc.abstractmethod
    async def create_conversation(self, info: ConversationInfo) -> None: ...
    @abc.abstractmethod
    async def get_conversation(self, conversation_id: str) -> ConversationInfo | None: ...
    @abc.abstractmethod
    async def list_conversations(self, offset: int, limit: int) -> list[ConversationInfo]: ...
    @abc.abstractmethod
    async def count_conversations(self) -> int: ...
    @abc.abstractmethod
    async def update_conversation(
        self,
        conversation_id: str,
        *,
        updated_at: datetime,
        title: str | None = None,
        set_title: bool = False,
    ) -> None: ...
    @abc.abstractmethod
    async def delete_conversation(self, conversation_id: str) -> bool:
        """Delete a conversation with its messages and working memory (cascade)."""

    @abc.abstractmethod
    async def aliased_conversation(
        self, namespace: str, key: str, new: ConversationInfo
    ) -> tuple[ConversationInfo, bool]:
        """The conversation another protocol calls ``key`` in ``namespace``; when there is none,
        ``new`` is created under that name in the same transaction. Returns it and whether it
        was created. The alias goes with its conversation when that is deleted."""

    # audit log + working memory, written together so a turn is never half-recorded
    @abc.abstractmethod
    async def append(
        self,
        conversation_id: str,
        messages: Sequence[Message] = (),
        memory: Sequence[HistoryItem] = (),
        *,
        turn_id: str | None = None,
        touch: datetime | None = None,
        durable: bool = False,
        turn: TurnUpdate | None = None,
    ) -> None:
        """Append audit records and working-memory entries in one transaction.

        ``turn_id`` (the id of the user message that started the turn) is kept on both, so a
        turn's records can be found and its working memory rolled back. ``durable``: the
        write must survive a power loss once this returns (user messages, which a client is
        told are stored, go through :meth:`add_user_message`, which is always durable).
        ``turn``: the turn's record moves in the same transaction (a step is its rows and its
        state together); a move its stored state does not allow raises
        :class:`~agentik.core.turns.TurnStateError` and writes nothing.

        Turns call this and may be interrupted (cancelled) while they await it: a write that
        started must complete anyway. SQLite's writes never suspend; an implementation that
        awaits I/O shields its write (``asyncio.shield``)."""

    @abc.abstractmethod
    async def add_user_message(
        self, msg: Message, *, idempotency_key: str | None = None
    ) -> TurnRecord:
        """Durably append a user message with its ``queued`` turn and touch its conversation.
        With an ``idempotency_key`` this conversation already used, store nothing and return
        the turn stored with that key, as it stands (a client's retry)."""

    @abc.abstractmethod
    async def get_turn(self, turn_id: str) -> TurnRecord | None:
        """A turn as it stands, or None."""

    @abc.abstractmethod
    async def open_turns(self, conversation_id: str | None = None) -> list[TurnRecord]:
        """The turns not over (queued, running, waiting), oldest first; of one conversation
        or of all (at start-up: what a stop or a crash left)."""

    @abc.abstractmethod
    async def update_turn(self, conversation_id: str, turn_id: str, update: TurnUpdate) -> None:
        """Move a turn's record alone (an answer to a waiting turn, a restart's verdict); a
        move its stored state does not allow raises :class:`~agentik.core.turns.TurnStateError`."""

    @abc.abstractmethod
    async def list_messages(
        self,
        conversation_id: str,
        after: str | None,
        offset: int,
        limit: int,
        *,
        max_bytes: int | None = None,
    ) -> list[Message]:
        """A page of the audit log, oldest first; ``after`` is a message id (exclusive). With
        ``max_bytes`` the page ends before the message that would take the size of its
        payloads' JSON past it (the first message always comes): a page of big messages never
        takes more memory than that."""

    @abc.abstractmethod
    async def recent_turns(self, conversation_id: str, turns: int) -> list[Message]:
        """The audit records of the last ``turns`` turns (from their user messages on), oldest
        first: what reflection, memory review and skill mining quote to the model."""

    @abc.abstractmethod
    async def turn_end(self, turn_id: str) -> Message | None:
        """The record that ended a turn (its ``assistant`` or ``error`` record), or None while
        it runs or waits: how a transport that follows turns learns, after a restart, how one
        ended."""

    @abc.abstractmethod
    async def tool_call_turn(self, conversation_id: str, call_id: str) -> str | None:
        """The turn of the latest tool call the model made with ``call_id`` in this
        conversation, or None (how an answer to a call learns which turn it was for)."""

    @abc.abstractmethod
    async def list_memory(self, conversation_id: str) -> list[MemoryRow]: ...
    @abc.abstractmethod
    async def clear_memory(self, conversation_id: str) -> None: ...
    @abc.abstractmethod
    async def fail_turn(
        self,
        conversation_id: str,
        turn_id: str,
        error: Message,
        state: TurnState = TurnState.FAILED,
    ) -> None:
        """In one transaction: append the turn's Error record, drop the working-memory entries
        the turn wrote (F2: a failed turn leaves nothing in working memory) and end the turn
        (``failed``, or ``cancelled`` for one taken out of the queue)."""

    async def busy_conversations(self, conversation_ids: Sequence[str]) -> set[str]:
        """Which of these conversations have turns not over (queued, running, waiting)."""
        return {c for c in conversation_ids if await self.open_turns(c)}

    async def answer_wait(
        self,
        conversation_id: str,
        turn_id: str,
        call_id: str,
        answer: Any,
        records: Sequence[Message] = (),
    ) -> TurnRecord:
        """Answer one wait of a waiting turn, in one transaction with ``records`` (the answer's
        audit records): the turn as it stands then is read, the answer added to its waits and
        it moves (``running`` once every wait is answered). Raises
        :class:`~agentik.core.turns.TurnStateError` when it does not wait for that answer. Two
        answers to one step through two instances both count."""
        turn = await self.get_turn(turn_id)
        if turn is None:
            raise TurnStateError(f"no turn {turn_id}")
        done = answered(turn, call_id, answer)
        update = TurnUpdate(done.state, done.step, done.waits)
        await self.append(conversation_id, records, turn_id=turn_id, turn=update)
        return done

    async def cancel_queued_turn(self, conversation_id: str, turn_id: str, error: Message) -> bool:
        """:meth:`fail_turn` as ``cancelled``, only while the turn is still queued (another
        instance may be starting it); False, and nothing written, when it is not."""
        turn = await self.get_turn(turn_id)
        if turn is None or turn.state is not TurnState.QUEUED:
            return False
        await self.fail_turn(conversation_id, turn_id, error, TurnState.CANCELLED)
        return True

    @abc.abstractmethod
    async def compact_memory(
        self,
        conversation_id: str,
        drop_before_idx: int,
        summary: HistoryItem,
        record: Message | None = None,
    ) -> None:
        """Atomically replace entries before ``drop_before_idx`` by one summary entry and
        append ``record`` (the ``summary`` audit record) in the same transaction: a crash
        leaves the old working memory or the new one, never a mix."""

    @abc.abstractmethod
    async def count_turns(self, conversation_id: str) -> int:
        """How many user messages the conversation has (turns started, failed ones too)."""

    async def add_models(self, models: list[type[peewee.Model]]) -> Database | None:
        """Bind a plugin's peewee models to this store's database and create their tables
        (if missing); the plugin then queries them inside ``db.read``/``db.write``. Call it
        from a service (``register_services``: the database is open by then). peewee binds a
        model class to one database: a plugin that may serve several agents in one process
        (tests) binds a subclass per agent (:func:`agentik.core.models.for_agent`). None for
        a store without a database (the in-memory one): the plugin keeps nothing."""
        return None

    @abc.abstractmethod
    async def token_stats(self, conversation_id: str | None = None) -> TokenStats: ...

    async def add_background_usage(  # noqa: B027 - optional, with a no-op default
        self,
        feature: str,
        conversation_id: str | None,
        input_tokens: int,
        output_tokens: int,
        estimated: bool,
    ) -> None:
        """Record the counts of one model call the agent made for itself (``feature``: e.g.
        ``memory_review``); a store that keeps none ignores them."""

    async def background_usage(self) -> dict[str, FeatureUsage]:
        """The background calls' counts per feature (:meth:`add_background_usage`)."""
        return {}

    def shared_events(self, instance_id: str) -> SharedEvents | None:
        """How the agent's instances on this store's database share their events (many
        instances on one PostgreSQL database), ``instance_id`` being this one; None: one
        instance, its events stay in its process."""
        return None

    @abc.abstractmethod
    async def read_state(self, key: str) -> str | None:
        """A small fact about the agent, or None."""

    @abc.abstractmethod
    async def write_state(self, key: str, value: str | None) -> None:
        """Set (or with None, delete) a small fact about the agent."""

    def leader(self) -> Leader | None:
        """What decides which instance runs each periodic job (:class:`~agentik.core.jobs.
        JobRunner`) when several share this store (PostgreSQL); None: this process is the
        only one, every job runs here."""
        return None


def turn_context(assistant_payload: dict[str, Any]) -> int | None:
    """A turn's context size at its end: its input plus its growth (None if not counted)."""
    tokens = assistant_payload.get("tokens") or {}
    if tokens.get("input") is None:
        return None
    return int(tokens["input"]) + int(tokens.get("output") or 0)
