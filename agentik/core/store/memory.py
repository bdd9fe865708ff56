"""An in-memory store: temporary conversations (never written to disk) and tests."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from agentik.core.llm import HistoryItem
from agentik.core.records import utcnow
from agentik.core.store.base import FeatureUsage, MemoryRow, Store, TokenStats, turn_context
from agentik.core.turns import TurnRecord, TurnState, TurnStateError, TurnUpdate, check_move
from agentik.core.types import ConversationInfo, Message, UnknownReference


class MemoryStore(Store):
    """Keeps everything in dicts; used for temporary conversations."""

    def __init__(self) -> None:
        self._convs: dict[str, ConversationInfo] = {}
        self._messages: dict[str, list[Message]] = {}
        self._memory: dict[str, list[MemoryRow]] = {}
        self._keys: dict[tuple[str, str], str] = {}  # (conversation, key) -> turn id
        self._turns: dict[str, TurnRecord] = {}  # in the order they were queued
        self._state: dict[str, str] = {}
        self._aliases: dict[tuple[str, str], str] = {}
        self._ends: dict[str, Message] = {}  # turn id -> the record that ended it
        self._call_turns: dict[tuple[str, str], str] = {}  # (conversation, call id) -> turn id
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
        self._keys = {k: t for k, t in self._keys.items() if k[0] != conversation_id}
        self._turns = {t: r for t, r in self._turns.items() if r.conversation_id != conversation_id}
        self._aliases = {k: c for k, c in self._aliases.items() if c != conversation_id}
        self._call_turns = {k: t for k, t in self._call_turns.items() if k[0] != conversation_id}
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
        turn: TurnUpdate | None = None,
    ) -> None:
        if turn is not None:
            assert turn_id is not None
            self._move(turn_id, turn)
        self._messages[conversation_id].extend(messages)
        if turn_id is not None:
            for m in messages:
                if m.kind in ("assistant", "error"):
                    self._ends.setdefault(turn_id, m)
                elif m.kind == "tool_call" and "callId" in m.payload:
                    self._call_turns[conversation_id, m.payload["callId"]] = turn_id
        rows = self._memory[conversation_id]
        start = rows[-1].order_idx + 1 if rows else 0
        rows.extend(MemoryRow(i, turn_id, item) for i, item in enumerate(memory, start=start))
        if touch is not None:
            await self.update_conversation(conversation_id, updated_at=touch)

    async def add_user_message(
        self, msg: Message, *, idempotency_key: str | None = None
    ) -> TurnRecord:
        cid = msg.conversation_id
        if idempotency_key is not None:
            known = self._keys.setdefault((cid, idempotency_key), msg.id)
            if known != msg.id:
                return self._turns[known]
        await self.append(cid, [msg], turn_id=msg.id, touch=msg.created_at)
        record = self._turns[msg.id] = TurnRecord(msg, TurnState.QUEUED, updated_at=msg.created_at)
        return record

    def _move(self, turn_id: str, update: TurnUpdate) -> None:
        old = self._turns.get(turn_id)
        if old is None:
            raise TurnStateError(f"turn {turn_id} cannot go from nowhere to {update.state}")
        check_move(old.state, update.state)
        self._turns[turn_id] = replace(
            old, state=update.state, step=update.step, waits=update.waits, updated_at=utcnow()
        )

    async def get_turn(self, turn_id: str) -> TurnRecord | None:
        return self._turns.get(turn_id)

    async def open_turns(self, conversation_id: str | None = None) -> list[TurnRecord]:
        return [
            r
            for r in self._turns.values()
            if not r.state.final and conversation_id in (None, r.conversation_id)
        ]

    async def update_turn(self, conversation_id: str, turn_id: str, update: TurnUpdate) -> None:
        self._move(turn_id, update)

    async def list_messages(
        self,
        conversation_id: str,
        after: str | None,
        offset: int,
        limit: int,
        *,
        max_bytes: int | None = None,
    ) -> list[Message]:
        msgs = self._messages.get(conversation_id, [])
        if after is not None:
            ids = [m.id for m in msgs]
            if after not in ids:
                raise UnknownReference(f"after: no message {after!r} in this conversation")
            msgs = msgs[ids.index(after) + 1 :]
        page = msgs[offset : offset + limit]
        if max_bytes is not None:
            size = 0
            for i, m in enumerate(page):
                size += len(json.dumps(m.payload, ensure_ascii=False))
                if i and size > max_bytes:
                    return page[:i]
        return page

    async def recent_turns(self, conversation_id: str, turns: int) -> list[Message]:
        msgs = self._messages.get(conversation_id, [])
        starts = [i for i, m in enumerate(msgs) if m.kind == "user"]
        first = starts[-max(turns, 1)] if len(starts) >= max(turns, 1) else 0
        return msgs[first:]

    async def turn_end(self, turn_id: str) -> Message | None:
        return self._ends.get(turn_id)

    async def tool_call_turn(self, conversation_id: str, call_id: str) -> str | None:
        return self._call_turns.get((conversation_id, call_id))

    async def list_memory(self, conversation_id: str) -> list[MemoryRow]:
        return list(self._memory.get(conversation_id, []))

    async def clear_memory(self, conversation_id: str) -> None:
        self._memory[conversation_id] = []

    async def fail_turn(
        self,
        conversation_id: str,
        turn_id: str,
        error: Message,
        state: TurnState = TurnState.FAILED,
    ) -> None:
        self._move(turn_id, TurnUpdate(state, 0))
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
                    context = turn_context(m.payload)
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
