"""Where conversations live: an interface, its SQLite implementation and an in-memory one.

The agent only talks to :class:`Store`, so another database (PostgreSQL through peewee) can
replace SQLite without touching the turn engine. Temporary conversations use
:class:`MemoryStore` and are never written to disk.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import peewee

from agentik.core import models
from agentik.core.db import Database
from agentik.core.llm import HistoryItem
from agentik.core.types import ConversationInfo, Message, MessageKind, UnknownReference


def utcnow() -> datetime:
    return datetime.now(UTC)


def _ts(dt: datetime) -> str:
    return dt.isoformat()


def _dt(raw: str) -> datetime:
    return datetime.fromisoformat(raw)


@dataclass(frozen=True, slots=True)
class MemoryRow:
    """A working-memory entry with its position and the turn that wrote it."""

    order_idx: int
    turn_id: str | None
    item: HistoryItem


_ITEM_FIELDS = ("text", "call_id", "tool_name", "args_json", "extra")


def _item_json(item: HistoryItem) -> str:
    # by hand: dataclasses.asdict deep-copies and was 19% of an in-process turn (B3)
    data = {}
    for name in _ITEM_FIELDS:
        value = getattr(item, name)
        if value not in (None, "", {}):
            data[name] = value
    return json.dumps(data, ensure_ascii=False)


def _item_from(role: str, raw: str) -> HistoryItem:
    return HistoryItem(role=role, **json.loads(raw))


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
    ) -> None:
        """Append audit records and working-memory entries in one transaction.

        ``turn_id`` (the id of the user message that started the turn) is kept on both, so a
        turn's records can be found and its working memory rolled back. ``durable``: the
        write must survive a power loss once this returns (user messages, which a client is
        told are stored, go through :meth:`add_user_message`, which is always durable).

        Turns call this and may be interrupted (cancelled) while they await it: a write that
        started must complete anyway. SQLite's writes never suspend; an implementation that
        awaits I/O shields its write (``asyncio.shield``)."""

    @abc.abstractmethod
    async def add_user_message(
        self, msg: Message, *, idempotency_key: str | None = None
    ) -> Message:
        """Durably append a user message (the start of its own turn) and touch its
        conversation. With an ``idempotency_key`` this conversation already used, store nothing
        and return the message stored with that key (a client's retry)."""

    @abc.abstractmethod
    async def list_messages(
        self, conversation_id: str, after: str | None, offset: int, limit: int
    ) -> list[Message]:
        """A page of the audit log, oldest first; ``after`` is a message id (exclusive)."""

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
    async def list_memory(self, conversation_id: str) -> list[MemoryRow]: ...
    @abc.abstractmethod
    async def clear_memory(self, conversation_id: str) -> None: ...
    @abc.abstractmethod
    async def fail_turn(self, conversation_id: str, turn_id: str, error: Message) -> None:
        """In one transaction: append the turn's Error record and drop the working-memory
        entries the turn wrote (F2: a failed turn leaves nothing in working memory)."""

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
    async def dangling_turns(self) -> list[Message]:
        """The user messages of turns with no Assistant or Error record, oldest first: the one
        a crash cut off and those queued behind it."""

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

    @abc.abstractmethod
    async def read_state(self, key: str) -> str | None:
        """A small fact about the agent (``clean_stop``), or None."""

    @abc.abstractmethod
    async def write_state(self, key: str, value: str | None) -> None:
        """Set (or with None, delete) a small fact about the agent."""


# --- SQLite -------------------------------------------------------------------------------

_INSERT_MESSAGE = (
    "INSERT INTO message (id, conversation_id, kind, turn_id, created_at, payload_json) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
_INSERT_MEMORY = (
    "INSERT INTO working_memory (conversation_id, order_idx, turn_id, role, payload_json, "
    "created_at) VALUES (?, ?, ?, ?, ?, ?)"
)


class SqliteStore(Store):
    def __init__(self, db: Database) -> None:
        self.db = db
        # this store's own class of the table: peewee binds a class to one database
        (usage,) = models.for_agent(models.BackgroundUsage)
        self._usage = cast(type[models.BackgroundUsage], usage)

    async def open(self) -> None:
        await self.db.open(models.MODELS)
        self.db.db.bind([self._usage])
        await self.db.write(lambda: self.db.execute(models.APPEND_ONLY_TRIGGER))

    async def close(self) -> None:
        await self.db.close()

    @staticmethod
    def _info(row: Sequence[Any]) -> ConversationInfo:
        return ConversationInfo(row[0], row[1], False, _dt(row[2]), _dt(row[3]))

    async def create_conversation(self, info: ConversationInfo) -> None:
        await self.db.write(
            lambda: self.db.execute(
                "INSERT INTO conversation (id, title, created_at, updated_at) VALUES (?, ?, ?, ?)",
                (info.id, info.title, _ts(info.created_at), _ts(info.updated_at)),
            )
        )

    async def aliased_conversation(
        self, namespace: str, key: str, new: ConversationInfo
    ) -> tuple[ConversationInfo, bool]:
        def q() -> tuple[ConversationInfo, bool]:
            row = self.db.execute(
                "SELECT c.id, c.title, c.created_at, c.updated_at FROM conversation_alias a "
                "JOIN conversation c ON c.id = a.conversation_id "
                "WHERE a.namespace = ? AND a.key = ?",
                (namespace, key),
            ).fetchone()
            if row is not None:
                return self._info(row), False
            self.db.execute(
                "INSERT INTO conversation (id, title, created_at, updated_at) VALUES (?, ?, ?, ?)",
                (new.id, new.title, _ts(new.created_at), _ts(new.updated_at)),
            )
            self.db.execute(
                "INSERT INTO conversation_alias (namespace, key, conversation_id) VALUES (?, ?, ?)",
                (namespace, key, new.id),
            )
            return new, True

        # one transaction, run without yielding to the loop: two first runs of one thread
        # cannot both create it
        return await self.db.write(q)

    async def get_conversation(self, conversation_id: str) -> ConversationInfo | None:
        def q() -> ConversationInfo | None:
            row = self.db.execute(
                "SELECT id, title, created_at, updated_at FROM conversation WHERE id = ?",
                (conversation_id,),
            ).fetchone()
            return self._info(row) if row else None

        return await self.db.read(q)

    async def list_conversations(self, offset: int, limit: int) -> list[ConversationInfo]:
        def q() -> list[ConversationInfo]:
            rows = self.db.execute(
                "SELECT id, title, created_at, updated_at FROM conversation "
                "ORDER BY updated_at DESC, id LIMIT ? OFFSET ?",
                (limit, offset),
            ).fetchall()
            return [self._info(r) for r in rows]

        return await self.db.read(q)

    async def count_conversations(self) -> int:
        return cast(
            int,
            await self.db.read(
                lambda: self.db.execute("SELECT count(*) FROM conversation").fetchone()[0]
            ),
        )

    async def update_conversation(
        self,
        conversation_id: str,
        *,
        updated_at: datetime,
        title: str | None = None,
        set_title: bool = False,
    ) -> None:
        if set_title:
            sql = "UPDATE conversation SET updated_at = ?, title = ? WHERE id = ?"
            params: tuple[Any, ...] = (_ts(updated_at), title, conversation_id)
        else:
            sql = "UPDATE conversation SET updated_at = ? WHERE id = ?"
            params = (_ts(updated_at), conversation_id)
        await self.db.write(lambda: self.db.execute(sql, params))

    async def delete_conversation(self, conversation_id: str) -> bool:
        def q() -> bool:
            cur = self.db.execute("DELETE FROM conversation WHERE id = ?", (conversation_id,))
            return bool(cur.rowcount)

        return await self.db.write(q)

    async def append(
        self,
        conversation_id: str,
        messages: Sequence[Message] = (),
        memory: Sequence[HistoryItem] = (),
        *,
        turn_id: str | None = None,
        touch: datetime | None = None,
        durable: bool = False,
    ) -> None:
        def q() -> None:
            for m in messages:
                self.db.execute(
                    _INSERT_MESSAGE,
                    (
                        m.id,
                        conversation_id,
                        m.kind,
                        turn_id,
                        _ts(m.created_at),
                        json.dumps(m.payload, ensure_ascii=False),
                    ),
                )
            if memory:
                row = self.db.execute(
                    "SELECT coalesce(max(order_idx), -1) FROM working_memory "
                    "WHERE conversation_id = ?",
                    (conversation_id,),
                ).fetchone()
                now = _ts(utcnow())
                for i, item in enumerate(memory, start=row[0] + 1):
                    self.db.execute(
                        _INSERT_MEMORY,
                        (
                            conversation_id,
                            i,
                            turn_id,
                            item.role,
                            _item_json(item),
                            now,
                        ),
                    )
            if touch is not None:
                self.db.execute(
                    "UPDATE conversation SET updated_at = ? WHERE id = ?",
                    (_ts(touch), conversation_id),
                )

        await self.db.write(q, durable=durable)

    async def add_user_message(
        self, msg: Message, *, idempotency_key: str | None = None
    ) -> Message:
        cid = msg.conversation_id

        def q() -> Message:
            if idempotency_key is not None:
                row = self.db.execute(
                    "SELECT m.id, m.kind, m.created_at, m.payload_json FROM idempotency_key k "
                    "JOIN message m ON m.id = k.message_id "
                    "WHERE k.conversation_id = ? AND k.key = ?",
                    (cid, idempotency_key),
                ).fetchone()
                if row is not None:
                    return Message(
                        row[0], cid, cast(MessageKind, row[1]), _dt(row[2]), json.loads(row[3])
                    )
                self.db.execute(
                    "INSERT INTO idempotency_key (conversation_id, key, message_id) "
                    "VALUES (?, ?, ?)",
                    (cid, idempotency_key, msg.id),
                )
            self.db.execute(
                _INSERT_MESSAGE,
                (
                    msg.id,
                    cid,
                    msg.kind,
                    msg.id,
                    _ts(msg.created_at),
                    json.dumps(msg.payload, ensure_ascii=False),
                ),
            )
            self.db.execute(
                "UPDATE conversation SET updated_at = ? WHERE id = ?", (_ts(msg.created_at), cid)
            )
            return msg

        # durable also for a replay: the first send may still be waiting for its fsync
        return await self.db.write(q, durable=True)

    async def list_messages(
        self, conversation_id: str, after: str | None, offset: int, limit: int
    ) -> list[Message]:
        def q() -> list[Message]:
            after_seq = 0
            if after is not None:
                row = self.db.execute(
                    "SELECT seq FROM message WHERE id = ? AND conversation_id = ?",
                    (after, conversation_id),
                ).fetchone()
                if row is None:
                    raise UnknownReference(f"after: no message {after!r} in this conversation")
                after_seq = row[0]
            rows = self.db.execute(
                "SELECT id, kind, created_at, payload_json FROM message "
                "WHERE conversation_id = ? AND seq > ? ORDER BY seq LIMIT ? OFFSET ?",
                (conversation_id, after_seq, limit, offset),
            ).fetchall()
            return [
                Message(r[0], conversation_id, cast(MessageKind, r[1]), _dt(r[2]), json.loads(r[3]))
                for r in rows
            ]

        return await self.db.read(q)

    async def recent_turns(self, conversation_id: str, turns: int) -> list[Message]:
        def q() -> list[Message]:
            rows = self.db.execute(
                "SELECT id, kind, created_at, payload_json FROM message "
                "WHERE conversation_id = ? AND seq >= coalesce((SELECT seq FROM message "
                "WHERE conversation_id = ? AND kind = 'user' "
                "ORDER BY seq DESC LIMIT 1 OFFSET ?), 0) "
                "ORDER BY seq",
                (conversation_id, conversation_id, max(turns, 1) - 1),
            ).fetchall()
            return [
                Message(r[0], conversation_id, cast(MessageKind, r[1]), _dt(r[2]), json.loads(r[3]))
                for r in rows
            ]

        return await self.db.read(q)

    async def turn_end(self, turn_id: str) -> Message | None:
        def q() -> Message | None:
            row = self.db.execute(
                "SELECT id, conversation_id, kind, created_at, payload_json FROM message "
                "WHERE turn_id = ? AND kind IN ('assistant', 'error') ORDER BY seq LIMIT 1",
                (turn_id,),
            ).fetchone()
            if row is None:
                return None
            return Message(row[0], row[1], row[2], _dt(row[3]), json.loads(row[4]))

        return await self.db.read(q)

    async def list_memory(self, conversation_id: str) -> list[MemoryRow]:
        def q() -> list[MemoryRow]:
            rows = self.db.execute(
                "SELECT order_idx, turn_id, role, payload_json FROM working_memory "
                "WHERE conversation_id = ? ORDER BY order_idx",
                (conversation_id,),
            ).fetchall()
            return [MemoryRow(r[0], r[1], _item_from(r[2], r[3])) for r in rows]

        return await self.db.read(q)

    async def clear_memory(self, conversation_id: str) -> None:
        await self.db.write(
            lambda: self.db.execute(
                "DELETE FROM working_memory WHERE conversation_id = ?", (conversation_id,)
            )
        )

    async def fail_turn(self, conversation_id: str, turn_id: str, error: Message) -> None:
        def q() -> None:
            self.db.execute(
                _INSERT_MESSAGE,
                (
                    error.id,
                    conversation_id,
                    error.kind,
                    turn_id,
                    _ts(error.created_at),
                    json.dumps(error.payload, ensure_ascii=False),
                ),
            )
            self.db.execute(
                "DELETE FROM working_memory WHERE conversation_id = ? AND turn_id = ?",
                (conversation_id, turn_id),
            )

        await self.db.write(q)

    async def compact_memory(
        self,
        conversation_id: str,
        drop_before_idx: int,
        summary: HistoryItem,
        record: Message | None = None,
    ) -> None:
        def q() -> None:
            self.db.execute(
                "DELETE FROM working_memory WHERE conversation_id = ? AND order_idx < ?",
                (conversation_id, drop_before_idx),
            )
            # the summary takes the slot just before the kept entries, so order is preserved
            self.db.execute(
                _INSERT_MEMORY,
                (
                    conversation_id,
                    drop_before_idx - 1,
                    None,
                    summary.role,
                    _item_json(summary),
                    _ts(utcnow()),
                ),
            )
            if record is not None:
                self.db.execute(
                    _INSERT_MESSAGE,
                    (
                        record.id,
                        conversation_id,
                        record.kind,
                        None,
                        _ts(record.created_at),
                        json.dumps(record.payload, ensure_ascii=False),
                    ),
                )

        await self.db.write(q)

    async def count_turns(self, conversation_id: str) -> int:
        return cast(
            int,
            await self.db.read(
                lambda: self.db.execute(
                    "SELECT count(*) FROM message WHERE conversation_id = ? AND kind = 'user'",
                    (conversation_id,),
                ).fetchone()[0]
            ),
        )

    async def add_models(self, models: list[type[peewee.Model]]) -> Database | None:
        self.db.db.bind(models)
        self.db.db.create_tables(models, safe=True)  # as Database.open does for the core's
        return self.db

    async def dangling_turns(self) -> list[Message]:
        def q() -> list[Message]:
            rows = self.db.execute(
                "SELECT u.id, u.conversation_id, u.created_at, u.payload_json FROM message u "
                "WHERE u.kind = 'user' AND NOT EXISTS (SELECT 1 FROM message t "
                "WHERE t.turn_id = u.id AND t.kind IN ('assistant', 'error')) ORDER BY u.seq"
            ).fetchall()
            return [Message(r[0], r[1], "user", _dt(r[2]), json.loads(r[3])) for r in rows]

        return await self.db.read(q)

    async def token_stats(self, conversation_id: str | None = None) -> TokenStats:
        def q() -> TokenStats:
            sql = (
                "SELECT count(*), coalesce(sum(json_extract(payload_json, '$.tokens.input')), 0),"
                " coalesce(sum(json_extract(payload_json, '$.tokens.output')), 0),"
                " count(*) - count(json_extract(payload_json, '$.tokens.input')) "
                "FROM message WHERE kind = 'assistant'"
            )
            params: tuple[Any, ...] = ()
            if conversation_id is not None:
                sql += " AND conversation_id = ?"
                params = (conversation_id,)
            turns, tin, tout, uncounted = self.db.execute(sql, params).fetchone()
            if conversation_id is None:
                return TokenStats(turns, tin, tout, uncounted)
            last = self.db.execute(
                "SELECT payload_json FROM message WHERE conversation_id = ? "
                "AND kind = 'assistant' ORDER BY seq DESC LIMIT 1",
                (conversation_id,),
            ).fetchone()
            context = _context(json.loads(last[0])) if last else None
            return TokenStats(turns, tin, tout, uncounted, context)

        return await self.db.read(q)

    async def add_background_usage(
        self,
        feature: str,
        conversation_id: str | None,
        input_tokens: int,
        output_tokens: int,
        estimated: bool,
    ) -> None:
        query = self._usage.insert(
            feature=feature,
            conversation_id=conversation_id,
            created_at=_ts(utcnow()),
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            estimated=estimated,
        )
        await self.db.write(query.execute)

    async def background_usage(self) -> dict[str, FeatureUsage]:
        u = self._usage
        query = u.select(
            u.feature,
            peewee.fn.COUNT(u.id),
            peewee.fn.SUM(u.input_tokens),
            peewee.fn.SUM(u.output_tokens),
            peewee.fn.SUM(peewee.Case(None, [(u.estimated, 1)], 0)),
        ).group_by(u.feature)

        def q() -> dict[str, FeatureUsage]:
            rows = cast(list[tuple[str, int, int | None, int | None, int | None]], query.tuples())
            return {
                feature: FeatureUsage(calls, tin or 0, tout or 0, est or 0)
                for feature, calls, tin, tout, est in rows
            }

        return await self.db.read(q)

    async def read_state(self, key: str) -> str | None:
        def q() -> str | None:
            row = self.db.execute("SELECT value FROM agent_state WHERE key = ?", (key,)).fetchone()
            return None if row is None else str(row[0])

        return await self.db.read(q)

    async def write_state(self, key: str, value: str | None) -> None:
        def q() -> None:
            self.db.execute("DELETE FROM agent_state WHERE key = ?", (key,))
            if value is not None:
                self.db.execute("INSERT INTO agent_state (key, value) VALUES (?, ?)", (key, value))

        await self.db.write(q)


# --- in memory (temporary conversations) --------------------------------------------------


class MemoryStore(Store):
    """Keeps everything in dicts; used for temporary conversations."""

    def __init__(self) -> None:
        self._convs: dict[str, ConversationInfo] = {}
        self._messages: dict[str, list[Message]] = {}
        self._memory: dict[str, list[MemoryRow]] = {}
        self._keys: dict[tuple[str, str], Message] = {}
        self._state: dict[str, str] = {}
        self._aliases: dict[tuple[str, str], str] = {}
        self._ends: dict[str, Message] = {}  # turn id -> the record that ended it
        self._usage: dict[str, FeatureUsage] = {}

    async def create_conversation(self, info: ConversationInfo) -> None:
        self._convs[info.id] = info
        self._messages[info.id] = []
        self._memory[info.id] = []

    async def aliased_conversation(
        self, namespace: str, key: str, new: ConversationInfo
    ) -> tuple[ConversationInfo, bool]:
        known = self._convs.get(self._aliases.get((namespace, key), ""))
        if known is not None:
            return known, False
        await self.create_conversation(new)
        self._aliases[namespace, key] = new.id
        return new, True

    async def get_conversation(self, conversation_id: str) -> ConversationInfo | None:
        return self._convs.get(conversation_id)

    async def list_conversations(self, offset: int, limit: int) -> list[ConversationInfo]:
        ordered = sorted(self._convs.values(), key=lambda c: c.updated_at, reverse=True)
        return ordered[offset : offset + limit]

    async def count_conversations(self) -> int:
        return len(self._convs)

    async def update_conversation(
        self,
        conversation_id: str,
        *,
        updated_at: datetime,
        title: str | None = None,
        set_title: bool = False,
    ) -> None:
        old = self._convs[conversation_id]
        self._convs[conversation_id] = ConversationInfo(
            old.id, title if set_title else old.title, old.is_temporal, old.created_at, updated_at
        )

    async def delete_conversation(self, conversation_id: str) -> bool:
        self._keys = {k: m for k, m in self._keys.items() if k[0] != conversation_id}
        self._aliases = {k: c for k, c in self._aliases.items() if c != conversation_id}
        self._messages.pop(conversation_id, None)
        self._memory.pop(conversation_id, None)
        return self._convs.pop(conversation_id, None) is not None

    async def append(
        self,
        conversation_id: str,
        messages: Sequence[Message] = (),
        memory: Sequence[HistoryItem] = (),
        *,
        turn_id: str | None = None,
        touch: datetime | None = None,
        durable: bool = False,
    ) -> None:
        self._messages[conversation_id].extend(messages)
        if turn_id is not None:
            for m in messages:
                if m.kind in ("assistant", "error"):
                    self._ends.setdefault(turn_id, m)
        rows = self._memory[conversation_id]
        start = rows[-1].order_idx + 1 if rows else 0
        rows.extend(MemoryRow(i, turn_id, item) for i, item in enumerate(memory, start=start))
        if touch is not None:
            await self.update_conversation(conversation_id, updated_at=touch)

    async def add_user_message(
        self, msg: Message, *, idempotency_key: str | None = None
    ) -> Message:
        cid = msg.conversation_id
        if idempotency_key is not None:
            stored = self._keys.setdefault((cid, idempotency_key), msg)
            if stored is not msg:
                return stored
        await self.append(cid, [msg], turn_id=msg.id, touch=msg.created_at)
        return msg

    async def list_messages(
        self, conversation_id: str, after: str | None, offset: int, limit: int
    ) -> list[Message]:
        msgs = self._messages.get(conversation_id, [])
        if after is not None:
            ids = [m.id for m in msgs]
            if after not in ids:
                raise UnknownReference(f"after: no message {after!r} in this conversation")
            msgs = msgs[ids.index(after) + 1 :]
        return msgs[offset : offset + limit]

    async def recent_turns(self, conversation_id: str, turns: int) -> list[Message]:
        msgs = self._messages.get(conversation_id, [])
        starts = [i for i, m in enumerate(msgs) if m.kind == "user"]
        first = starts[-max(turns, 1)] if len(starts) >= max(turns, 1) else 0
        return msgs[first:]

    async def turn_end(self, turn_id: str) -> Message | None:
        return self._ends.get(turn_id)

    async def list_memory(self, conversation_id: str) -> list[MemoryRow]:
        return list(self._memory.get(conversation_id, []))

    async def clear_memory(self, conversation_id: str) -> None:
        self._memory[conversation_id] = []

    async def fail_turn(self, conversation_id: str, turn_id: str, error: Message) -> None:
        self._messages[conversation_id].append(error)
        self._ends.setdefault(turn_id, error)
        self._memory[conversation_id] = [
            r for r in self._memory[conversation_id] if r.turn_id != turn_id
        ]

    async def compact_memory(
        self,
        conversation_id: str,
        drop_before_idx: int,
        summary: HistoryItem,
        record: Message | None = None,
    ) -> None:
        kept = [r for r in self._memory[conversation_id] if r.order_idx >= drop_before_idx]
        self._memory[conversation_id] = [MemoryRow(drop_before_idx - 1, None, summary), *kept]
        if record is not None:
            self._messages[conversation_id].append(record)

    async def count_turns(self, conversation_id: str) -> int:
        return sum(m.kind == "user" for m in self._messages.get(conversation_id, []))

    async def dangling_turns(self) -> list[Message]:
        return []

    async def token_stats(self, conversation_id: str | None = None) -> TokenStats:
        turns = tin = tout = uncounted = 0
        context = None
        for cid, msgs in self._messages.items():
            if conversation_id is not None and cid != conversation_id:
                continue
            for m in msgs:
                if m.kind == "assistant":
                    turns += 1
                    tokens = m.payload.get("tokens") or {}
                    tin += tokens.get("input") or 0
                    tout += tokens.get("output") or 0
                    uncounted += tokens.get("input") is None
                    context = _context(m.payload)
        if conversation_id is None:
            context = None
        return TokenStats(turns, tin, tout, uncounted, context)

    async def add_background_usage(
        self,
        feature: str,
        conversation_id: str | None,
        input_tokens: int,
        output_tokens: int,
        estimated: bool,
    ) -> None:
        was = self._usage.get(feature, FeatureUsage(0, 0, 0))
        self._usage[feature] = FeatureUsage(
            was.calls + 1,
            was.input + input_tokens,
            was.output + output_tokens,
            was.estimated + estimated,
        )

    async def background_usage(self) -> dict[str, FeatureUsage]:
        return dict(self._usage)

    async def read_state(self, key: str) -> str | None:
        return self._state.get(key)

    async def write_state(self, key: str, value: str | None) -> None:
        if value is None:
            self._state.pop(key, None)
        else:
            self._state[key] = value


def _context(assistant_payload: dict[str, Any]) -> int | None:
    """A turn's context size at its end: its input plus its growth (None if not counted)."""
    tokens = assistant_payload.get("tokens") or {}
    if tokens.get("input") is None:
        return None
    return int(tokens["input"]) + int(tokens.get("output") or 0)
