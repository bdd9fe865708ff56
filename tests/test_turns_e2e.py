"""Durable turns across real process kills (F19): ``agentik serve`` is killed with SIGKILL at
each step of a 3-step tool loop and while a turn waits, then started again on the same
database. A plugin from ``AGENTIK_PLUGINS_DIR`` brings tools that count their runs in a file
(they outlive the process) and hang when asked, a gate that holds a tool's calls, and a route
that answers a held call (``conversation.resume_turn``)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import read_sse, script_fake

PLUGIN = """
import asyncio, os
from pathlib import Path

from aiohttp import web

from agentik import hookimpl
from agentik.core.tools import tool
from agentik.core.turns import Wait

RUNS = Path(os.environ["STEPS_RUNS"])
HANG = os.environ.get("STEPS_HANG", "")
GATE = os.environ.get("STEPS_GATE", "")


def counted(name, idempotent):
    @tool(name=name, idempotent=idempotent)
    async def run(target: str) -> str:
        line = f"{name} {target}\\n"
        before = RUNS.read_text().count(line) if RUNS.exists() else 0
        with RUNS.open("a") as f:
            f.write(line)
        if name == HANG and before == 0:
            await asyncio.sleep(600)
        return f"{name}: {target} ok"

    return run


@hookimpl
def register_tools(register):
    register(counted("launch", False))
    register(counted("look", True))


@hookimpl
def tool_call_gate(call):
    return Wait("", "check", {"tool": call.name}) if call.name == GATE else None


def setup(app, agent, settings):
    async def answer(request):
        body = await request.json()
        conv = await agent.get_conversation(body["conversationId"])
        turn = await conv.resume_turn(body["turnId"], body["callId"], body["answer"])
        return web.json_response({"state": str(turn.state)})

    async def turn(request):
        conv = await agent.get_conversation(request.query["conversationId"])
        record = await conv.turn(request.query["turnId"])
        return web.json_response(record.to_json())

    app.router.add_post("/test/answer", answer)
    app.router.add_get("/test/turn", turn)


@hookimpl
def register_transports(register):
    register("steps", setup)
"""

LAUNCH = {"tool_calls": [["launch", {"target": "moon"}]]}
LOOK = {"tool_calls": [["look", {"target": "moon"}]]}
FINAL = {"text": "all done"}
# where the server is killed: the reply it is streaming (hung) or the tool it runs (hung), and
# the replies the model still owes after the restart
CUTS = {
    "first model call": ({**LAUNCH, "hang": True}, None, [LAUNCH, LOOK, FINAL]),
    "launch": (None, "launch", [LOOK, FINAL]),
    "second model call": ({**LOOK, "hang": True}, None, [LOOK, FINAL]),
    "look": (None, "look", [FINAL]),
    "final reply": ({"text": "all " + "done " * 400, "delay": 0.05}, None, [FINAL]),
}


def env_for(fake: str, tmp_path: Path, **more: str) -> dict[str, str]:
    plugins = tmp_path / "plugins"
    plugins.mkdir(exist_ok=True)
    (plugins / "steps.py").write_text(PLUGIN)
    return {
        "OPENAI_BASE_URL": fake,
        "OPENAI_API_KEY": "k",
        "OPENAI_MODEL": "fake-model",
        "AGENTIK_PLUGINS_DIR": str(plugins),
        "STEPS_RUNS": str(tmp_path / "runs.txt"),
        **more,
    }


async def post(s: aiohttp.ClientSession, url: str, body: Any = None) -> Any:
    async with s.post(url, json=body) as r:
        assert r.status < 300, await r.text()
        return await r.json()


async def wait_until(check, timeout: float = 20) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        got = await check()
        if got:
            return got
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def history(s: aiohttp.ClientSession, base: str, cid: str) -> list[dict[str, Any]]:
    async with s.get(f"{base}/agentik/conversations/{cid}/messages?limit=100") as r:
        return (await r.json())["items"]


def runs(tmp_path: Path) -> list[str]:
    path = tmp_path / "runs.txt"
    return path.read_text().splitlines() if path.exists() else []


async def fake_requests(fake: str) -> int:
    async with (
        aiohttp.ClientSession() as s,
        s.get(fake.removesuffix("/v1") + "/_fake/requests") as r,
    ):
        return len(await r.json())


async def reset_fake(fake: str, *replies: dict[str, Any]) -> None:
    async with aiohttp.ClientSession() as s:
        await post(s, fake.removesuffix("/v1") + "/_fake/reset")
    await script_fake(fake, *replies)


@pytest.mark.parametrize("cut_at", list(CUTS))
async def test_kill_9_at_each_step_of_a_tool_loop_then_the_turn_completes(
    serve, fake_openai_proc, tmp_path, cut_at
):
    hung_reply, hung_tool, owed = CUTS[cut_at]
    env = env_for(fake_openai_proc, tmp_path, STEPS_HANG=hung_tool or "")
    done_before = {"first model call": [], "launch": [LAUNCH], "second model call": [LAUNCH],
                   "look": [LAUNCH, LOOK], "final reply": [LAUNCH, LOOK]}[cut_at]  # fmt: skip
    await script_fake(fake_openai_proc, *done_before, *([hung_reply] if hung_reply else []))
    proc, base = serve(env)
    async with aiohttp.ClientSession() as s:
        cid = (await post(s, f"{base}/agentik/conversations"))["id"]
        stream = await s.get(f"{base}/agentik/conversations/{cid}/events")
        user = await post(
            s, f"{base}/agentik/conversations/{cid}/messages", [{"type": "text", "body": "go"}]
        )
        if hung_tool:
            await wait_until(lambda: _ran(tmp_path, hung_tool))
        elif cut_at == "final reply":
            frames = await read_sse(stream, until="AppendText")
            assert frames[-1]["data"]["text"]
        else:
            await wait_until(lambda: _requests_at_least(fake_openai_proc, len(done_before) + 1))
        stream.close()
        proc.stop(signal.SIGKILL)
        before = runs(tmp_path)
        await reset_fake(fake_openai_proc, *owed)
        _proc2, base2 = serve({**env, "AGENTIK_PORT": base.rsplit(":", 1)[1]})
        async with s.get(
            f"{base2}/agentik/conversations/{cid}/events", params={"after": "0"}
        ) as r2:
            frames = await read_sse(r2, until="End", timeout=30)
        types = [f["event"] for f in frames]
        assert types.count("End") == 1 and "Error" not in types, types
        items = await wait_until(lambda: _ended(s, base2, cid))
        assert [m["type"] for m in items] == [
            "user", "tool_call", "tool_result", "tool_call", "tool_result", "assistant"
        ]  # fmt: skip
        assert items[-1]["text"].endswith("all done")
        results = [m["text"] for m in items if m["type"] == "tool_result"]
        after = runs(tmp_path)
        assert after.count("launch moon") == 1  # not idempotent: never twice
        if cut_at == "launch":
            assert "cut by a server restart" in results[0]
        elif cut_at == "look":
            assert after.count("look moon") == 2 and results[1] == "look: moon ok"  # idempotent
        else:
            assert after.count("look moon") == 1 and results == ["launch: moon ok", "look: moon ok"]
        assert before == after[: len(before)]
        turn = await (
            await s.get(f"{base2}/test/turn", params={"conversationId": cid, "turnId": user["id"]})
        ).json()
        assert turn["state"] == "done"


async def _ran(tmp_path: Path, tool_name: str) -> bool:
    return any(line.startswith(tool_name) for line in runs(tmp_path))


async def _requests_at_least(fake: str, n: int) -> bool:
    return await fake_requests(fake) >= n


async def _ended(s, base: str, cid: str):
    items = await history(s, base, cid)
    return items if items and items[-1]["type"] in ("assistant", "error") else None


async def test_kill_9_while_a_turn_waits_then_an_answer_completes_it(
    serve, fake_openai_proc, tmp_path
):
    env = env_for(fake_openai_proc, tmp_path, STEPS_GATE="launch")
    await script_fake(fake_openai_proc, LAUNCH, FINAL, {"text": "second"})
    proc, base = serve(env)
    async with aiohttp.ClientSession() as s:
        cid = (await post(s, f"{base}/agentik/conversations"))["id"]
        send = f"{base}/agentik/conversations/{cid}/messages"
        user = await post(s, send, [{"type": "text", "body": "go"}])
        query = {"conversationId": cid, "turnId": user["id"]}

        async def waiting(b):
            async with s.get(f"{b}/test/turn", params=query) as r:
                turn = await r.json()
            return turn if turn["state"] == "waiting" else None

        turn = await wait_until(lambda: waiting(base))
        assert turn["waits"] == [
            {
                "callId": turn["waits"][0]["callId"],
                "kind": "check",
                "request": {"tool": "launch"},
            }
        ]
        queued = await post(s, send, [{"type": "text", "body": "behind it"}])
        proc.stop(signal.SIGKILL)
        _proc2, base2 = serve({**env, "AGENTIK_PORT": base.rsplit(":", 1)[1]})
        turn = await wait_until(lambda: waiting(base2))  # still waiting after the restart
        assert runs(tmp_path) == [] and (await history(s, base2, cid))[-1]["id"] == queued["id"]
        answer = {**query, "callId": turn["waits"][0]["callId"], "answer": {"approve": True}}
        assert (await post(s, f"{base2}/test/answer", answer))["state"] == "running"
        items = await wait_until(lambda: _ended_with(s, base2, cid, "second"))
        assert runs(tmp_path) == ["launch moon"]
        assert [m["type"] for m in items] == [
            "user", "tool_call", "user", "tool_result", "assistant", "assistant"
        ]  # fmt: skip
        assert [m.get("text") for m in items if m["type"] == "assistant"] == ["all done", "second"]


async def _ended_with(s, base: str, cid: str, text: str):
    items = await history(s, base, cid)
    return items if items and items[-1].get("text") == text else None
