"""Tool approvals (F19, issue 25): the policy (plugins/approvals), a call that waits for a
person's yes, no, or yes with other arguments, two calls of one step answered apart, a timeout,
an interrupt, the sends behind a waiting turn; in process on the HTTP API. A waiting turn across
a kill -9, through the Python client: tests/test_approvals_e2e.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from agentik import hookimpl
from agentik.core.app import AGENT
from agentik.core.approvals import DENIED, Approval
from agentik.core.llm import ToolCallRequest
from agentik.core.testing import ScriptedLLM, make_app
from agentik.core.tools import Tool, ToolSpec, tool
from agentik.core.types import InvalidInput
from agentik_approvals.policy import Policy, parse_policy
from tests.conftest import read_sse

APPROVALS = ("agentik_transport_http", "agentik_approvals")
TEXT = [{"type": "text", "body": "go"}]


@pytest.mark.parametrize(
    ("raw", "policy"),
    [
        ("", Policy()),
        ("off", Policy()),
        ("all", Policy(everything=True)),
        ("destructive", Policy(destructive=True)),
        ("mcp_fs__write_*, memory_delete", Policy(patterns=("mcp_fs__write_*", "memory_delete"))),
        ("destructive,launch", Policy(destructive=True, patterns=("launch",))),
    ],
)
def test_the_policy_is_read_from_the_setting(raw, policy):
    assert parse_policy(raw) == policy
    assert parse_policy(str(policy)) == policy  # what agentik plugins shows reads back


@pytest.mark.parametrize("raw", ["all,launch", "off,launch", "rm -rf", "a" * 65, "x;y"])
def test_a_policy_that_says_nothing_clear_is_refused(raw):
    with pytest.raises(ValueError):
        parse_policy(raw)


def test_which_calls_wait():
    def t(name: str, **flags: bool) -> Tool:
        return Tool(ToolSpec(name, ""), lambda: None, **flags)

    read, wipe, guarded = t("read"), t("wipe", destructive=True), t("g", requires_approval=True)
    off, everything = Policy(), Policy(everything=True)
    some = Policy(destructive=True, patterns=("mcp_fs__write_*",))
    assert [off.holds(x.name, x) for x in (read, wipe, guarded)] == [False, False, True]
    assert [everything.holds(x.name, x) for x in (read, wipe, guarded)] == [True, True, True]
    assert [some.holds(x.name, x) for x in (read, wipe, guarded)] == [False, True, True]
    assert some.holds("mcp_fs__write_file", None) and not some.holds("mcp_fs__read_file", None)


def test_an_answer_is_read_strictly():
    assert Approval.from_json({"approve": True, "args": {"x": 1}}) == Approval(True, None, {"x": 1})
    for bad in (
        {},
        {"approve": "yes"},
        {"approve": False, "args": {"x": 1}},  # args go with an approval
        {"approve": True, "args": [1]},
        {"approve": True, "note": 3},
        {"approve": True, "extra": 1},
        ["approve"],
    ):
        with pytest.raises(InvalidInput):
            Approval.from_json(bad)


class Tools:
    """``launch`` (the policy names it), ``wipe`` (destructive), ``guarded`` (always waits)."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    @hookimpl
    def register_tools(self, register: Any) -> None:
        def launch(target: str) -> str:
            """Launch at a target."""
            self.ran.append(f"launch {target}")
            return f"launched at {target}"

        def wipe() -> str:
            """Wipe everything."""
            self.ran.append("wipe")
            return "wiped"

        register(tool(launch))
        register(Tool(ToolSpec("wipe", "Wipe everything."), wipe, destructive=True))
        register(tool(launch, name="guarded", requires_approval=True))


def call(call_id: str, name: str = "launch", **args: Any) -> ToolCallRequest:
    return ToolCallRequest(call_id, name, json.dumps(args))


async def start(aiohttp_client, *steps: Any, **env: str) -> tuple[Any, Any, Tools]:
    tools = Tools()
    app = make_app(
        llm=ScriptedLLM(*steps),
        plugins=[("tools", tools)],
        builtins=APPROVALS,
        env={"AGENTIK_TOOL_APPROVAL": "launch", **env},
    )
    client = await aiohttp_client(app)
    return client, app[AGENT], tools


async def new_conversation(client) -> str:
    return (await (await client.post("/agentik/conversations")).json())["id"]


async def send(client, cid: str) -> dict[str, Any]:
    r = await client.post(f"/agentik/conversations/{cid}/messages", json=TEXT)
    assert r.status == 202
    return await r.json()


async def pending(client, cid: str) -> list[dict[str, Any]]:
    r = await client.get(f"/agentik/conversations/{cid}/approvals")
    assert r.status == 200
    return (await r.json())["items"]


async def answer(client, cid: str, call_id: str, status: int = 200, **body: Any) -> Any:
    r = await client.post(f"/agentik/conversations/{cid}/approvals/{call_id}", json=body)
    assert r.status == status, await r.text()
    return await r.json()


async def until_waiting(client, cid: str, n: int = 1) -> list[dict[str, Any]]:
    for _ in range(200):
        items = await pending(client, cid)
        if len(items) >= n:
            return items
        await asyncio.sleep(0.01)
    raise AssertionError("never asked")


async def history(client, cid: str) -> list[dict[str, Any]]:
    r = await client.get(f"/agentik/conversations/{cid}/messages", params={"limit": "200"})
    return (await r.json())["items"]


async def test_an_approved_call_runs_and_the_history_says_so(aiohttp_client):
    client, agent, tools = await start(aiohttp_client, [call("c1", target="moon")], ["landed"])
    cid = await new_conversation(client)
    events = await client.get(f"/agentik/conversations/{cid}/events")
    agent_events = await client.get("/agentik/events")
    user = await send(client, cid)
    asked = await read_sse(events, until="ApprovalRequested")
    assert asked[-1]["data"] == {
        "type": "ApprovalRequested",
        "callId": "c1",
        "toolName": "launch",
        "argsJson": '{"target": "moon"}',
        "conversationId": cid,
        "turnId": user["id"],
    }
    seen = await read_sse(agent_events, until="ApprovalRequested")  # one dashboard sees all
    assert seen[-1]["data"]["conversationId"] == cid
    agent_events.close()
    [item] = await pending(client, cid)
    assert (item["callId"], item["toolName"], item["turnId"]) == ("c1", "launch", user["id"])
    assert tools.ran == [] and not agent.live_conversation(cid).inbox.running
    assert await answer(client, cid, "c1", approve=True) == {
        "callId": "c1",
        "status": "approved",
        "turn": "running",
    }
    rest = await read_sse(events, until="End")
    events.close()
    assert rest[0]["data"]["type"] == "Waiting" and rest[0]["data"]["turnId"] == user["id"]
    assert [(w["callId"], w["kind"]) for w in rest[0]["data"]["waits"]] == [("c1", "approval")]
    assert [f["event"] for f in rest if f["event"] != "AppendText"] == [
        "Waiting",
        "ToolResult",
        "StartResponse",
        "End",
    ]
    assert tools.ran == ["launch moon"] and await pending(client, cid) == []
    records = [(m["type"], m.get("status")) for m in await history(client, cid)]
    assert records == [
        ("user", None),
        ("tool_call", None),
        ("approval", "pending"),
        ("approval", "approved"),
        ("tool_result", None),
        ("assistant", None),
    ]
    await answer(client, cid, "c1", 409, approve=True)  # answered: nothing waits for it


async def test_a_denied_call_never_runs_and_the_model_is_told_why(aiohttp_client):
    client, agent, tools = await start(aiohttp_client, [call("c1", target="moon")], ["ok"])
    cid = await new_conversation(client)
    await send(client, cid)
    await until_waiting(client, cid)
    await answer(client, cid, "c1", approve=False, note="not the moon")
    await agent.live_conversation(cid).wait_idle()
    assert tools.ran == []
    records = await history(client, cid)
    [result] = [m for m in records if m["type"] == "tool_result"]  # what the model reads
    assert (result["text"], result["isError"]) == (f"{DENIED}: not the moon", True)
    denied = [m for m in records if m.get("status") == "denied"]
    assert denied[0]["note"] == "not the moon"


async def test_a_person_may_run_the_call_with_other_arguments(aiohttp_client):
    client, agent, tools = await start(aiohttp_client, [call("c1", target="moon")], ["ok"])
    cid = await new_conversation(client)
    await send(client, cid)
    await until_waiting(client, cid)
    bad = await answer(client, cid, "c1", 400, approve=True, args={"target": 3})
    assert "target" in bad["error"]["message"]
    assert len(await pending(client, cid)) == 1  # nothing was stored: it still waits
    await answer(client, cid, "c1", approve=True, args={"target": "mars"})
    await agent.live_conversation(cid).wait_idle()
    assert tools.ran == ["launch mars"]
    [approved] = [m for m in await history(client, cid) if m.get("status") == "approved"]
    assert json.loads(approved["argsJson"]) == {"target": "moon"}  # the model's, kept
    assert json.loads(approved["editedArgsJson"]) == {"target": "mars"}


async def test_two_calls_of_one_step_are_answered_apart(aiohttp_client):
    steps = [call("a", target="moon"), call("b", target="sun"), call("c", "wipe")]
    client, agent, tools = await start(
        aiohttp_client, steps, ["done"], AGENTIK_TOOL_APPROVAL="launch,destructive"
    )
    cid = await new_conversation(client)
    await send(client, cid)
    items = await until_waiting(client, cid, 3)
    assert [i["callId"] for i in items] == ["a", "b", "c"]
    assert (await answer(client, cid, "b", approve=False))["turn"] == "waiting"
    assert (await answer(client, cid, "c", approve=True))["turn"] == "waiting"
    assert tools.ran == []  # the step goes on only once every call is answered
    assert [i["callId"] for i in await pending(client, cid)] == ["a"]
    assert (await answer(client, cid, "a", approve=True))["turn"] == "running"
    await agent.live_conversation(cid).wait_idle()
    assert tools.ran == ["launch moon", "wipe"]


async def test_a_tool_that_requires_approval_waits_whatever_the_policy(aiohttp_client):
    client, _, _ = await start(
        aiohttp_client, [call("g", "guarded", target="x")], ["ok"], AGENTIK_TOOL_APPROVAL="off"
    )
    cid = await new_conversation(client)
    await send(client, cid)
    [item] = await until_waiting(client, cid)
    assert item["toolName"] == "guarded"


@pytest.mark.parametrize("temp", [False, True], ids=["stored", "temporary"])
async def test_an_unanswered_request_is_denied_after_the_timeout(aiohttp_client, temp):
    client, agent, tools = await start(
        aiohttp_client, [call("c1", target="moon")], ["ok"], AGENTIK_APPROVAL_TIMEOUT="0.3"
    )
    r = await client.post("/agentik/conversations", json={"temp": temp})
    cid = (await r.json())["id"]
    await send(client, cid)
    await until_waiting(client, cid)
    conv = agent.live_conversation(cid)
    for _ in range(300):
        if (await history(client, cid))[-1]["type"] == "assistant":
            break
        await asyncio.sleep(0.02)
    assert tools.ran == [] and await pending(client, cid) == []
    [denied] = [m for m in await history(client, cid) if m.get("status") == "denied"]
    assert denied["reason"] == "timeout"
    [result] = [m for m in await history(client, cid) if m["type"] == "tool_result"]
    assert result["text"] == f"{DENIED}: no one answered in time"
    assert not conv.busy


async def test_an_interrupt_ends_the_wait_and_the_sends_behind_it_run(aiohttp_client):
    client, agent, tools = await start(aiohttp_client, [call("c1", target="moon")])
    cid = await new_conversation(client)
    await send(client, cid)
    await until_waiting(client, cid)
    await send(client, cid)  # queued behind the waiting turn
    await asyncio.sleep(0.05)
    assert [m["type"] for m in await history(client, cid)][-1] == "user"  # it waits too
    r = await client.post(f"/agentik/conversations/{cid}/interrupt")
    assert (await r.json()) == {"interrupted": True}
    await agent.live_conversation(cid).wait_idle()
    kinds = [m["type"] for m in await history(client, cid)]
    assert kinds[-3:] == ["tool_result", "assistant", "assistant"]  # cut, then the next turn
    assert tools.ran == [] and await pending(client, cid) == []
    await answer(client, cid, "c1", 409, approve=True)


async def test_approvals_of_a_missing_conversation_or_call_are_404(aiohttp_client):
    client, _, _ = await start(aiohttp_client)
    cid = await new_conversation(client)
    assert await pending(client, cid) == []
    await answer(client, cid, "nope", 404, approve=True)
    r = await client.get("/agentik/conversations/conv-nope/approvals")
    assert r.status == 404


async def test_run_turn_returns_at_the_wait_and_the_answer_finishes_the_turn():
    """A plugin author's test: ``run_turn`` stops at the turn's ``Waiting`` (it does not hang to
    its timeout), and after the approval the rest of the turn comes as usual."""
    from agentik.core.testing import run_turn, started_agent

    tools = Tools()
    async with started_agent(
        llm=ScriptedLLM([call("c1", target="moon")], ["launched"]),
        plugins=[("tools", tools)],
        builtins=APPROVALS,
        env={"AGENTIK_TOOL_APPROVAL": "launch"},
    ) as agent:
        turn = await run_turn(agent, "go")
        assert turn.waiting and turn.types[-2:] == ["ApprovalRequested", "Waiting"]
        assert tools.ran == []
        conv = turn.conversation
        await conv.approve("c1")
        await asyncio.wait_for(conv.wait_idle(), 10)
        assert tools.ran == ["launch moon"]
        last = (await conv.get_messages(limit=100))[-1]
        assert last.kind == "assistant" and last.payload["text"] == "launched"
