"""The AG-UI endpoint in-process over real loopback HTTP: reconciliation of a client's messages
with the agent's history, the snapshot policy, context, refusals, and the way every stream ends
(End, interrupt, error, lost events, a log closed by shutdown). Every stream is also checked by
``ag-ui-validate`` (PyPI). ``tests/test_agui_e2e.py`` drives ``agentik serve`` with the real
``@ag-ui/client``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from ag_ui_validate.pytest_plugin import assert_valid_agui

from agentik import hookimpl
from agentik.core.app import AGENT, SETTINGS
from agentik.core.llm import LLMError, ReasoningDelta, ToolCallRequest, Usage
from agentik.core.testing import ScriptedLLM, make_app
from agentik.core.tools import tool
from agentik.core.types import AppendText, End, Gap, StartResponse

AGUI = ("agentik_transport_agui", "agentik_approvals")


@tool
def add(a: int, b: int = 0) -> str:
    """Add two numbers."""
    return str(a + b)


class AddTool:
    @hookimpl
    def register_tools(self, register: Any) -> None:
        register(add)


@pytest.fixture
def make_client(aiohttp_client: Any, tmp_path: Any) -> Any:
    async def make(llm: ScriptedLLM | None = None, **env: str) -> Any:
        env = {"AGENTIK_DB_PATH": str(tmp_path / "a.db"), **env}
        app = make_app(
            llm=llm or ScriptedLLM(), plugins=[("add", AddTool())], builtins=AGUI, env=env
        )
        return await aiohttp_client(app)

    return make


def run_input(thread: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "threadId": thread,
        "runId": extra.pop("runId", "run-1"),
        "messages": messages,
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {},
        **extra,
    }


def user(mid: str, text: str) -> dict[str, Any]:
    return {"id": mid, "role": "user", "content": text}


def image(data: str, mime: str | None) -> dict[str, Any]:
    source = {"type": "data", "value": data, **({"mimeType": mime} if mime else {})}
    return {"id": "u", "role": "user", "content": [{"type": "image", "source": source}]}


async def read_events(resp: Any) -> list[dict[str, Any]]:
    """Every event of an AG-UI SSE response, each checked to be one ``data:`` frame."""
    assert resp.status == 200, await resp.text()
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    body = await asyncio.wait_for(resp.text(), 10)
    frames = [f for f in body.split("\n\n") if f]
    assert all(f.startswith("data: ") for f in frames), body
    return [json.loads(f.removeprefix("data: ")) for f in frames]


async def run(client: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
    events = await read_events(await client.post("/agui", json=body))
    assert_valid_agui(events, max_warnings=0)  # ag-ui-validate: no error, no warning
    return events


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


async def test_a_text_turn_streams_as_one_run(make_client: Any) -> None:
    client = await make_client(ScriptedLLM(["Hel", "lo", Usage(3, 2)]))
    events = await run(client, run_input("t-1", [user("u-1", "hi")]))
    assert types(events) == [
        "RUN_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    started = events[0]
    assert started["threadId"] == "t-1" and started["runId"] == "run-1"
    assert started["protocolVersion"] == "1.0"
    assert text_of(events) == "Hello"
    assert events[-1] == {"type": "RUN_FINISHED", "threadId": "t-1", "runId": "run-1"}


async def test_the_thread_is_one_durable_conversation_and_only_new_messages_are_sent(
    make_client: Any,
) -> None:
    llm = ScriptedLLM()
    client = await make_client(llm)
    first = await run(client, run_input("t-2", [user("u-1", "one")]))
    reply = text_of(first)
    assert reply == "echo: one"
    # the client sends its whole history; only the new message at the end is new input
    history = [
        user("u-1", "one"),
        {"id": first[1]["messageId"], "role": "assistant", "content": reply},
        user("u-2", "two"),
    ]
    second = await run(client, run_input("t-2", history, runId="run-2"))
    assert "MESSAGES_SNAPSHOT" not in types(second)  # the client is in step with the agent
    assert text_of(second) == "echo: two"
    agent = client.server.app[AGENT]
    convs = await agent.list_conversations()
    assert len(convs) == 1  # one thread, one conversation
    records = await (await agent.get_conversation(convs[0].id)).get_messages()
    assert [r.kind for r in records] == ["user", "assistant", "user", "assistant"]
    assert len(llm.conversations) == 1  # the agent's own history, not the client's, was used


async def test_a_new_thread_with_prior_history_gets_a_snapshot_of_what_the_agent_has(
    make_client: Any,
) -> None:
    client = await make_client()
    prior = [
        user("old-1", "from another backend"),
        {"id": "a-0", "role": "assistant", "content": "x"},
    ]
    events = await run(client, run_input("t-3", [*prior, user("u-1", "hello")]))
    snapshot = events[1]
    assert snapshot["type"] == "MESSAGES_SNAPSHOT"
    # the prior messages are not imported: the snapshot shows only the new message
    assert snapshot["messages"] == [{"id": "u-1", "role": "user", "content": "hello"}]
    assert text_of(events) == "echo: hello"


async def test_a_run_without_a_new_message_answers_with_the_whole_thread(make_client: Any) -> None:
    client = await make_client(ScriptedLLM([ToolCallRequest("c-1", "add", '{"a": 1}')], ["done"]))
    await run(client, run_input("t-4", [user("u-1", "add")]))
    events = await run(client, run_input("t-4", [], runId="reconnect"))
    assert types(events) == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    messages = events[1]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[0]["id"] == "u-1"
    call = messages[1]["toolCalls"][0]
    assert call["function"] == {"name": "add", "arguments": '{"a": 1}'}
    assert messages[2]["toolCallId"] == call["id"] and messages[3]["content"] == "done"


async def test_context_reaches_the_model_but_not_the_snapshot(make_client: Any) -> None:
    llm = ScriptedLLM()
    client = await make_client(llm)
    context = [{"description": "the page the user is on", "value": "/settings"}]
    await run(client, run_input("t-5", [user("u-1", "where am I?")], context=context))
    sent = llm.received[0][0].text
    assert "the page the user is on: /settings" in sent and sent.endswith("where am I?")
    events = await run(client, run_input("t-5", [], runId="r2"))
    assert events[1]["messages"][0] == {"id": "u-1", "role": "user", "content": "where am I?"}


async def test_a_retried_run_does_not_send_its_message_twice(make_client: Any) -> None:
    llm = ScriptedLLM()
    client = await make_client(llm)
    body = run_input("t-6", [user("u-1", "once")])
    await run(client, body)
    again = await run(client, body)
    assert types(again) == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    assert [m["role"] for m in again[1]["messages"]] == ["user", "assistant"]
    assert len(llm.received) == 1


async def test_reasoning_and_tool_calls_map_to_their_events(make_client: Any) -> None:
    llm = ScriptedLLM([ReasoningDelta("think"), ToolCallRequest("c-1", "add", '{"a": 2}')], ["two"])
    client = await make_client(llm)
    events = await run(client, run_input("t-7", [user("u-1", "go")]))
    assert types(events) == [
        "RUN_STARTED",
        "REASONING_START",
        "REASONING_MESSAGE_START",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_END",
        "REASONING_END",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    start, result = events[6], events[9]
    assert start["toolCallName"] == "add" and result["toolCallId"] == start["toolCallId"]


async def test_an_llm_error_ends_the_run_with_run_error(make_client: Any) -> None:
    client = await make_client(ScriptedLLM(LLMError("the model is down", "unavailable")))
    events = await run(client, run_input("t-8", [user("u-1", "hi")]))
    assert types(events) == ["RUN_STARTED", "RUN_ERROR"]
    assert events[-1]["message"] == "the model is down" and events[-1]["code"] == "unavailable"


async def test_an_interrupted_turn_finishes_the_run_as_cancelled(make_client: Any) -> None:
    client = await make_client(ScriptedLLM(["a"] * 200, delay=0.02))
    resp = await client.post("/agui", json=run_input("t-9", [user("u-1", "long")]))
    agent = client.server.app[AGENT]
    first = await resp.content.readuntil(b"\n\n")
    assert b"RUN_STARTED" in first
    conv = await agent.aliased_conversation("agui", "t-9")
    while not conv.busy:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    assert conv.interrupt()
    events = [json.loads(first.decode().removeprefix("data: "))] + await read_events(resp)
    assert_valid_agui(events, max_warnings=0)
    assert types(events)[-2:] == ["TEXT_MESSAGE_END", "RUN_FINISHED"]
    assert events[-1]["outcome"] == {"type": "cancelled"}


async def test_a_second_run_on_a_busy_thread_queues_and_streams_only_its_turn(
    make_client: Any,
) -> None:
    client = await make_client(ScriptedLLM(["slow "] * 20, ["fast"], delay=0.01))
    first = asyncio.create_task(run(client, run_input("t-10", [user("u-1", "a")])))
    await asyncio.sleep(0.05)
    # the second message's UserMessage comes on the conversation's stream while the first run
    # streams: no run shows it, both stay valid (run() checks them with ag-ui-validate)
    second = await run(client, run_input("t-10", [user("u-2", "b")], runId="run-2"))
    assert text_of(second) == "fast"
    assert text_of(await first) == "slow " * 20


async def test_a_log_closed_without_end_ends_the_run_with_run_error(make_client: Any) -> None:
    client = await make_client(ScriptedLLM(["a"] * 100, delay=0.02))
    resp = await client.post("/agui", json=run_input("t-11", [user("u-1", "x")]))
    await resp.content.readuntil(b"TEXT_MESSAGE_CONTENT")
    client.server.app[AGENT].end_streams()  # what shutdown does to every live stream
    rest = await asyncio.wait_for(resp.text(), 10)
    events = [json.loads(f.removeprefix("data: ")) for f in rest.split("\n\n")[1:] if f]
    assert [e["type"] for e in events][-2:] == ["TEXT_MESSAGE_END", "RUN_ERROR"]
    assert events[-1]["code"] == "shutdown"


async def test_the_client_leaving_does_not_stop_the_turn(make_client: Any) -> None:
    client = await make_client(ScriptedLLM(["a"] * 30, delay=0.01))
    resp = await client.post("/agui", json=run_input("t-12", [user("u-1", "x")]))
    await resp.content.readuntil(b"TEXT_MESSAGE_CONTENT")
    resp.close()
    conv = await client.server.app[AGENT].aliased_conversation("agui", "t-12")
    await asyncio.wait_for(conv.wait_idle(), 10)
    records = await conv.get_messages()
    assert records[-1].kind == "assistant" and records[-1].payload["text"] == "a" * 30


#: a run that ends on a tool call waiting for an answer
ASKED = ["RUN_STARTED", "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "RUN_FINISHED"]


def tool_call_of(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The tool call a run streamed, as the client keeps it (an assistant message)."""
    start = next(e for e in events if e["type"] == "TOOL_CALL_START")
    args = "".join(e["delta"] for e in events if e["type"] == "TOOL_CALL_ARGS")
    call = {"id": start["toolCallId"], "type": "function"}
    call["function"] = {"name": start["toolCallName"], "arguments": args}
    return {"id": "a-1", "role": "assistant", "toolCalls": [call]}


async def test_an_approval_ends_the_run_with_an_interrupt_and_the_resume_continues_the_turn(
    make_client: Any,
) -> None:
    llm = ScriptedLLM([ToolCallRequest("c-1", "add", '{"a": 2, "b": 3}')], ["it is 5"])
    client = await make_client(llm, AGENTIK_TOOL_APPROVAL="add")
    asked = await run(client, run_input("t-ap", [user("u-1", "add 2 and 3")]))
    assert types(asked) == ASKED
    (interrupt,) = asked[-1]["outcome"]["interrupts"]
    assert asked[-1]["outcome"]["type"] == "interrupt"
    assert interrupt["id"] == interrupt["toolCallId"] == "c-1"
    assert interrupt["reason"] == "tool_approval"
    assert interrupt["metadata"] == {"toolName": "add", "argsJson": '{"a": 2, "b": 3}'}
    conv = await client.server.app[AGENT].aliased_conversation("agui", "t-ap")
    assert [a.call_id for a in await conv.approvals()] == ["c-1"]  # durable, no task holds it

    # a reconnect while it waits learns what waits
    again = await run(client, run_input("t-ap", [], runId="r-again"))
    assert types(again) == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    assert again[-1]["outcome"] == asked[-1]["outcome"]
    # a new message cannot overtake the waiting turn from AG-UI
    resp = await client.post("/agui", json=run_input("t-ap", [user("u-2", "hm")], runId="r-x"))
    assert resp.status == 409 and (await resp.json())["error"]["code"] == "turn_waiting"
    # a bad answer (arguments that do not fit the tool) is refused, nothing is answered
    messages = [user("u-1", "add 2 and 3"), tool_call_of(asked)]
    bad = {"interruptId": "c-1", "status": "resolved", "payload": {"approve": True, "args": {}}}
    resp = await client.post("/agui", json=run_input("t-ap", messages, resume=[bad]))
    assert resp.status == 400 and "args do not fit add" in (await resp.json())["error"]["message"]

    edited = {"approve": True, "args": {"a": 2, "b": 4}}
    resume = [{"interruptId": "c-1", "status": "resolved", "payload": edited}]
    done = await run(client, run_input("t-ap", messages, runId="r-2", resume=resume))
    assert types(done)[:3] == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "TOOL_CALL_RESULT"]
    assert done[2]["toolCallId"] == "c-1" and done[2]["content"] == "6"  # the person's args
    assert text_of(done) == "it is 5" and done[-1]["type"] == "RUN_FINISHED"
    assert "outcome" not in done[-1]
    records = await conv.get_messages()
    approval = [r.payload for r in records if r.kind == "approval"][-1]
    assert approval["status"] == "approved" and approval["editedArgsJson"] == '{"a": 2, "b": 4}'
    # answered: a second resume is a conflict
    resp = await client.post("/agui", json=run_input("t-ap", messages, resume=resume))
    assert resp.status == 409 and (await resp.json())["error"]["code"] == "not_waiting"


async def test_a_cancelled_interrupt_denies_and_two_calls_are_two_interrupts(
    make_client: Any,
) -> None:
    calls = [ToolCallRequest("c-1", "add", '{"a": 1}'), ToolCallRequest("c-2", "add", '{"a": 2}')]
    llm = ScriptedLLM(calls, ["one denied"])
    client = await make_client(llm, AGENTIK_TOOL_APPROVAL="all")
    asked = await run(client, run_input("t-two", [user("u-1", "go")]))
    interrupts = asked[-1]["outcome"]["interrupts"]
    assert [i["id"] for i in interrupts] == ["c-1", "c-2"]
    # one answer: the run ends at once, on what still waits
    yes = {"interruptId": "c-1", "status": "resolved", "payload": True}
    half = await run(client, run_input("t-two", [], runId="r-2", resume=[yes]))
    assert types(half) == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    assert [i["id"] for i in half[-1]["outcome"]["interrupts"]] == ["c-2"]
    no = {"interruptId": "c-2", "status": "cancelled"}
    done = await run(client, run_input("t-two", [], runId="r-3", resume=[no]))
    results = [e for e in done if e["type"] == "TOOL_CALL_RESULT"]
    assert [r["content"] for r in results] == [
        "1",
        "Error: a person denied this call: cancelled in the front end",
    ]
    assert text_of(done) == "one denied"


async def test_a_resume_without_a_waiting_turn_or_for_an_unknown_interrupt_is_refused(
    make_client: Any,
) -> None:
    client = await make_client(
        ScriptedLLM([ToolCallRequest("c-1", "add", '{"a": 1}')]), AGENTIK_TOOL_APPROVAL="all"
    )
    resume = [{"interruptId": "c-1", "status": "resolved"}]
    resp = await client.post("/agui", json=run_input("t-none", [], resume=resume))
    assert resp.status == 409 and (await resp.json())["error"]["code"] == "not_waiting"
    await run(client, run_input("t-unk", [user("u-1", "go")]))
    unknown = [{"interruptId": "nope", "status": "resolved"}]
    resp = await client.post("/agui", json=run_input("t-unk", [], resume=unknown))
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "unknown_interrupt"


CONFIRM = {
    "name": "confirm",
    "description": "Ask the user to confirm",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
}


def tool_result(call_id: str, content: str) -> dict[str, Any]:
    return {"id": f"r-{call_id}", "role": "tool", "toolCallId": call_id, "content": content}


async def test_a_client_tool_is_offered_its_call_ends_the_run_and_its_result_continues_the_turn(
    make_client: Any,
) -> None:
    llm = ScriptedLLM([ToolCallRequest("c-1", "confirm", '{"q": "ok?"}')], ["thanks"], ["plain"])
    # approvals for every call: a client's tool is the client's to run, it asks no approval
    client = await make_client(llm, AGENTIK_TOOL_APPROVAL="all")
    asked = await run(client, run_input("t-ct", [user("u-1", "go")], tools=[CONFIRM]))
    assert llm.offered[-1] == ["add", "confirm"]  # beside the agent's own tools
    assert types(asked) == ASKED
    assert asked[-1]["outcome"] == {"type": "success", "pendingToolCallIds": ["c-1"]}
    conv = await client.server.app[AGENT].aliased_conversation("agui", "t-ct")
    turn = await conv.waiting_turn()
    assert turn is not None and [(w.call_id, w.kind) for w in turn.waits] == [
        ("c-1", "client_tool")
    ]
    assert await conv.approvals() == []

    messages = [user("u-1", "go"), tool_call_of(asked), tool_result("c-1", "yes, go on")]
    done = await run(client, run_input("t-ct", messages, runId="r-2", tools=[CONFIRM]))
    assert types(done)[:3] == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "TOOL_CALL_RESULT"]
    assert done[2]["toolCallId"] == "c-1" and done[2]["content"] == "yes, go on"
    assert text_of(done) == "thanks" and "outcome" not in done[-1]
    records = await conv.get_messages()
    result = next(r.payload for r in records if r.kind == "tool_result")
    assert (result["callId"], result["text"], result["isError"]) == ("c-1", "yes, go on", False)
    # the same result again (a retried run) answers nothing: the thread as it is
    again = await run(client, run_input("t-ct", messages, runId="r-3"))
    assert types(again) == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    # the next turn, without tools from the client, is offered the agent's own only
    history = [*messages, {"id": "a-2", "role": "assistant", "content": "thanks"}]
    await run(client, run_input("t-ct", [*history, user("u-2", "more")], runId="r-4"))
    assert llm.offered[-1] == ["add"]


async def test_a_step_with_a_client_tool_and_an_approval_needs_both_answers(
    make_client: Any,
) -> None:
    calls = [ToolCallRequest("c-1", "confirm", "{}"), ToolCallRequest("c-2", "add", '{"a": 1}')]
    client = await make_client(ScriptedLLM(calls, ["both done"]), AGENTIK_TOOL_APPROVAL="add")
    asked = await run(client, run_input("t-both", [user("u-1", "go")], tools=[CONFIRM]))
    outcome = asked[-1]["outcome"]  # it asks: the interrupt outcome, for the approval only
    assert outcome["type"] == "interrupt" and [i["id"] for i in outcome["interrupts"]] == ["c-2"]
    history = [user("u-1", "go"), {"id": "a-1", "role": "assistant", "toolCalls": []}]
    # the result alone: the run ends at once, on the approval still open
    result = tool_result("c-1", "confirmed")
    half = await run(client, run_input("t-both", [*history, result], runId="r-2"))
    assert types(half) == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    assert [i["id"] for i in half[-1]["outcome"]["interrupts"]] == ["c-2"]
    yes = [{"interruptId": "c-2", "status": "resolved", "payload": {"approve": True}}]
    done = await run(client, run_input("t-both", [*history, result], runId="r-3", resume=yes))
    results = [(e["toolCallId"], e["content"]) for e in done if e["type"] == "TOOL_CALL_RESULT"]
    assert results == [("c-1", "confirmed"), ("c-2", "1")]
    assert text_of(done) == "both done"


async def test_a_client_tool_call_waits_across_a_restart(make_client: Any) -> None:
    first = await make_client(ScriptedLLM([ToolCallRequest("c-1", "confirm", "{}")]))
    asked = await run(first, run_input("t-rs", [user("u-1", "go")], tools=[CONFIRM]))
    assert asked[-1]["outcome"]["pendingToolCallIds"] == ["c-1"]
    await first.close()
    llm = ScriptedLLM(["after the restart"])
    second = await make_client(llm)  # the same database
    messages = [user("u-1", "go"), tool_call_of(asked), tool_result("c-1", "done")]
    done = await run(second, run_input("t-rs", messages, runId="r-2"))
    assert text_of(done) == "after the restart"
    assert llm.offered[-1] == ["add", "confirm"]  # the turn's tools, kept with it


async def test_front_end_tools_in_a_message_another_door_sent_are_not_offered(
    make_client: Any,
) -> None:
    """The AG-UI endpoint keeps a run's tools in its message's metadata; the same metadata sent
    through another door (here in process, as the HTTP API would) offers nothing, so no turn
    waits for a front end that is not there."""
    from agentik.core.types import MessageContext, TextPart, Via

    llm = ScriptedLLM(["no tools of a front end"])
    client = await make_client(llm)
    conv = await client.app[AGENT].create_conversation()
    context = MessageContext(metadata={"agui": {"tools": [CONFIRM]}})
    await conv.send([TextPart("go")], context, via=Via("http"))
    await asyncio.wait_for(conv.wait_idle(), 10)
    assert llm.offered[-1] == ["add"]


async def test_an_error_result_from_the_client_reaches_the_model_as_an_error(
    make_client: Any,
) -> None:
    llm = ScriptedLLM([ToolCallRequest("c-1", "confirm", "{}")], ["sorry"])
    client = await make_client(llm)
    asked = await run(client, run_input("t-err", [user("u-1", "go")], tools=[CONFIRM]))
    failed = {**tool_result("c-1", ""), "error": "the user closed the dialog"}
    done = await run(client, run_input("t-err", [user("u-1", "go"), tool_call_of(asked), failed]))
    result = next(e for e in done if e["type"] == "TOOL_CALL_RESULT")
    assert result["content"] == "the user closed the dialog"
    conv = await client.server.app[AGENT].aliased_conversation("agui", "t-err")
    records = await conv.get_messages()
    assert next(r.payload for r in records if r.kind == "tool_result")["isError"] is True


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (
            run_input("t", [user("u", "x")], tools=[{"name": "add", "description": "mine"}]),
            "client_tool_conflict",  # the agent's own tool has that name
        ),
        (
            run_input("t", [user("u", "x")], tools=[{"name": "a b", "description": "d"}]),
            "invalid_request",
        ),
        ({"threadId": "t"}, "invalid_request"),
        (run_input("t", [user("u", "")]), "invalid_request"),
        (run_input("t" * 256, [user("u", "x")]), "invalid_request"),  # names it for good
        (run_input("t", [image("not base64!", "image/png")]), "invalid_request"),
        (run_input("t", [image("aGk=", "text/html")]), "invalid_request"),
        (run_input("t", [image("aGk=", None)]), "invalid_request"),
    ],
)
async def test_bad_input_is_refused_before_anything_runs(
    make_client: Any, body: Any, code: str
) -> None:
    client = await make_client()
    resp = await client.post("/agui", json=body)
    assert resp.status == 400
    assert (await resp.json())["error"]["code"] == code
    assert await client.server.app[AGENT].list_conversations() == []


@pytest.mark.parametrize(
    "raw",
    [
        # read as infinity by Python: stored, it would come back as Infinity, which no
        # JSON.parse reads
        json.dumps(run_input("t", [user("u", "x")], state={"n": 1.0})).replace("1.0", "1e999"),
        json.dumps(run_input("t", [user("u", "x")], forwardedProps={"n": 1})).replace(
            '"n": 1', '"n": NaN'
        ),
        # only http(s) and data: images reach the model
        json.dumps(
            run_input(
                "t",
                [
                    {
                        "id": "u",
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {
                                    "type": "url",
                                    "value": "file:///etc/passwd",
                                    "mimeType": "image/png",
                                },
                            }
                        ],
                    }
                ],
            )
        ),
    ],
)
async def test_bodies_no_json_reader_takes_back_are_refused(make_client: Any, raw: str) -> None:
    llm = ScriptedLLM()
    llm.capabilities = {"image_input": True}
    client = await make_client(llm)
    resp = await client.post("/agui", data=raw, headers={"Content-Type": "application/json"})
    assert resp.status == 400, await resp.text()
    assert (await resp.json())["error"]["code"] == "invalid_request"
    assert await client.server.app[AGENT].list_conversations() == []
    assert llm.received == []


async def test_the_path_is_configurable_and_the_api_key_applies(make_client: Any) -> None:
    key = "k" * 20
    client = await make_client(AGENTIK_AGUI_PATH="/copilot", AGENTIK_API_KEY=key)
    body = run_input("t-13", [user("u-1", "hi")])
    assert (await client.post("/copilot", json=body)).status == 401
    resp = await client.post("/copilot", json=body, headers={"Authorization": f"Bearer {key}"})
    assert text_of(await read_events(resp)) == "echo: hi"


def test_lost_events_close_what_is_open_and_end_with_one_run_error() -> None:
    from agentik_transport_agui.translate import RunTranslator

    run = RunTranslator("t", "r", "turn")
    out = run.feed(StartResponse()) + run.feed(AppendText("x")) + run.feed(Gap(5))
    assert [e.type.value for e in out] == [
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_ERROR",
    ]
    assert run.ended and out[-1].code == "events_lost"


def test_deltas_that_arrive_together_become_one_content_event() -> None:
    from agentik_transport_agui.translate import RunTranslator

    run = RunTranslator("t", "r", "turn")
    events = [StartResponse(), AppendText("a"), AppendText("b"), AppendText("c"), End()]
    out = run.feed_all([*events, AppendText("after the end")])
    assert [e.type.value for e in out] == [
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    assert out[1].delta == "abc" and run.ended


async def test_without_the_protocol_package_the_server_runs_without_the_route(
    make_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agentik_transport_agui as plugin

    monkeypatch.setattr(plugin, "protocol_installed", lambda: False)
    client = await make_client()
    assert (await client.post("/agui", json=run_input("t", [user("u", "x")]))).status == 404
    settings = client.server.app[SETTINGS]
    assert plugin.banner_lines(settings) == [plugin.MISSING]
    assert "pip install 'agentik-runtime[agui]'" in plugin.MISSING
