"""What the SQL stores share: the statements every database of the core runs alike. A subclass
gives its database (``self.db``: ``read``/``write`` of a function that calls ``execute`` with
``?`` placeholders, and peewee queries) and its dialect's few statements (JSON fields)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol, TypeVar, cast

import peewee

from agentik.core import models
from agentik.core.llm import HistoryItem
from agentik.core.records import utcnow
from agentik.core.store.base import (
    FeatureUsage,
    MemoryRow,
    Store,
    TokenStats,
    dt,
    item_from,
    item_json,
    ts,
    turn_context,
)
from agentik.core.turns import (
    OPEN,
    TurnRecord,
    TurnState,
    TurnStateError,
    TurnUpdate,
    Wait,
    answered,
    sources,
    waits_from,
)
from agentik.core.types import ConversationInfo, Message, MessageKind, UnknownReference

T = TypeVar("T")

_INSERT_MESSAGE = (
    "INSERT INTO message (id, conversation_id, kind, turn_id, created_at, payload_json) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
_INSERT_MEMORY = (
    "INSERT INTO working_memory (conversation_id, order_idx, turn_id, role, payload_json, "
    "created_at) VALUES (?, ?, ?, ?, ?, ?)"
)

_TURN_COLUMNS = (
    "t.state, t.step, t.waits_json, t.updated_at, "
    "m.id, m.conversation_id, m.created_at, m.payload_json"
)
_SELECT_TURN = f"SELECT {_TURN_COLUMNS} FROM turn t JOIN message m ON m.id = t.id "
# a conversation (its id: the placeholder) that is not temporary, where the store keeps
# temporary conversations too (SqlStore.STORES_TEMPORARY)
_NOT_TEMPORARY = "NOT EXISTS (SELECT 1 FROM temporary_conversation t WHERE t.conversation_id = {})"
_INSERT_CONVERSATION = (
    "INSERT INTO conversation (id, title, created_at, updated_at) VALUES (?, ?, ?, ?)"
)
_OPEN = tuple(str(s) for s in OPEN)
_OPEN_SQL = ", ".join("?" * len(_OPEN))
_PAGE = (
    "SELECT id, kind, created_at, payload_json FROM message "
    "WHERE conversation_id = ? AND seq > ? ORDER BY seq LIMIT ? OFFSET ?"
)
# a turn's move, for each number of states it may come from (built once per shape)
_MOVE_TURN = {
    n: "UPDATE turn SET state = ?, step = ?, waits_json = ?, updated_at = ? "
    f"WHERE id = ? AND state IN ({', '.join('?' * n)})"
    for n in range(1, len(TurnState) + 1)
}


def _waits(waits: tuple[Wait, ...]) -> str | None:
    return json.dumps([w.to_json() for w in waits], ensure_ascii=False) if waits else None


def _turn(row: Sequence[Any]) -> TurnRecord:
    user = Message(row[4], row[5], "user", dt(row[6]), json.loads(row[7]))
    waits = waits_from(json.loads(row[2])) if row[2] else ()
    return TurnRecord(user, TurnState(row[0]), row[1], waits, dt(row[3]))


class SqlDatabase(Protocol):
    """What the SQL store runs on (:class:`agentik.core.db.Database`, the PostgreSQL one)."""

    @property
    def db(self) -> peewee.Database: ...
    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any: ...
    async def read(self, fn: Callable[[], T]) -> T: ...
    async def write(self, fn: Callable[[], T], *, durable: bool = False) -> T: ...
    async def close(self) -> None: ...


class SqlStore(Store):
    #: the dialect's statements (JSON fields): a subclass sets them
    TOKEN_TOTALS_SQL: str  # turns, input, output, uncounted of the assistant records
    CALL_TURN_SQL: str  # (conversation_id, call_id) -> the turn of the latest such tool call
    #: temporary conversations are kept here too, marked in ``temporary_conversation`` (many
    #: instances share the database: each must serve them), and left out of the lists, the
    #: counts and the agent's totals; else (SQLite) they never reach the database
    STORES_TEMPORARY = False

    db: SqlDatabase
    _usage: type[models.BackgroundUsage]

    async def close(self) -> None:
        await self.db.close()

    @staticmethod
    def _info(row: Sequence[Any]) -> ConversationInfo:
        temporary = len(row) > 4 and row[4] is not None
        return ConversationInfo(row[0], row[1], temporary, dt(row[2]), dt(row[3]))

    async def create_conversation(self, info: ConversationInfo) -> None:
        await self.db.write(lambda: self._insert_conversation(info))

    def _insert_conversation(self, info: ConversationInfo) -> None:
        """Inside a write: the conversation's row (and a temporary one's mark)."""
        row = (info.id, info.title, ts(info.created_at), ts(info.updated_at))
        self.db.execute(_INSERT_CONVERSATION, row)
        if info.is_temporal:
            if not self.STORES_TEMPORARY:
                raise ValueError("this store keeps no temporary conversation")
            self.db.execute(
                "INSERT INTO temporary_conversation (conversation_id) VALUES (?)", (info.id,)
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
            self._insert_conversation(new)
            self.db.execute(
                "INSERT INTO conversation_alias (namespace, key, conversation_id) VALUES (?, ?, ?)",
                (namespace, key, new.id),
            )
            return new, True

        # one transaction, run without yielding to the loop: two first runs of one thread
        # cannot both create it
        return await self.db.write(q)

    async def get_conversation(self, conversation_id: str) -> ConversationInfo | None:
        sql = "SELECT id, title, created_at, updated_at FROM conversation WHERE id = ?"
        if self.STORES_TEMPORARY:
            sql = (
                "SELECT c.id, c.title, c.created_at, c.updated_at, t.conversation_id "
                "FROM conversation c LEFT JOIN temporary_conversation t "
                "ON t.conversation_id = c.id WHERE c.id = ?"
            )

        def q() -> ConversationInfo | None:
            row = self.db.execute(sql, (conversation_id,)).fetchone()
            return self._info(row) if row else None

        return await self.db.read(q)

    async def list_conversations(self, offset: int, limit: int) -> list[ConversationInfo]:
        sql = (
            "SELECT id, title, created_at, updated_at FROM conversation "
            f"{self._listed()}ORDER BY updated_at DESC, id LIMIT ? OFFSET ?"
        )

        def q() -> list[ConversationInfo]:
            rows = self.db.execute(sql, (limit, offset)).fetchall()
            return [self._info(r) for r in rows]

        return await self.db.read(q)

    async def count_conversations(self) -> int:
        sql = f"SELECT count(*) FROM conversation {self._listed()}"
        return cast(int, await self.db.read(lambda: self.db.execute(sql).fetchone()[0]))

    def _listed(self) -> str:
        """The condition (a WHERE clause, or nothing) of the conversations that are listed and
        counted: not the temporary ones this store keeps."""
        if not self.STORES_TEMPORARY:
            return ""
        return f"WHERE {_NOT_TEMPORARY.format('conversation.id')} "

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
            params: tuple[Any, ...] = (ts(updated_at), title, conversation_id)
        else:
            sql = "UPDATE conversation SET updated_at = ? WHERE id = ?"
            params = (ts(updated_at), conversation_id)
        await self.db.write(lambda: self.db.execute(sql, params))

    async def delete_conversation(self, conversation_id: str) -> bool:
        return await self.db.write(lambda: self._delete(conversation_id))

    def _delete(self, conversation_id: str) -> bool:
        """Delete a conversation, in a write (its rows go with it: ON DELETE CASCADE)."""
        cur = self.db.execute("DELETE FROM conversation WHERE id = ?", (conversation_id,))
        return bool(cur.rowcount)

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
        def q() -> None:
            if turn is not None:  # first: a refused move writes nothing
                assert turn_id is not None
                self._move(turn_id, turn)
            for m in messages:
                self.db.execute(
                    _INSERT_MESSAGE,
                    (
                        m.id,
                        conversation_id,
                        m.kind,
                        turn_id,
                        ts(m.created_at),
                        json.dumps(m.payload, ensure_ascii=False),
                    ),
                )
            if memory:
                row = self.db.execute(
                    "SELECT coalesce(max(order_idx), -1) FROM working_memory "
                    "WHERE conversation_id = ?",
                    (conversation_id,),
                ).fetchone()
                now = ts(utcnow())
                for i, item in enumerate(memory, start=row[0] + 1):
                    self.db.execute(
                        _INSERT_MEMORY,
                        (
                            conversation_id,
                            i,
                            turn_id,
                            item.role,
                            item_json(item),
                            now,
                        ),
                    )
            if touch is not None:
                self.db.execute(
                    "UPDATE conversation SET updated_at = ? WHERE id = ?",
                    (ts(touch), conversation_id),
                )

        await self.db.write(q, durable=durable)

    async def add_user_message(
        self, msg: Message, *, idempotency_key: str | None = None
    ) -> TurnRecord:
        cid = msg.conversation_id

        def q() -> TurnRecord:
            self._serialize(cid)
            if idempotency_key is not None:
                row = self.db.execute(
                    _SELECT_TURN + "WHERE t.conversation_id = ? AND t.idempotency_key = ?",
                    (cid, idempotency_key),
                ).fetchone()
                if row is not None:
                    return _turn(row)
            created = ts(msg.created_at)
            self.db.execute(
                _INSERT_MESSAGE,
                (
                    msg.id,
                    cid,
                    msg.kind,
                    msg.id,
                    created,
                    json.dumps(msg.payload, ensure_ascii=False),
                ),
            )
            self.db.execute(
                "INSERT INTO turn (id, conversation_id, state, step, idempotency_key, created_at, "
                "updated_at) VALUES (?, ?, ?, 0, ?, ?, ?)",
                (msg.id, cid, TurnState.QUEUED, idempotency_key, created, created),
            )
            self.db.execute("UPDATE conversation SET updated_at = ? WHERE id = ?", (created, cid))
            return TurnRecord(msg, TurnState.QUEUED, updated_at=msg.created_at)

        # durable also for a replay: the first send may still be waiting for its fsync
        return await self.db.write(q, durable=True)

    def _serialize(self, conversation_id: str) -> None:
        """Inside a write: wait for the other sends and answers to this conversation to commit
        (a database several instances write to at once): its turns are stored in one order,
        two answers to one step both count. One writer at a time already (SQLite): nothing."""

    def _move(
        self, turn_id: str, update: TurnUpdate, allowed: tuple[TurnState, ...] | None = None
    ) -> None:
        """Move a turn's record, inside a write; refused (TurnStateError) unless its stored
        state allows the move (``allowed``: only from those states)."""
        allowed = sources(update.state) if allowed is None else allowed
        moved = 0
        if allowed:  # none (queued): refused; ``IN ()`` is not SQL everywhere
            moved = self.db.execute(
                _MOVE_TURN[len(allowed)],
                (
                    update.state,
                    update.step,
                    _waits(update.waits),
                    ts(utcnow()),
                    turn_id,
                    *allowed,
                ),
            ).rowcount
        if moved != 1:
            row = self.db.execute("SELECT state FROM turn WHERE id = ?", (turn_id,)).fetchone()
            raise TurnStateError(
                f"turn {turn_id} cannot go from {row[0] if row else 'nowhere'} to {update.state}"
            )

    def _turn_row(self, turn_id: str) -> TurnRecord:
        """A turn, inside a read or a write (it exists)."""
        return _turn(self.db.execute(_SELECT_TURN + "WHERE t.id = ?", (turn_id,)).fetchone())

    async def get_turn(self, turn_id: str) -> TurnRecord | None:
        def q() -> TurnRecord | None:
            row = self.db.execute(_SELECT_TURN + "WHERE t.id = ?", (turn_id,)).fetchone()
            return _turn(row) if row else None

        return await self.db.read(q)

    async def open_turns(self, conversation_id: str | None = None) -> list[TurnRecord]:
        def q() -> list[TurnRecord]:
            sql = _SELECT_TURN + f"WHERE t.state IN ({_OPEN_SQL}) "
            params: tuple[Any, ...] = _OPEN
            if conversation_id is not None:
                sql += "AND t.conversation_id = ? "
                params = (*params, conversation_id)
            return [_turn(r) for r in self.db.execute(sql + "ORDER BY t.seq", params)]

        return await self.db.read(q)

    async def update_turn(self, conversation_id: str, turn_id: str, update: TurnUpdate) -> None:
        await self.db.write(lambda: self._move(turn_id, update))

    async def list_messages(
        self,
        conversation_id: str,
        after: str | None,
        offset: int,
        limit: int,
        *,
        max_bytes: int | None = None,
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
            rows = self._page(conversation_id, after_seq, offset, limit, max_bytes)
            page: list[Message] = []
            size = 0
            for r in rows:  # read row by row: the rest of a cut page is never loaded
                size += len(r[3])
                if page and max_bytes is not None and size > max_bytes:
                    break
                kind = cast(MessageKind, r[1])
                page.append(Message(r[0], conversation_id, kind, dt(r[2]), json.loads(r[3])))
            return page

        return await self.db.read(q)

    def _page(
        self, conversation_id: str, after_seq: int, offset: int, limit: int, max_bytes: int | None
    ) -> Any:
        """The rows of a page (id, kind, created_at, payload_json), inside a read: a cursor
        read row by row here, so the rest of a page cut by ``max_bytes`` is never loaded."""
        return self.db.execute(_PAGE, (conversation_id, after_seq, limit, offset))

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
                Message(r[0], conversation_id, cast(MessageKind, r[1]), dt(r[2]), json.loads(r[3]))
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
            return Message(row[0], row[1], row[2], dt(row[3]), json.loads(row[4]))

        return await self.db.read(q)

    async def tool_call_turn(self, conversation_id: str, call_id: str) -> str | None:
        def q() -> str | None:
            row = self.db.execute(self.CALL_TURN_SQL, (conversation_id, call_id)).fetchone()
            return None if row is None else str(row[0])

        return await self.db.read(q)

    async def list_memory(self, conversation_id: str) -> list[MemoryRow]:
        def q() -> list[MemoryRow]:
            rows = self.db.execute(
                "SELECT order_idx, turn_id, role, payload_json FROM working_memory "
                "WHERE conversation_id = ? ORDER BY order_idx",
                (conversation_id,),
            ).fetchall()
            return [MemoryRow(r[0], r[1], item_from(r[2], r[3])) for r in rows]

        return await self.db.read(q)

    async def clear_memory(self, conversation_id: str) -> None:
        await self.db.write(
            lambda: self.db.execute(
                "DELETE FROM working_memory WHERE conversation_id = ?", (conversation_id,)
            )
        )

    async def fail_turn(
        self,
        conversation_id: str,
        turn_id: str,
        error: Message,
        state: TurnState = TurnState.FAILED,
    ) -> None:
        def q() -> None:
            self._move(turn_id, TurnUpdate(state, 0))
            self._insert_message(conversation_id, turn_id, error)
            self.db.execute(
                "DELETE FROM working_memory WHERE conversation_id = ? AND turn_id = ?",
                (conversation_id, turn_id),
            )

        await self.db.write(q)

    async def busy_conversations(self, conversation_ids: Sequence[str]) -> set[str]:
        if not conversation_ids:
            return set()
        sql = (
            f"SELECT DISTINCT conversation_id FROM turn WHERE state IN ({_OPEN_SQL}) "
            f"AND conversation_id IN ({', '.join('?' * len(conversation_ids))})"
        )
        params = (*_OPEN, *conversation_ids)
        return await self.db.read(lambda: {str(r[0]) for r in self.db.execute(sql, params)})

    async def answer_wait(
        self,
        conversation_id: str,
        turn_id: str,
        call_id: str,
        answer: Any,
        records: Sequence[Message] = (),
    ) -> TurnRecord:
        def q() -> TurnRecord:
            self._serialize(conversation_id)
            row = self.db.execute(_SELECT_TURN + "WHERE t.id = ?", (turn_id,)).fetchone()
            if row is None:
                raise TurnStateError(f"no turn {turn_id}")
            done = answered(_turn(row), call_id, answer)
            self._move(turn_id, TurnUpdate(done.state, done.step, done.waits))
            for m in records:
                self._insert_message(conversation_id, turn_id, m)
            return done

        return await self.db.write(q)

    async def cancel_queued_turn(self, conversation_id: str, turn_id: str, error: Message) -> bool:
        def q() -> bool:
            try:
                self._move(turn_id, TurnUpdate(TurnState.CANCELLED, 0), (TurnState.QUEUED,))
            except TurnStateError:
                return False
            self._insert_message(conversation_id, turn_id, error)
            return True

        return await self.db.write(q)

    def _insert_message(self, conversation_id: str, turn_id: str, error: Message) -> None:
        self.db.execute(
            _INSERT_MESSAGE,
            (
                error.id,
                conversation_id,
                error.kind,
                turn_id,
                ts(error.created_at),
                json.dumps(error.payload, ensure_ascii=False),
            ),
        )

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
                    item_json(summary),
                    ts(utcnow()),
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
                        ts(record.created_at),
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

    async def token_stats(self, conversation_id: str | None = None) -> TokenStats:
        def q() -> TokenStats:
            sql = self.TOKEN_TOTALS_SQL
            params: tuple[Any, ...] = ()
            if conversation_id is not None:
                sql += " AND conversation_id = ?"
                params = (conversation_id,)
            elif self.STORES_TEMPORARY:  # the agent's totals: not its temporary conversations
                sql += f" AND {_NOT_TEMPORARY.format('message.conversation_id')}"
            turns, tin, tout, uncounted = self.db.execute(sql, params).fetchone()
            if conversation_id is None:
                return TokenStats(turns, tin, tout, uncounted)
            last = self.db.execute(
                "SELECT payload_json FROM message WHERE conversation_id = ? "
                "AND kind = 'assistant' ORDER BY seq DESC LIMIT 1",
                (conversation_id,),
            ).fetchone()
            context = turn_context(json.loads(last[0])) if last else None
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
            created_at=ts(utcnow()),
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
            # literals, not parameters: PostgreSQL types a parameter of a CASE as text
            peewee.fn.SUM(peewee.Case(None, [(u.estimated, peewee.SQL("1"))], peewee.SQL("0"))),
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
