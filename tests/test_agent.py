"""The turn engine (F1, F2 error path, F4, F6 first half, F12) on a real SQLite file."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from agentik import hookimpl
from agentik.core.agent import ConversationClosed
from agentik.core.context_keeper import INTERRUPTED_NOTE
from agentik.core.llm import LLMError, ReasoningDelta, ToolCallRequest, ToolResultInput, Usage
from agentik.core.testing import ScriptedLLM, run_turn, test_plugins
from agentik.core.tools import ToolError, tool
from agentik.core.types import (
    AgentEvent,
    End,
    ImagePart,
    InvalidInput,
    MessageContext,
    TextPart,
    UserMessage,
)
from tests.conftest import TestDatabases, collect_turn, scalar


def text(body: str) -> list[TextPart]:
    return [TextPart(body)]


def kinds(messages: list) -> list[str]:
    return [m.kind for m in messages]


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool
def explode() -> str:
    """Always fails."""
    raise RuntimeError("kaboom")


@tool
async def refuse() -> str:
    raise ToolError("not allowed")


async def test_turn_streams_events_and_records_history(make_agent):
    llm = ScriptedLLM([ReasoningDelta("hmm"), "Hel", "lo", Usage(12, 3)])
    agent = await make_agent(llm)
    conv = await agent.create_conversation()
    events = asyncio.ensure_future(collect_turn(conv))
    await asyncio.sleep(0)
    user = await conv.send(text("hi"))
    got = await events
    assert [e.type for e in got] == [
        "UserMessage",
        "StartReasoning",
        "AppendText",
        "StartResponse",
        "AppendText",
        "AppendText",
        "End",
    ]
    # the accepted message first, for every viewer; the turn's End names it
    assert got[0] == UserMessage(user.id, conv.id, user.created_at, (TextPart("hi"),))
    assert got[-1] == End(user.id)
    got = got[1:]
    assert got[1].reasoning and got[1].text == "hmm"
    msgs = await conv.get_messages()
    assert kinds(msgs) == ["user", "assistant"]
    assert msgs[0].id == user.id
    assert msgs[1].payload == {"text": "Hello", "tokens": {"input": 12, "output": 3}}
    memory = [(r.item.role, r.item.text) for r in await agent.store.list_memory(conv.id)]
    assert memory == [("user", "hi"), ("assistant", "Hello")]


async def test_sends_to_a_busy_conversation_run_in_order(make_agent):
    llm = ScriptedLLM(delay=0.01)
    agent = await make_agent(llm)
    conv = await agent.create_conversation()
    for i in range(5):
        await conv.send(text(f"m{i}"))
    await conv.wait_idle()
    msgs = await conv.get_messages()
    users = [i for i, m in enumerate(msgs) if m.kind == "user"]
    answers = [i for i, m in enumerate(msgs) if m.kind == "assistant"]
    assert len(users) == len(answers) == 5
    assert all(u < a for u, a in zip(users, answers, strict=True))
    replies = [m.payload["text"] for m in msgs if m.kind == "assistant"]
    assert replies == [f"echo: m{i}" for i in range(5)]
    # every user message reached the model, in order, none dropped
    assert [i[0].text for i in llm.received] == [f"m{i}" for i in range(5)]


async def test_tool_loop_records_linked_pairs_and_feeds_results_back(make_agent):
    llm = ScriptedLLM(
        ["Let me add. ", ToolCallRequest("call_1", "add", '{"a": 2, "b": 3}'), Usage(100, 10)],
        ["It is 5.", Usage(130, 5)],
    )
    agent = await make_agent(llm, tools=[add])
    conv = await agent.create_conversation()
    events = asyncio.ensure_future(collect_turn(conv))
    await asyncio.sleep(0)
    await conv.send(text("2+3?"))
    got = (await events)[1:]  # after the UserMessage
    types = [e.type for e in got]
    assert types == [
        "StartResponse",
        "AppendText",
        "ToolCall",
        "ToolResult",
        "StartResponse",
        "AppendText",
        "End",
    ]
    call, result = got[2], got[3]
    assert (call.call_id, call.tool_name, call.args_json) == ("call_1", "add", '{"a": 2, "b": 3}')
    assert (result.call_id, result.text, result.is_error) == ("call_1", "5", False)
    assert llm.received[1] == [ToolResultInput("call_1", "add", "5")]
    msgs = await conv.get_messages()
    assert kinds(msgs) == ["user", "tool_call", "tool_result", "assistant"]
    tc, tr, reply = msgs[1], msgs[2], msgs[3]
    assert tc.id.startswith("tc-") and tr.id.startswith("tr-") and tc.id != tr.id
    assert tr.payload["toolCallId"] == tc.id and tr.payload["callId"] == "call_1"
    assert tr.id == result.result_id
    assert reply.payload["text"] == "Let me add. It is 5."
    # F12: input before the first send, output = growth over the whole tool loop
    assert reply.payload["tokens"] == {"input": 100, "output": 135 - 100}
    memory = [r.item.role for r in await agent.store.list_memory(conv.id)]
    assert memory == ["user", "assistant", "tool_call", "tool_result", "assistant"]


@pytest.mark.parametrize(
    ("name", "args", "expected"),
    [
        ("explode", "{}", "Error: RuntimeError: kaboom"),
        ("refuse", "{}", "Error: not allowed"),
        ("missing", "{}", "Error: unknown tool 'missing'"),
        ("add", "{not json", "Error: arguments are not valid JSON"),
        ("add", '{"a": 1}', "Error: invalid arguments for add: 'b' is a required property"),
    ],
)
async def test_a_failing_tool_gives_an_error_result_not_a_dead_turn(
    make_agent, name, args, expected
):
    llm = ScriptedLLM([ToolCallRequest("c", name, args)], ["recovered"])
    agent = await make_agent(llm, tools=[add, explode, refuse])
    conv = await agent.create_conversation()
    events = asyncio.ensure_future(collect_turn(conv))
    await asyncio.sleep(0)
    await conv.send(text("go"))
    got = await events
    result = next(e for e in got if e.type == "ToolResult")
    assert result.is_error and result.text.startswith(expected)
    assert got[-2].text == "recovered" and got[-1].type == "End"
    assert llm.received[1][0].text.startswith(expected)


async def test_llm_error_path(make_agent):
    llm = ScriptedLLM(["hi"], LLMError("upstream said 503", "http_503"))
    agent = await make_agent(llm)
    conv = await agent.create_conversation()
    await conv.send(text("first"))
    await conv.wait_idle()
    events = asyncio.ensure_future(collect_turn(conv))
    await asyncio.sleep(0)
    await conv.send(text("second"))
    got = (await events)[1:]  # after the UserMessage
    assert [e.type for e in got] == ["Error", "End"]
    assert (got[0].message, got[0].code) == ("upstream said 503", "http_503")
    msgs = await conv.get_messages()
    assert kinds(msgs) == ["user", "assistant", "user", "error"]
    assert msgs[3].payload["userMessageId"] == msgs[2].id
    # nothing of the failed turn is in working memory
    memory = [(r.item.role, r.item.text) for r in await agent.store.list_memory(conv.id)]
    assert memory == [("user", "first"), ("assistant", "hi")]
    # the live LLM conversation was dropped and the next send rebuilds it from memory
    assert llm.closed == 1
    await conv.send(text("third"))
    await conv.wait_idle()
    assert len(llm.conversations) == 2
    assert [(h.role, h.text) for h in llm.conversations[1].history] == memory
    assert (await conv.get_messages())[-1].payload["text"] == "echo: third"


async def test_error_after_tool_calls_rolls_back_working_memory(make_agent):
    llm = ScriptedLLM([ToolCallRequest("c", "add", '{"a":1,"b":1}')], LLMError("gone", "timeout"))
    agent = await make_agent(llm, tools=[add])
    conv = await agent.create_conversation()
    await conv.send(text("x"))
    await conv.wait_idle()
    assert kinds(await conv.get_messages()) == ["user", "tool_call", "tool_result", "error"]
    assert await agent.store.list_memory(conv.id) == []


async def test_live_llm_conversation_is_reused_across_turns(make_agent):
    llm = ScriptedLLM()
    agent = await make_agent(llm)
    conv = await agent.create_conversation()
    for i in range(3):
        await conv.send(text(f"t{i}"))
    await conv.wait_idle()
    assert len(llm.conversations) == 1 and conv.llm_builds == 1


async def test_restart_rebuilds_the_llm_conversation_from_working_memory(make_agent, tmp_path):
    db = str(tmp_path / "r.db")
    agent = await make_agent(ScriptedLLM(), db=db)
    conv = await agent.create_conversation()
    await conv.send(text("remember me"))
    await conv.wait_idle()
    await agent.close()
    llm2 = ScriptedLLM()
    agent2 = await make_agent(llm2, db=db)
    conv2 = await agent2.get_conversation(conv.id)
    await conv2.send(text("again"))
    await conv2.wait_idle()
    history = [(h.role, h.text) for h in llm2.conversations[0].history]
    assert history == [("user", "remember me"), ("assistant", "echo: remember me")]


async def test_interrupt_stops_the_turn_and_the_next_send_works(make_agent):
    llm = ScriptedLLM(["a"] * 1000, delay=0.01)
    agent = await make_agent(llm)
    conv = await agent.create_conversation()
    events = asyncio.ensure_future(collect_turn(conv))
    await asyncio.sleep(0)
    await conv.send(text("long"))
    assert conv.busy  # the turn starts at once (send queued it)
    await asyncio.sleep(0.05)
    assert conv.interrupt() is True
    got = await events
    assert [e.type for e in got[-2:]] == ["Interrupted", "End"]
    assert sum(e.type == "End" for e in got) == 1
    await conv.wait_idle()
    msgs = await conv.get_messages()
    assert kinds(msgs) == ["user", "assistant"]
    assert msgs[1].payload["interrupted"] is True
    assert 0 < len(msgs[1].payload["text"]) < 1000
    assert llm.closed == 1  # a cut stream leaves the live conversation unusable
    assert conv.interrupt() is False
    await conv.send(text("next"))
    await conv.wait_idle()
    assert (await conv.get_messages())[-1].payload["text"] == "echo: next"
    # rebuilt after the interrupt: the partial reply as it was, the note in the system prompt
    (partial,) = [h for h in llm.conversations[-1].history if h.role == "assistant"]
    assert partial.text == msgs[1].payload["text"] and partial.extra == {"interrupted": True}
    assert llm.prompts[-1].endswith(INTERRUPTED_NOTE)


async def test_a_model_that_keeps_calling_tools_gets_a_last_request_without_them(make_agent):
    """A small model called a tool 27 and 40 times in a row, the conversation busy for
    minutes: after AGENTIK_MAX_TOOL_ROUNDS rounds the model is asked once more without tools;
    a tool call then ends the turn with an Error that says so."""
    asked_without: list[int] = []

    class Looping(ScriptedLLM):
        def default(self, inputs):
            return [ToolCallRequest(f"c{len(self.received)}", "add", '{"a": 1, "b": 1}')]

    llm = Looping()
    agent = await make_agent(llm, tools=[add], max_tool_rounds=3)
    conv = await agent.create_conversation()
    events = asyncio.ensure_future(collect_turn(conv))
    await asyncio.sleep(0)
    await conv.send(text("loop"))
    got = await events
    assert [e.type for e in got].count("ToolResult") == 3
    assert got[-2].type == "Error" and got[-2].code == "tool_loop"
    assert "kept calling tools" in got[-2].message and "AGENTIK_MAX_TOOL_ROUNDS" in got[-2].message
    assert len(llm.received) == 4  # three rounds, then the last request
    assert kinds(await conv.get_messages())[-1] == "error"
    assert await agent.store.list_memory(conv.id) == []  # F2: a failed turn leaves nothing

    # a model that answers when it is offered no tools ends the turn with its answer
    class Answering(Looping):
        def create_conversation(self, system_prompt, history, tools):
            conv = super().create_conversation(system_prompt, history, tools)

            def without_tools(inputs):
                asked_without.append(len(self.received))
                self.steps.append(["Done: 2."])
                return conv.stream(inputs)

            conv.stream_without_tools = without_tools
            return conv

    agent = await make_agent(Answering(), tools=[add], max_tool_rounds=2, db=":memory:")
    turn = await run_turn(agent, "loop")
    assert turn.text == "Done: 2." and turn.types.count("ToolCall") == 2
    assert asked_without == [2]


async def test_an_interrupted_turn_records_what_is_known_of_its_counts(make_agent):
    """Its prompt was processed all the same: the finished steps' counts plus an estimate of
    the cut step's text, never 0 (it was recorded as null, and counted 0 in the stats)."""
    gate = asyncio.Event()

    @tool
    async def wait() -> str:
        await gate.wait()
        return "ok"

    llm = ScriptedLLM(
        [ToolCallRequest("c1", "wait", "{}"), Usage(100, 10)],
        ["word "] * 1000,  # no usage: it is cut first
        delay=0.005,
    )
    agent = await make_agent(llm, tools=[wait])
    conv = await agent.create_conversation()
    events = asyncio.ensure_future(collect_turn(conv))
    await asyncio.sleep(0)
    await conv.send(text("go"))
    await asyncio.sleep(0.05)
    gate.set()
    await asyncio.sleep(0.1)  # some words of the second step streamed
    assert conv.interrupt()
    got = await events
    words = sum(e.type == "AppendText" for e in got)
    assert 0 < words < 1000
    tokens = (await conv.get_messages())[-1].payload["tokens"]
    assert tokens["input"] == 100 and tokens["estimated"] is True
    assert tokens["output"] == 10 + len("word ") * words // 4
    stats = await conv.token_stats()
    assert (stats.input, stats.uncounted) == (100, 0)

    # cut before any step finished: estimates of what was sent and streamed
    llm.steps = [["word "] * 1000]
    events = asyncio.ensure_future(collect_turn(conv))
    await asyncio.sleep(0)
    await conv.send(text("again"))
    await asyncio.sleep(0.05)
    assert conv.interrupt()
    await events
    tokens = (await conv.get_messages())[-1].payload["tokens"]
    assert tokens["input"] > 0 and tokens["output"] > 0 and tokens["estimated"] is True


async def test_interrupt_during_a_tool_call_closes_the_pair(make_agent):
    started = asyncio.Event()

    @tool
    async def slow() -> str:
        started.set()
        await asyncio.sleep(30)
        return "never"

    agent = await make_agent(ScriptedLLM([ToolCallRequest("c9", "slow", "{}")]), tools=[slow])
    conv = await agent.create_conversation()
    await conv.send(text("x"))
    await asyncio.wait_for(started.wait(), 5)
    conv.interrupt()
    await conv.wait_idle()
    msgs = await conv.get_messages()
    assert kinds(msgs) == ["user", "tool_call", "tool_result", "assistant"]
    assert msgs[2].payload["isError"] and msgs[2].payload["toolCallId"] == msgs[1].id
    roles = [r.item.role for r in await agent.store.list_memory(conv.id)]
    assert roles == ["user", "tool_call", "tool_result"]


async def test_context_prefix_reaches_the_llm_but_not_the_history(make_agent):
    llm = ScriptedLLM()
    agent = await make_agent(llm)
    conv = await agent.create_conversation()
    ctx = MessageContext(
        "event",
        "scheduled cron morning-briefing",
        "cron-42",
        {"scheduledAt": "2026-09-14T08:00:00Z"},
    )
    await conv.send(text("wake up"), ctx)
    await conv.wait_idle()
    assert llm.received[0][0].text == (
        "[EVENT] scheduled cron morning-briefing (sourceId=cron-42)\nwake up"
    )
    user = (await conv.get_messages())[0]
    assert user.payload["content"] == [{"type": "text", "body": "wake up"}]
    assert user.payload["context"]["metadata"] == {"scheduledAt": "2026-09-14T08:00:00Z"}
    assert "scheduledAt" not in json.dumps([str(i) for i in llm.received])


def test_context_validation():
    with pytest.raises(InvalidInput, match="description is required"):
        MessageContext("system")
    with pytest.raises(InvalidInput, match="origin"):
        MessageContext.from_json({"origin": "robot"})
    assert MessageContext.from_json({}).origin == "user"
    assert MessageContext("system", "boot").llm_prefix() == "[SYSTEM] boot\n"


async def test_temp_conversations_are_never_persisted(make_agent, tmp_path):
    """Alone on its store (SQLite) a temporary conversation is never written. Where instances
    share the store (PostgreSQL) it is in the database while it lives, so that every instance
    serves it, but listed and counted nowhere, and gone once it ends."""
    agent = await make_agent()
    conv = await agent.create_conversation(temp=True)
    await conv.send(text("secret"))
    await conv.wait_idle()
    assert kinds(await conv.get_messages()) == ["user", "assistant"]
    assert await agent.count_conversations() == 0
    assert await agent.list_conversations() == []
    assert (await agent.get_conversation(conv.id)) is conv
    sql = "SELECT count(*) FROM message WHERE payload_json LIKE '%secret%'"
    if TestDatabases.current is None:  # SQLite: not in the file at all (WAL, indexes …)
        assert await agent.store.get_conversation(conv.id) is None
        assert b"secret" not in (tmp_path / "agent.db").read_bytes()
        assert scalar(tmp_path / "agent.db", sql) == 0
    else:
        assert scalar(tmp_path / "agent.db", sql) == 2  # its message, and the echo
    assert await agent.delete_conversation(conv.id)
    assert await agent.get_conversation(conv.id) is None
    assert scalar(tmp_path / "agent.db", sql) == 0


async def test_images_are_refused_clearly_and_nothing_is_recorded(make_agent):
    agent = await make_agent()
    conv = await agent.create_conversation()
    with pytest.raises(InvalidInput, match="image"):
        await conv.send([ImagePart("image/png", data="AAAA")])
    assert await conv.get_messages() == []


async def test_images_reach_a_model_that_takes_them_and_stay_in_its_context(make_agent):
    llm = ScriptedLLM()
    llm.capabilities = {"image_input": True, "image_url_input": False}
    agent = await make_agent(llm)
    conv = await agent.create_conversation()
    png = ImagePart("image/png", data="AAAA")
    with pytest.raises(InvalidInput, match="as data, not as a url"):
        await conv.send([ImagePart("image/png", url="https://x/y.png")])
    await conv.send([TextPart("what is it?"), png])
    await conv.wait_idle()
    assert llm.received[0][0].images == (png,)
    (row, _) = await agent.store.list_memory(conv.id)
    assert row.item.extra == {"images": [png.to_json()]}  # a rebuilt context has it too


async def test_delete_stops_the_turn_and_cascades(make_agent):
    agent = await make_agent(ScriptedLLM(["x"] * 500, delay=0.01))
    conv = await agent.create_conversation()
    await conv.send(text("go"))
    await asyncio.sleep(0.03)
    assert await agent.delete_conversation(conv.id)
    assert await agent.get_conversation(conv.id) is None
    assert await agent.store.list_memory(conv.id) == []
    with pytest.raises(ConversationClosed):
        await conv.send(text("late"))
    assert not await agent.delete_conversation(conv.id)


async def test_rename_and_listing(make_agent):
    agent = await make_agent()
    a = await agent.create_conversation(title="a")
    b = await agent.create_conversation()
    await b.rename("bee")
    page = await agent.list_conversations(0, 10)
    assert [(c.id, c.title) for c in page] == [(b.id, "bee"), (a.id, "a")]
    assert [c.id for c in await agent.list_conversations(1, 10)] == [a.id]


async def test_agent_events_report_conversation_changes(make_agent):
    agent = await make_agent()
    seen: list[tuple[str, str]] = []

    async def watch() -> None:
        async for event in agent.events():
            kind = event.kind if isinstance(event, AgentEvent) else event.type
            seen.append((kind, event.conversation_id))
            if kind == "ConversationDeleted":
                return

    watcher = asyncio.ensure_future(watch())
    await asyncio.sleep(0)
    conv = await agent.create_conversation()
    await conv.send(text("hi"))
    await conv.wait_idle()
    await agent.delete_conversation(conv.id)
    await asyncio.wait_for(watcher, 5)
    assert [k for k, _ in seen] == [
        "ConversationCreated",
        "UserMessage",
        "ConversationUpdated",
        "TurnStarted",
        "TurnEnded",
        "ConversationDeleted",
    ]
    assert {c for _, c in seen} == {conv.id}


async def test_system_prompt_sections_in_order_and_a_failing_one_is_left_out(make_agent):
    def broken() -> str:
        raise RuntimeError("no")

    llm = ScriptedLLM()
    agent = await make_agent(
        llm,
        prompt_sections=[
            (100, "base", lambda: "Be brief."),
            (0, "soul", lambda: "You are Ada."),
            (50, "broken", broken),
            (200, "empty", lambda: None),
            # a section that reads what its plugin keeps on the agent
            (300, "stateful", lambda agent: agent.state.get("mood")),
        ],
    )
    conv = await agent.create_conversation()
    await conv.send(text("hi"))
    await conv.wait_idle()
    assert llm.prompts == ["You are Ada.\n\nBe brief."]
    agent.state["mood"] = "Cheerful today."
    assert agent.system_prompt() == "You are Ada.\n\nBe brief.\n\nCheerful today."


async def test_a_changed_section_reaches_the_live_conversation_at_its_next_turn(make_agent):
    """A backend that cannot swap the system prompt (ScriptedLLM, like LiteRT-LM): the live
    conversation is rebuilt from working memory, with the history, only when the prompt
    changed; the prompt is rendered once per turn."""
    renders = []

    def weak_spots(agent):
        renders.append(1)
        return agent.state.get("weak spots")

    llm = ScriptedLLM()
    agent = await make_agent(
        llm, prompt_sections=[(100, "base", lambda: "Be brief."), (400, "spots", weak_spots)]
    )
    conv = await agent.create_conversation()
    for body in ("one", "two"):
        await conv.send(text(body))
        await conv.wait_idle()
    assert llm.prompts == ["Be brief."] and conv.llm_builds == 1 and len(renders) == 2
    agent.state["weak spots"] = "Weak spots: answers too long."  # e.g. a reflection ran
    await conv.send(text("three"))
    await conv.wait_idle()
    assert llm.prompts[-1] == "Be brief.\n\nWeak spots: answers too long."
    assert conv.llm_builds == 2
    rebuilt = llm.conversations[-1]
    assert [(h.role, h.text) for h in rebuilt.history] == [
        ("user", "one"),
        ("assistant", "echo: one"),
        ("user", "two"),
        ("assistant", "echo: two"),
    ]
    await conv.send(text("four"))  # unchanged: kept
    await conv.wait_idle()
    assert conv.llm_builds == 2 and len(renders) == 5


async def test_idle_conversations_beyond_the_cap_are_dropped_from_memory(make_agent):
    llm = ScriptedLLM()
    agent = await make_agent(llm, max_live=2)
    convs = [await agent.create_conversation() for _ in range(5)]
    for c in convs:
        await c.send(text(f"hi {c.id}"))
    for c in convs:
        await c.wait_idle()
    assert len(agent._live) == 2
    await agent.jobs.wait_idle()
    assert llm.closed == 3  # the evicted ones released their live LLM conversation
    # a stale object keeps working: it acts on the conversation the agent loads again
    stale = convs[0]
    fresh = await agent.get_conversation(stale.id)
    assert fresh is not stale
    events = asyncio.ensure_future(collect_turn(stale))
    await asyncio.sleep(0)
    await stale.send(text("still there?"))
    got = await events
    assert got[-2].text == "echo: still there?"
    history = [(h.role, h.text) for h in llm.conversations[-1].history]
    assert history == [("user", f"hi {stale.id}"), ("assistant", f"echo: hi {stale.id}")]
    await stale.rename("renamed")
    assert (await agent.get_conversation(stale.id)).title == "renamed"


async def test_a_conversation_with_readers_is_not_dropped(make_agent):
    agent = await make_agent(max_live=1)
    watched = await agent.create_conversation()
    reader = watched.events()
    pending = asyncio.ensure_future(reader.__anext__())
    await asyncio.sleep(0)
    await agent.create_conversation()
    await agent.create_conversation()
    assert watched.id in agent._live
    pending.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await pending


async def test_an_interrupt_while_the_turn_records_its_end_changes_nothing(make_agent):
    agent = await make_agent(ScriptedLLM(["done"]))
    conv = await agent.create_conversation()
    events = asyncio.ensure_future(collect_turn(conv))
    await asyncio.sleep(0)
    store_append = agent.store.append

    async def slow_append(*args, **kwargs):
        if args[1] and args[1][0].kind == "assistant":
            assert conv.interrupt() is False  # the end is being recorded: too late
        return await store_append(*args, **kwargs)

    agent.store.append = slow_append
    await conv.send(text("x"))
    got = await events
    assert [e.type for e in got][-1] == "End" and "Interrupted" not in [e.type for e in got]
    assert kinds(await conv.get_messages()) == ["user", "assistant"]


async def test_a_tool_that_hangs_times_out_into_an_error_result():
    from agentik.core.tools import ToolRegistry

    @tool
    async def hang() -> str:
        await asyncio.sleep(60)
        return "never"

    text, is_error = await ToolRegistry([hang], timeout=0.05).invoke("hang", "{}")
    assert is_error and text == "Error: hang did not answer within 0.05 s"


async def test_a_conversation_is_not_evicted_while_a_send_is_being_written(make_agent):
    llm = ScriptedLLM()
    agent = await make_agent(llm, max_live=1)
    b = await agent.create_conversation()
    a = await agent.create_conversation()  # B is dropped: over the cap and idle
    assert list(agent._live) == [a.id]
    sending = asyncio.ensure_future(a.send(text("one")))
    await asyncio.sleep(0)  # the send waits for its fsync
    await agent.get_conversation(b.id)  # B is loaded meanwhile: A must stay
    await sending
    assert await agent.get_conversation(a.id) is a
    await a.send(text("two"))
    await a.wait_idle()
    replies = [m.payload["text"] for m in await a.get_messages() if m.kind == "assistant"]
    assert replies == ["echo: one", "echo: two"]
    assert len(llm.conversations) == 1  # one live LLM conversation, turns in order


async def test_a_conversation_being_deleted_cannot_be_reloaded(make_agent):
    llm = ScriptedLLM(["x"] * 100, delay=0.01)
    agent = await make_agent(llm)
    conv = await agent.create_conversation()
    await conv.send(text("go"))
    release = asyncio.Event()

    async def slow_close() -> None:  # the LLM takes its time to let go
        await release.wait()

    await asyncio.sleep(0.03)
    llm.conversations[0].aclose = slow_close
    deleting = asyncio.ensure_future(agent.delete_conversation(conv.id))
    await asyncio.sleep(0.01)
    assert await agent.get_conversation(conv.id) is None
    with pytest.raises(ConversationClosed):
        await conv.send(text("late"))
    release.set()
    assert await deleting
    assert await agent.get_conversation(conv.id) is None


async def test_a_raising_after_turn_hook_does_not_touch_the_recorded_turn(make_agent):
    class Review:
        @hookimpl
        def after_turn(self, conversation, user_text, assistant_text):
            raise RuntimeError("review is down")

    llm = ScriptedLLM(["fine"])
    agent = await make_agent(llm, hooks=test_plugins([("review", Review())], builtins=[]).hook)
    conv = await agent.create_conversation()
    events = asyncio.ensure_future(collect_turn(conv))
    await asyncio.sleep(0)
    await conv.send(text("hi"))
    got = [e.type for e in await events]
    await conv.wait_idle()
    assert got.count("End") == 1 and "Error" not in got
    assert kinds(await conv.get_messages()) == ["user", "assistant"]
    assert llm.closed == 0


async def test_listeners_get_error_and_end_even_when_the_database_fails(make_agent):
    agent = await make_agent(ScriptedLLM(["reply"]))
    conv = await agent.create_conversation()
    events = asyncio.ensure_future(collect_turn(conv))
    await asyncio.sleep(0)
    real_append = agent.store.append

    async def failing_append(conversation_id, messages=(), memory=(), **kw):
        if messages and messages[0].kind == "assistant":
            raise OSError("disk full")
        return await real_append(conversation_id, messages, memory, **kw)

    async def failing_fail_turn(*args):
        raise OSError("disk full")

    agent.store.append = failing_append
    agent.store.fail_turn = failing_fail_turn
    await conv.send(text("x"))
    got = await events
    assert [e.type for e in got][-2:] == ["Error", "End"]
    assert [e.type for e in got].count("End") == 1


async def test_when_nothing_can_be_dropped_new_conversations_still_work(make_agent):
    agent = await make_agent(max_live=2)
    readers = []
    for _ in range(2):  # two conversations with a client attached: not idle
        conv = await agent.create_conversation()
        reader = conv.events()
        readers.append((reader, asyncio.ensure_future(reader.__anext__())))
    await asyncio.sleep(0)
    third = await agent.create_conversation()
    await third.send(text("hi"))  # must neither evict itself nor loop
    await third.wait_idle()
    assert (await third.get_messages())[-1].payload["text"] == "echo: hi"
    for _, pending in readers:
        pending.cancel()


async def _history_kinds(conv) -> list[tuple[str, str]]:
    out = []
    for m in await conv.get_messages(None, 0, 100):
        p = m.payload
        detail = p.get("text") if m.kind == "assistant" else p.get("code", "")
        if m.kind == "user":
            detail = p["content"][0]["body"]
        out.append((m.kind, detail))
    return out


@pytest.mark.parametrize("resume", [True, False])
async def test_a_clean_stop_runs_the_queued_messages_after_the_restart(
    make_agent, tmp_path, resume
):
    db = str(tmp_path / "q.db")
    agent = await make_agent(ScriptedLLM(["slow "] * 1000, delay=0.01), db=db)
    conv = await agent.create_conversation()
    for body in ("one", "two", "three"):
        await conv.send(text(body))
    await asyncio.sleep(0.05)  # turn one is streaming, two and three wait
    await agent.close()  # a clean stop: turn one is interrupted and recorded
    agent2 = await make_agent(ScriptedLLM(), db=db, resume_queued=resume)
    assert await agent2.resume() == (2 if resume else 0)
    conv2 = await agent2.get_conversation(conv.id)
    await conv2.wait_idle()
    kinds = await _history_kinds(conv2)
    assert kinds[:4] == [("user", "one"), ("user", "two"), ("user", "three"), kinds[3]]
    assert kinds[3][0] == "assistant" and kinds[3][1].startswith("slow")  # interrupted
    if resume:
        assert kinds[4:] == [("assistant", "echo: two"), ("assistant", "echo: three")]
    else:
        assert kinds[4:] == [("error", "restart"), ("error", "restart")]


@pytest.mark.sqlite_file
async def test_a_database_that_cannot_open_is_the_start_up_error(tmp_path):
    """Not masked by the shutdown that follows: the agent does not record a clean stop in a
    store that never opened, and the LLM client is still closed."""
    from agentik.core.app import StartupError, running
    from agentik.core.testing import make_app

    bad = tmp_path / "not-a-db.sqlite"
    bad.write_bytes(b"this is not a database" * 100)
    llm = ScriptedLLM()
    closed = []

    async def aclose() -> None:
        closed.append(True)

    llm.aclose = aclose  # type: ignore[method-assign]
    with pytest.raises(StartupError, match="cannot open the database"):
        async with running(make_app(llm=llm, env={"AGENTIK_DB_PATH": str(bad)})):
            pass
    assert closed == [True]


@pytest.mark.sqlite_file
async def test_a_stop_after_an_unrecorded_turn_end_is_not_clean(make_agent, tmp_path):
    """A turn whose end could not be written may have run: the next start must treat it as
    cut off (an Error record), never run it again, so the stop is not recorded as clean."""
    import sqlite3

    from agentik.core.records import error_record
    from agentik.core.store import MemoryStore

    class Refusing(MemoryStore):  # a database that refuses every write for good
        async def get_conversation(self, conversation_id):
            raise OSError(28, "No space left on device")

    for unrecorded, expected in ((0, 1), (1, 0)):
        db = str(tmp_path / f"u{unrecorded}.db")
        agent = await make_agent(ScriptedLLM(), db=db)
        for _ in range(unrecorded):
            agent.record_end_later(Refusing(), error_record("conv-x", "msg-x", "lost", "storage"))
        await agent.close()
        with sqlite3.connect(db) as raw:
            rows = raw.execute("SELECT count(*) FROM agent_state WHERE key = 'clean_stop'")
            assert rows.fetchone()[0] == expected


@pytest.mark.sqlite_file
async def test_the_turn_the_disk_filled_under_is_recorded_once_the_disk_is_back(
    make_agent, tmp_path
):
    """A real SQLite "database or disk is full" (the file may not grow) while a turn streams:
    neither its reply nor its Error record can be written. Once the file may grow again the
    Error record is written by itself (not only at the next start), and the turn's state says
    so meanwhile."""
    import sqlite3

    db_path = str(tmp_path / "full.db")
    agent = await make_agent(ScriptedLLM(["x" * 4000] * 10, delay=0.05), db=db_path)
    conv = await agent.create_conversation()
    events = conv.events()
    msg = await conv.send(text("fill it"))
    accepted = await asyncio.wait_for(events.__anext__(), 5)
    first = await asyncio.wait_for(events.__anext__(), 5)  # the turn streams
    assert (accepted.type, first.type) == ("UserMessage", "StartResponse")
    db = agent.store.db
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {pages}")  # the disk is full from now on
    rest = []
    async for event in events:
        rest.append(event)
        if event.type == "End":
            break
    await events.aclose()
    assert [e.type for e in rest[-2:]] == ["Error", "End"]  # listeners are told at once
    assert await conv.turn_state(msg.id) == ("failed", "storage")
    assert agent.unrecorded_ends == 1
    with sqlite3.connect(db_path) as raw:
        kinds = [r[0] for r in raw.execute("SELECT kind FROM message ORDER BY seq")]
    assert kinds == ["user"]
    db.execute("PRAGMA max_page_count = 1073741823")  # space again
    for _ in range(100):
        if not agent.unrecorded_ends:
            break
        await asyncio.sleep(0.05)
    history = await conv.get_messages()
    assert [m.kind for m in history] == ["user", "error"]
    assert history[1].payload["code"] == "storage"
    assert history[1].payload["partialText"] == "x" * 40_000
    assert await conv.turn_state(msg.id) == ("failed", "storage")
    assert agent.unrecorded_ends == 0
    assert await agent.store.list_memory(conv.id) == []  # F2: nothing of a failed turn


async def test_run_turn_returns_its_own_turn_when_another_is_running(make_agent):
    from agentik.core.testing import run_turn

    agent = await make_agent(ScriptedLLM(["first ", "reply"], delay=0.02))
    conv = await agent.create_conversation()
    await conv.send(text("one"))  # still streaming when run_turn sends
    turn = await run_turn(conv, "two")
    assert turn.text == "echo: two"
    assert [m.kind for m in turn.history] == ["user", "assistant", "user", "assistant"]


async def test_turn_events_are_one_sends_own_turn_while_others_queue(make_agent):
    agent = await make_agent(ScriptedLLM(delay=0.01))
    conv = await agent.create_conversation()
    await conv.send(text("first"))  # running or queued ahead of ours
    after = conv.last_event_id
    ours = await conv.send(text("second"))
    await conv.send(text("third"))  # queued behind ours
    items = [item async for item in conv.turn_events(ours.id, after)]
    assert {item.turn_id for item in items} == {ours.id}
    assert [item.event.type for item in items][-1] == "End"
    assert "".join(getattr(i.event, "text", "") for i in items) == "echo: second"
    await conv.wait_idle()


async def test_an_alias_finds_the_same_conversation_after_a_restart(make_agent, tmp_path):
    db = str(tmp_path / "aliases.db")
    agent = await make_agent(db=db)
    first = await agent.aliased_conversation("agui", "thread-1", title="From AG-UI")
    again = await agent.aliased_conversation("agui", "thread-1")
    other = await agent.aliased_conversation("a2a", "thread-1")  # another protocol's name
    assert again is first and other.id != first.id and first.title == "From AG-UI"
    # two first uses at once create one conversation
    racing = await asyncio.gather(*(agent.aliased_conversation("agui", "t2") for _ in range(5)))
    assert len({c.id for c in racing}) == 1
    assert await agent.count_conversations() == 3
    await agent.close()

    agent = await make_agent(db=db)
    assert (await agent.aliased_conversation("agui", "thread-1")).id == first.id
    # the alias goes with its conversation: the next use starts a new one
    await agent.delete_conversation(first.id)
    fresh = await agent.aliased_conversation("agui", "thread-1")
    assert fresh.id != first.id


@pytest.mark.sqlite_file
async def test_a_keyed_send_committed_but_not_confirmed_runs_when_the_client_retries(
    make_agent, monkeypatch
):
    """The fsync after the commit fails: the client gets an error although the message is
    stored. Its retry with the same key finds that message and runs its turn, once."""
    agent = await make_agent(ScriptedLLM())
    conv = await agent.create_conversation()
    db = agent.store.db
    real = db._sync_wal

    def failing_once() -> None:
        monkeypatch.setattr(db, "_sync_wal", real)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(db, "_sync_wal", failing_once)
    with pytest.raises(OSError):
        await conv.send(text("hello"), idempotency_key="k1")
    await conv.wait_idle()
    assert kinds(await conv.get_messages()) == ["user"]  # stored, not run
    retried = await conv.send(text("hello"), idempotency_key="k1")
    await conv.wait_idle()
    msgs = await conv.get_messages()
    assert kinds(msgs) == ["user", "assistant"] and msgs[0].id == retried.id
    again = await conv.send(text("hello"), idempotency_key="k1")  # a third time: nothing
    await conv.wait_idle()
    assert again.id == retried.id and kinds(await conv.get_messages()) == ["user", "assistant"]
