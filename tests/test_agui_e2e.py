"""The AG-UI endpoint end to end: the real ``@ag-ui/client`` (npm, ``tests/agui``) runs
``HttpAgent.runAgent`` against ``agentik serve`` with the fake OpenAI server. The client throws
on any protocol violation; every stream it read is also checked by ``ag-ui-validate`` (PyPI)."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from ag_ui_validate.pytest_plugin import assert_valid_agui

from tests.conftest import ROOT, free_port, script_fake

CLIENT = ROOT / "tests" / "agui"
pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or not (CLIENT / "node_modules" / "@ag-ui" / "client").is_dir(),
    reason="needs node and `npm ci --prefix tests/agui` (make test does both)",
)
KEY = "agui-test-key-0123456789"


async def run_client(url: str, runs: list[dict[str, Any]], **config: Any) -> list[dict[str, Any]]:
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(CLIENT / "run.mjs"),
        json.dumps({"url": url, "runs": runs, **config}),
        cwd=CLIENT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    results: list[dict[str, Any]] = json.loads(out)
    for result in results:  # the bytes the client read, checked by ag-ui-validate too
        frames = [f for f in result["raw"].split("\n\n") if f]
        assert all(f.startswith("data: ") for f in frames), result["raw"]
        assert_valid_agui([json.loads(f.removeprefix("data: ")) for f in frames], max_warnings=0)
    return results


def user(mid: str, text: str) -> dict[str, Any]:
    return {"id": mid, "role": "user", "content": text}


def kinds(result: dict[str, Any]) -> list[str]:
    return [e["type"] for e in result["events"]]


def text_of(result: dict[str, Any]) -> str:
    return "".join(e["delta"] for e in result["events"] if e["type"] == "TEXT_MESSAGE_CONTENT")


def start(serve: Any, fake: str, tmp_path: Path, **env: str) -> tuple[str, str, Any]:
    """``agentik serve`` with the fake LLM and the time MCP server as its tool, plus ``env``."""
    config = tmp_path / "mcp.json"
    time_server = {"command": sys.executable, "args": ["-m", "mcp_server_time"]}
    config.write_text(json.dumps({"mcpServers": {"time": time_server}}))
    proc, base = serve(
        {
            "OPENAI_BASE_URL": fake,
            "OPENAI_API_KEY": "fake",
            "OPENAI_MODEL": "fake-model",
            "AGENTIK_MCP_CONFIG": str(config),
            **env,
        }
    )
    proc.wait_output("tokens:", timeout=30)  # the banner: the MCP server is up
    assert "/agui" in proc.output
    return base, fake, proc


@pytest.fixture
def agentik(serve: Any, fake_openai_proc: str, tmp_path: Path) -> tuple[str, str, Any]:
    """``agentik serve`` with the time tool and an API key."""
    return start(serve, fake_openai_proc, tmp_path, AGENTIK_API_KEY=KEY)


AUTH = {"headers": {"Authorization": f"Bearer {KEY}"}}
#: a run that ends on a tool call waiting for an answer
ASKED = ["RUN_STARTED", "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "RUN_FINISHED"]


async def busy_conversation(base: str) -> str:
    """The id of the conversation running a turn, once one streams text (polled)."""
    async with aiohttp.ClientSession(headers=AUTH["headers"]) as s:
        for _ in range(300):
            async with s.get(f"{base}/agentik/conversations") as r:
                busy = [c["id"] for c in (await r.json())["items"] if c["busy"]]
            if busy:
                await asyncio.sleep(0.3)  # into the reply's text
                return busy[0]
            await asyncio.sleep(0.05)
    raise AssertionError("no turn started")


async def test_the_real_client_through_every_way_a_run_ends(
    agentik: tuple[str, str, Any],
) -> None:
    """Plain text, a tool round, an LLM error, a reconnect, two runs on one thread, an
    interrupt and a shutdown, each run by ``HttpAgent.runAgent`` (one server: its start-up is
    the slow part)."""
    base, fake, proc = agentik
    url = f"{base}/agui"
    body = {"threadId": "t", "runId": "r", "messages": []}
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
        assert r.status == 401  # the app-wide key protects the route
    await script_fake(
        fake,
        {"text": "Hello from the agent"},
        {"tool_calls": [["time__get_current_time", {"timezone": "UTC"}]]},
        {"text": "It is now."},
        {"status": 400, "text": "the model refused"},
    )
    runs = [
        {"threadId": "th-1", "messages": [user("u-1", "hi")]},
        {"threadId": "th-1", "messages": [user("u-2", "what time is it?")], "follow": True},
        {"threadId": "th-1", "messages": [user("u-3", "again")], "follow": True},
        {"threadId": "th-1", "messages": []},  # a front end that reconnects with nothing
    ]
    plain, tools, failed, again = await run_client(url, runs, **AUTH)
    assert [plain["error"], tools["error"], failed["error"], again["error"]] == [None] * 4
    assert kinds(plain)[0] == "RUN_STARTED" and kinds(plain)[-1] == "RUN_FINISHED"
    assert text_of(plain) == "Hello from the agent"
    assert "MESSAGES_SNAPSHOT" not in kinds(tools)  # the client was in step
    assert kinds(tools)[1:5] == [
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
    ]
    assert "UTC" in tools["events"][4]["content"]  # the MCP time server answered
    assert text_of(tools) == "It is now."
    # a run that ends in RUN_ERROR is no protocol violation: runAgent resolves
    assert kinds(failed) == ["RUN_STARTED", "RUN_ERROR"]
    assert "the model refused" in failed["events"][-1]["message"]
    assert kinds(again) == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    roles = [m["role"] for m in again["messages"]]
    assert roles == ["user", "assistant", "user", "assistant", "tool", "assistant", "user"]
    assert [m["id"] for m in again["messages"] if m["role"] == "user"] == ["u-1", "u-2", "u-3"]

    slow = {"text": " ".join(["word"] * 40), "delay": 0.03}
    await script_fake(fake, slow, {"text": "second reply"}, slow)
    runs = [
        {"threadId": "th-2", "messages": [user("u-1", "long")], "wait": False, "gapMs": 300},
        {"threadId": "th-2", "messages": [user("u-2", "short")]},
    ]
    first, second = await run_client(url, runs, **AUTH)
    assert first["error"] is None and second["error"] is None
    assert text_of(first) == " ".join(["word"] * 40)  # each run streams only its own turn
    assert text_of(second) == "second reply"

    # an interrupt through the agent's own API ends the run as cancelled, nothing left open
    async with aiohttp.ClientSession(headers=AUTH["headers"]) as s:
        running = asyncio.create_task(
            run_client(url, [{"threadId": "th-3", "messages": [user("u-1", "x")]}], **AUTH)
        )
        busy = await busy_conversation(base)
        async with s.post(f"{base}/agentik/conversations/{busy}/interrupt") as r:
            assert (await r.json())["interrupted"] is True
        (cut,) = await running
    assert cut["error"] is None
    assert kinds(cut)[-2:] == ["TEXT_MESSAGE_END", "RUN_FINISHED"]
    assert cut["events"][-1]["outcome"] == {"type": "cancelled"}

    # the server stopping mid-run (SIGTERM): the running turn is interrupted and the run ends
    await script_fake(fake, slow)
    running = asyncio.create_task(
        run_client(url, [{"threadId": "th-4", "messages": [user("u-1", "y")]}], **AUTH)
    )
    await busy_conversation(base)
    assert await asyncio.to_thread(proc.stop) == 0
    (stopped,) = await running
    assert stopped["error"] is None
    assert kinds(stopped)[-1] == "RUN_FINISHED"
    assert stopped["events"][-1]["outcome"] == {"type": "cancelled"}


@pytest.fixture
def approving(serve: Any, fake_openai_proc: str, tmp_path: Path) -> tuple[str, str, Any]:
    """``agentik serve`` whose MCP time tool waits for a person's approval."""
    return start(serve, fake_openai_proc, tmp_path, AGENTIK_TOOL_APPROVAL="time__*")


async def test_an_approval_is_an_interrupt_the_real_client_answers_with_resume(
    approving: tuple[str, str, Any],
) -> None:
    """The held call ends the run with the ``interrupt`` outcome; the client's next run
    answers it (``resume``, built by ``buildResumeArray``) and streams the rest of the turn:
    approved, the tool runs; cancelled, the model is told a person denied it."""
    base, fake, _ = approving
    call = {"tool_calls": [["time__get_current_time", {"timezone": "UTC"}]]}
    await script_fake(fake, call, {"text": "It is now."}, call, {"text": "Not allowed then."})
    yes = {"status": "resolved", "payload": {"approve": True}}
    runs = [
        {"threadId": "ap-1", "messages": [user("u-1", "what time is it?")]},
        {"threadId": "ap-1", "follow": True, "answer": yes},
        {"threadId": "ap-2", "messages": [user("u-1", "and now?")]},
        {"threadId": "ap-2", "follow": True, "answer": {"status": "cancelled"}},
    ]
    asked, approved, asked_again, denied = await run_client(f"{base}/agui", runs)
    assert [r["error"] for r in (asked, approved, asked_again, denied)] == [None] * 4
    assert kinds(asked) == ASKED
    outcome = asked["events"][-1]["outcome"]
    (interrupt,) = outcome["interrupts"]
    assert outcome["type"] == "interrupt" and interrupt["reason"] == "tool_approval"
    assert interrupt["toolCallId"] == asked["events"][1]["toolCallId"]
    assert [i["id"] for i in asked["pendingInterrupts"]] == [interrupt["id"]]

    # the answer's run: the thread as it was, the tool's result, the reply
    assert kinds(approved)[:3] == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "TOOL_CALL_RESULT"]
    assert "UTC" in approved["events"][2]["content"]  # it ran, after the approval
    assert text_of(approved) == "It is now." and approved["pendingInterrupts"] == []
    roles = [m["role"] for m in approved["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant"]

    results = [e for e in denied["events"] if e["type"] == "TOOL_CALL_RESULT"]
    assert results[0]["content"].startswith("Error: a person denied this call")
    assert text_of(denied) == "Not allowed then."
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{base}/agentik/conversations") as r:
            convs = (await r.json())["items"]
        for conv in convs:  # nothing waits any more
            async with s.get(f"{base}/agentik/conversations/{conv['id']}/approvals") as r:
                assert (await r.json())["items"] == []


CONFIRM = {
    "name": "confirm",
    "description": "Ask the user to confirm an action",
    "parameters": {"type": "object", "properties": {"action": {"type": "string"}}},
}


async def test_a_client_side_tool_the_real_client_runs_continues_the_turn(
    approving: tuple[str, str, Any],
) -> None:
    """The front end's tool is offered to the model; its call ends the run with the call
    streamed and pending; the next run carries the tool message and the turn goes on. No
    approval is asked for it (the policy holds ``time__*`` only, and a client's tool is never
    the approvals' to hold)."""
    base, fake, _ = approving
    call = {"tool_calls": [["confirm", {"action": "delete the draft"}]]}
    await script_fake(fake, call, {"text": "Deleted, as you confirmed."})
    runs = [
        {"threadId": "ct-1", "messages": [user("u-1", "delete the draft")], "tools": [CONFIRM]},
        {"threadId": "ct-1", "follow": True, "toolResults": {"confirm": "yes"}},
    ]
    asked, done = await run_client(f"{base}/agui", runs)
    assert asked["error"] is None and done["error"] is None
    assert kinds(asked) == ASKED
    call_id = asked["events"][1]["toolCallId"]
    assert asked["events"][1]["toolCallName"] == "confirm"
    assert asked["events"][-1]["outcome"] == {"type": "success", "pendingToolCallIds": [call_id]}
    assert asked["pendingInterrupts"] == []

    assert kinds(done)[:3] == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "TOOL_CALL_RESULT"]
    assert done["events"][2]["toolCallId"] == call_id and done["events"][2]["content"] == "yes"
    assert text_of(done) == "Deleted, as you confirmed."
    assert [m["role"] for m in done["messages"]] == ["user", "assistant", "tool", "assistant"]
    root = fake.removesuffix("/v1")
    async with aiohttp.ClientSession() as s, s.get(f"{root}/_fake/requests") as r:
        requests = await r.json()
    offered = [t["function"]["name"] for t in requests[-2]["tools"]]
    assert "confirm" in offered and "time__get_current_time" in offered
    sent = requests[-1]["messages"]  # the model got the front end's result
    assert sent[-1]["role"] == "tool" and sent[-1]["content"] == "yes"


async def test_a_client_side_tool_call_waits_across_kill_9(
    serve: Any, fake_openai_proc: str, tmp_path: Path
) -> None:
    """The server is killed while the front end's tool call waits: after the restart the
    real client's next run, with the result, continues the turn, its tools offered again."""
    fake = fake_openai_proc
    env = {
        "OPENAI_BASE_URL": fake,
        "OPENAI_API_KEY": "fake",
        "OPENAI_MODEL": "fake-model",
        "AGENTIK_PORT": str(free_port()),
    }
    await script_fake(fake, {"tool_calls": [["confirm", {"action": "ship"}]]}, {"text": "Shipped."})
    proc, base = serve(env)
    first = {"threadId": "k9", "messages": [user("u-1", "ship it")], "tools": [CONFIRM]}
    (asked,) = await run_client(f"{base}/agui", [first])
    (call_id,) = asked["events"][-1]["outcome"]["pendingToolCallIds"]
    proc.stop(signal.SIGKILL)

    _, base = serve(env)
    result = {"id": "r-1", "role": "tool", "toolCallId": call_id, "content": "yes"}
    (done,) = await run_client(
        f"{base}/agui", [{"threadId": "k9", "messages": [*asked["messages"], result]}]
    )
    assert done["error"] is None and text_of(done) == "Shipped."
    root = fake.removesuffix("/v1")
    async with aiohttp.ClientSession() as s, s.get(f"{root}/_fake/requests") as r:
        last = (await r.json())[-1]
    assert [t["function"]["name"] for t in last["tools"]] == ["confirm"]  # kept with the turn
    assert last["messages"][-1] == {"role": "tool", "tool_call_id": call_id, "content": "yes"}
