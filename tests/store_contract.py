"""The store contract: what every :class:`agentik.core.store.Store` must do, whatever keeps the
data. ``tests/test_store_contract.py`` runs these tests against each implementation (the
``contract_store`` fixture there); a new store adds itself to that fixture and passes them all.
What one implementation does beyond the contract (SQLite's WAL, its fsyncs) is tested in its
own file (``tests/test_store.py``)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from agentik.core.llm import HistoryItem
from agentik.core.records import utcnow
from agentik.core.store import Store
from agentik.core.turns import TurnState, TurnStateError, TurnUpdate, Wait
from agentik.core.types import ConversationInfo, InvalidInput, Message, UnknownReference


def conv(cid: str = "c1", title: str | None = None, age: float = 0) -> ConversationInfo:
    when = utcnow() - timedelta(seconds=age)
    return ConversationInfo(cid, title, False, when, when)


def msg(mid: str, kind: str = "user", cid: str = "c1", **payload: Any) -> Message:
    if kind == "user":
        payload.setdefault("content", [{"type": "text", "body": mid}])
    return Message(mid, cid, kind, utcnow(), payload)  # type: ignore[arg-type]


async def send(store: Store, mid: str, cid: str = "c1", key: str | None = None) -> Any:
    return await store.add_user_message(msg(mid, cid=cid), idempotency_key=key)


# --- conversations ---------------------------------------------------------------------------


async def test_conversations_are_created_listed_renamed_and_deleted(contract_store: Store):
    s = contract_store
    await s.create_conversation(conv("old", age=60))
    await s.create_conversation(conv("new", "Hello"))
    assert await s.count_conversations() == 2
    assert [c.id for c in await s.list_conversations(0, 10)] == ["new", "old"]  # newest first
    assert [c.id for c in await s.list_conversations(1, 1)] == ["old"]
    assert (await s.get_conversation("new")).title == "Hello"
    assert await s.get_conversation("none") is None
    await s.update_conversation("old", updated_at=utcnow(), title="Renamed", set_title=True)
    assert [(c.id, c.title) for c in await s.list_conversations(0, 1)] == [("old", "Renamed")]
    assert await s.delete_conversation("old")
    assert not await s.delete_conversation("old")
    assert await s.get_conversation("old") is None and await s.count_conversations() == 1


async def test_a_deleted_conversation_takes_its_records_turns_and_aliases(contract_store: Store):
    s = contract_store
    info, created = await s.aliased_conversation("agui", "thread", conv("c1"))
    assert created and info.id == "c1"
    await send(s, "u1", key="k")
    await s.append("c1", [msg("a1", "assistant")], [HistoryItem("user", "x")], turn_id="u1")
    assert await s.delete_conversation("c1")
    assert await s.get_turn("u1") is None and await s.open_turns() == []
    await s.create_conversation(conv("c1"))  # the same id again starts empty
    assert await s.list_messages("c1", None, 0, 10) == [] and await s.list_memory("c1") == []
    again, created = await s.aliased_conversation("agui", "thread", conv("c2"))
    assert created and again.id == "c2"  # the alias went with its conversation
    assert (await send(s, "u2", key="k")).id == "u2"  # so did the key


async def test_an_alias_names_one_conversation_per_namespace(contract_store: Store):
    s = contract_store
    first, created = await s.aliased_conversation("agui", "t", conv("c1"))
    known, again = await s.aliased_conversation("agui", "t", conv("c2"))
    other, third = await s.aliased_conversation("a2a", "t", conv("c3"))
    assert (created, again, third) == (True, False, True)
    assert known.id == first.id == "c1" and other.id == "c3"
    assert await s.get_conversation("c2") is None  # nothing was created for the second use


# --- the audit log and working memory --------------------------------------------------------


async def test_the_audit_log_pages_by_offset_limit_and_after(contract_store: Store):
    s = contract_store
    await s.create_conversation(conv())
    await s.append("c1", [msg(f"m{i}", "assistant") for i in range(10)])
    assert [m.id for m in await s.list_messages("c1", None, 0, 3)] == ["m0", "m1", "m2"]
    assert [m.id for m in await s.list_messages("c1", None, 8, 5)] == ["m8", "m9"]
    assert [m.id for m in await s.list_messages("c1", "m6", 0, 50)] == ["m7", "m8", "m9"]
    assert [m.id for m in await s.list_messages("c1", "m6", 1, 1)] == ["m8"]
    with pytest.raises(UnknownReference):
        await s.list_messages("c1", "nope", 0, 5)
    assert issubclass(UnknownReference, InvalidInput)


async def test_working_memory_keeps_order_and_a_failed_turn_leaves_none(contract_store: Store):
    s = contract_store
    await s.create_conversation(conv())
    await send(s, "t1")
    await send(s, "t2")
    await s.append("c1", memory=[HistoryItem("user", "a"), HistoryItem("assistant", "b")],
                   turn_id="t1")  # fmt: skip
    call = HistoryItem("tool_call", call_id="x", tool_name="f", args_json="{}", extra={"k": 1})
    await s.append("c1", memory=[HistoryItem("user", "c"), call], turn_id="t2")
    rows = await s.list_memory("c1")
    assert [r.order_idx for r in rows] == [0, 1, 2, 3]
    assert [r.turn_id for r in rows] == ["t1", "t1", "t2", "t2"]
    assert rows[3].item == call
    await s.fail_turn("c1", "t2", msg("e2", "error", message="boom"))
    assert [r.item.text for r in await s.list_memory("c1")] == ["a", "b"]
    assert [m.kind for m in await s.list_messages("c1", None, 0, 5)] == ["user", "user", "error"]
    assert (await s.get_turn("t2")).state is TurnState.FAILED
    await s.clear_memory("c1")
    assert await s.list_memory("c1") == []


async def test_compaction_is_one_summary_in_place_of_the_old_entries(contract_store: Store):
    s = contract_store
    await s.create_conversation(conv())
    await s.append("c1", memory=[HistoryItem("user", str(i)) for i in range(6)])
    record = msg("sum1", "summary", text="S")
    await s.compact_memory("c1", 4, HistoryItem("summary", "S"), record)
    rows = await s.list_memory("c1")
    assert [(r.item.role, r.item.text) for r in rows] == [
        ("summary", "S"),
        ("user", "4"),
        ("user", "5"),
    ]
    assert [m.id for m in await s.list_messages("c1", None, 0, 5)] == ["sum1"]
    await s.append("c1", memory=[HistoryItem("user", "6")])
    assert [r.item.text for r in await s.list_memory("c1")][-1] == "6"


async def test_recent_turns_start_at_a_user_message(contract_store: Store):
    s = contract_store
    await s.create_conversation(conv())
    await s.create_conversation(conv("c2"))
    await s.append("c2", [msg("other", cid="c2")])
    records = []
    for t in range(3):
        records += [msg(f"u{t}"), msg(f"tc{t}", "tool_call"), msg(f"a{t}", "assistant")]
    await s.append("c1", records)
    assert [m.id for m in await s.recent_turns("c1", 2)] == ["u1", "tc1", "a1", "u2", "tc2", "a2"]
    assert len(await s.recent_turns("c1", 30)) == 9  # fewer turns than asked: all of them
    assert [m.id for m in await s.recent_turns("c1", 1)] == ["u2", "tc2", "a2"]
    assert await s.recent_turns("nobody", 5) == []


async def test_token_stats_add_up_the_assistant_records(contract_store: Store):
    s = contract_store
    await s.create_conversation(conv("a"))
    await s.create_conversation(conv("b"))
    await s.append("a", [msg("r1", "assistant", cid="a", tokens={"input": 10, "output": 4})])
    stats = await s.token_stats()
    assert (stats.turns, stats.input, stats.output, stats.uncounted) == (1, 10, 4, 0)
    assert (await s.token_stats("b")).turns == 0
    unknown = {"input": None, "output": None}
    await s.append("a", [msg("r2", "assistant", cid="a", tokens=unknown)])
    stats = await s.token_stats()
    assert (stats.turns, stats.input, stats.output, stats.uncounted) == (2, 10, 4, 1)
    assert (await s.token_stats("a")).context is None  # the last turn could not count
    await s.append("a", [msg("r3", "assistant", cid="a", tokens={"input": 20, "output": 5})])
    assert (await s.token_stats("a")).context == 25


async def test_agent_state_is_set_read_and_deleted(contract_store: Store):
    s = contract_store
    assert await s.read_state("k") is None
    await s.write_state("k", "v1")
    await s.write_state("k", "v2")
    assert await s.read_state("k") == "v2"
    await s.write_state("k", None)
    assert await s.read_state("k") is None


# --- turns -----------------------------------------------------------------------------------


async def test_a_send_is_a_queued_turn_and_a_keyed_retry_is_the_same_turn(contract_store: Store):
    s = contract_store
    await s.create_conversation(conv())
    first = await send(s, "u1", key="k1")
    assert (first.id, first.state, first.step) == ("u1", TurnState.QUEUED, 0)
    assert first.user.payload["content"] == [{"type": "text", "body": "u1"}]
    await s.append("c1", turn_id="u1", turn=TurnUpdate(TurnState.RUNNING, 1))
    retry = await send(s, "u1-again", key="k1")
    assert (retry.id, retry.state, retry.step) == ("u1", TurnState.RUNNING, 1)  # as it stands
    assert await s.count_turns("c1") == 1 and await s.get_turn("u1-again") is None
    await s.create_conversation(conv("c2"))
    assert (await send(s, "u2", cid="c2", key="k1")).id == "u2"  # keys are per conversation
    assert (await send(s, "u3")).id == "u3" and (await send(s, "u4")).id == "u4"  # no key


async def test_open_turns_are_the_fifo_of_each_conversation(contract_store: Store):
    s = contract_store
    await s.create_conversation(conv("a"))
    await s.create_conversation(conv("b"))
    for mid, cid in (("a1", "a"), ("b1", "b"), ("a2", "a"), ("a3", "a"), ("b2", "b")):
        await send(s, mid, cid)
    await s.append("a", [msg("r1", "assistant", cid="a")], turn_id="a1",
                   turn=TurnUpdate(TurnState.DONE, 1))  # fmt: skip
    await s.fail_turn("b", "b1", msg("e", "error", cid="b"), TurnState.CANCELLED)
    assert [t.id for t in await s.open_turns()] == ["a2", "a3", "b2"]
    assert [t.id for t in await s.open_turns("a")] == ["a2", "a3"]
    assert (await s.turn_end("a1")).id == "r1" and (await s.turn_end("b1")).id == "e"
    assert await s.turn_end("a2") is None  # still open
    assert (await s.get_turn("b1")).state is TurnState.CANCELLED


async def test_a_step_and_its_turn_move_are_one_write(contract_store: Store):
    s = contract_store
    await s.create_conversation(conv())
    await send(s, "u1")
    await s.append("c1", [msg("tc1", "tool_call")], [HistoryItem("user", "hi")], turn_id="u1",
                   turn=TurnUpdate(TurnState.RUNNING, 1))  # fmt: skip
    turn = await s.get_turn("u1")
    assert (turn.state, turn.step) == (TurnState.RUNNING, 1)
    with pytest.raises(TurnStateError):  # running cannot go back to queued
        await s.append("c1", [msg("tc2", "tool_call")], [HistoryItem("user", "x")],
                       turn_id="u1", turn=TurnUpdate(TurnState.QUEUED, 2))  # fmt: skip
    assert [m.id for m in await s.list_messages("c1", None, 0, 10)] == ["u1", "tc1"]
    assert len(await s.list_memory("c1")) == 1  # the refused write wrote nothing
    assert (await s.get_turn("u1")).step == 1


async def test_a_final_turn_never_moves_again(contract_store: Store):
    s = contract_store
    await s.create_conversation(conv())
    await send(s, "u1")
    await s.append("c1", [msg("a1", "assistant")], turn_id="u1",
                   turn=TurnUpdate(TurnState.DONE, 1))  # fmt: skip
    for state in TurnState:
        with pytest.raises(TurnStateError):
            await s.update_turn("c1", "u1", TurnUpdate(state, 2))
    with pytest.raises(TurnStateError):
        await s.fail_turn("c1", "u1", msg("e1", "error"))
    with pytest.raises(TurnStateError):  # a turn that does not exist moves nowhere
        await s.update_turn("c1", "none", TurnUpdate(TurnState.RUNNING, 1))
    assert (await s.get_turn("u1")).state is TurnState.DONE
    assert [m.kind for m in await s.list_messages("c1", None, 0, 5)] == ["user", "assistant"]


async def test_a_waiting_turn_keeps_what_it_waits_for_and_its_answers(contract_store: Store):
    s = contract_store
    await s.create_conversation(conv())
    await send(s, "u1")
    waits = (Wait("call-1", "approval", {"tool": "rm", "args": {"path": "/"}}), Wait("call-2", "x"))
    await s.append("c1", [msg("tc1", "tool_call")], turn_id="u1",
                   turn=TurnUpdate(TurnState.WAITING, 1, waits))  # fmt: skip
    turn = (await s.open_turns("c1"))[0]
    assert turn.state is TurnState.WAITING and turn.waits == waits
    answered = (Wait("call-1", "approval", waits[0].request, {"approve": True}, True), waits[1])
    await s.update_turn("c1", "u1", TurnUpdate(TurnState.WAITING, 1, answered))
    turn = await s.get_turn("u1")
    assert turn.waits[0].answer == {"approve": True} and turn.waits[0].answered
    assert not turn.waits[1].answered and turn.waits[1].answer is None
    null = (answered[0], Wait("call-2", "x", {}, None, True))  # None is an answer too
    await s.update_turn("c1", "u1", TurnUpdate(TurnState.RUNNING, 1, null))
    turn = await s.get_turn("u1")
    assert turn.state is TurnState.RUNNING and all(w.answered for w in turn.waits)


async def test_concurrent_writes_are_never_lost(contract_store: Store):
    s = contract_store
    await s.create_conversation(conv())
    await asyncio.gather(*(s.append("c1", [msg(f"m{i}", "assistant")]) for i in range(200)))
    await asyncio.gather(*(send(s, f"u{i}", key=f"k{i % 20}") for i in range(100)))
    assert len(await s.list_messages("c1", None, 0, 500)) == 220  # 20 keys: 20 user messages
    assert len(await s.open_turns("c1")) == 20


async def test_a_tool_calls_turn_is_found_by_its_call_id(contract_store: Store):
    s = contract_store
    await s.create_conversation(conv())
    for turn, call in (("u1", "call_0"), ("u2", "call_0"), ("u2", "call_1")):
        if await s.get_turn(turn) is None:
            await send(s, turn)
        await s.append("c1", [msg(f"tc-{turn}-{call}", "tool_call", callId=call)], turn_id=turn)
    assert await s.tool_call_turn("c1", "call_0") == "u2"  # the latest with that id
    assert await s.tool_call_turn("c1", "call_1") == "u2"
    assert await s.tool_call_turn("c1", "nope") is None
    assert await s.tool_call_turn("other", "call_0") is None


async def test_a_page_ends_before_the_message_that_would_pass_max_bytes(contract_store: Store):
    s = contract_store
    await s.create_conversation(conv())
    await s.append("c1", [msg(f"m{i}", "assistant", text="x" * 1000) for i in range(10)])
    page = await s.list_messages("c1", None, 0, 10, max_bytes=3500)
    assert [m.id for m in page] == ["m0", "m1", "m2"]  # each payload is a little over 1,000
    assert [m.id for m in await s.list_messages("c1", "m2", 0, 10, max_bytes=3500)] == [
        "m3", "m4", "m5"
    ]  # fmt: skip
    big = await s.list_messages("c1", None, 0, 10, max_bytes=10)
    assert [m.id for m in big] == ["m0"]  # the first message always comes
    assert len(await s.list_messages("c1", None, 0, 10)) == 10  # no budget: the whole page
