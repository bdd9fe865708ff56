"""A tool call that waits for a person, across a kill -9 of ``agentik serve``, answered through
the Python client (agentik.client): the request is still there after the restart, and the
approved call runs once."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from agentik.client import RemoteAgent
from agentik.core.types import ApprovalRequested, End, TextPart
from tests.conftest import free_port, script_fake

PLUGIN = '''
import os
from pathlib import Path

from agentik import hookimpl
from agentik.core.tools import tool

RUNS = Path(os.environ["LAUNCH_RUNS"])


@tool
def launch(target: str) -> str:
    """Launch at a target."""
    with RUNS.open("a") as f:
        f.write(target + "\\n")
    return f"launched at {target}"


@hookimpl
def register_tools(register):
    register(launch)
'''


def env_for(fake: str, tmp_path: Path) -> dict[str, str]:
    plugins = tmp_path / "plugins"
    plugins.mkdir(exist_ok=True)
    (plugins / "launcher.py").write_text(PLUGIN)
    return {
        "OPENAI_BASE_URL": fake,
        "OPENAI_API_KEY": "k",
        "OPENAI_MODEL": "fake-model",
        "AGENTIK_PLUGINS_DIR": str(plugins),
        "AGENTIK_TOOL_APPROVAL": "launch",
        "AGENTIK_PORT": str(free_port()),
        "LAUNCH_RUNS": str(tmp_path / "runs.txt"),
    }


def runs(tmp_path: Path) -> list[str]:
    path = tmp_path / "runs.txt"
    return path.read_text().splitlines() if path.exists() else []


async def test_a_waiting_approval_survives_kill_9_and_is_answered_through_the_client(
    serve, fake_openai_proc, tmp_path
):
    env = env_for(fake_openai_proc, tmp_path)
    await script_fake(
        fake_openai_proc,
        {"tool_calls": [["launch", {"target": "moon"}], ["launch", {"target": "sun"}]]},
        {"text": "one launched, one not"},
    )
    proc, base = serve(env)
    async with RemoteAgent(base, retry_for=30) as agent:
        conv = await agent.create_conversation()
        events = conv.events()
        await conv.send([TextPart("launch both")])
        asked = []
        async for event in events:
            if isinstance(event, ApprovalRequested):
                asked.append(event)
                if len(asked) == 2:
                    break
        assert [(a.tool_name, a.args_json) for a in asked] == [
            ("launch", '{"target": "moon"}'),
            ("launch", '{"target": "sun"}'),
        ]
        assert [a.call_id for a in await conv.approvals()] == [a.call_id for a in asked]
        assert await conv.deny(asked[1].call_id, note="not the sun") == "waiting"
        proc.stop(signal.SIGKILL)  # while the first still waits for its answer

        serve(env)
        pending = await conv.approvals()  # the client reconnects by itself
        assert [a.call_id for a in pending] == [asked[0].call_id]
        assert runs(tmp_path) == []
        assert await conv.approve(pending[0].call_id) == "running"
        async for event in events:
            if isinstance(event, End):
                break
        await events.aclose()
        for _ in range(200):
            history = await conv.get_messages(limit=100)
            if history[-1].kind == "assistant":
                break
            await asyncio.sleep(0.05)
    assert runs(tmp_path) == ["moon"]  # once, and the denied one never
    assert [m.kind for m in history] == [
        "user",
        "tool_call",
        "tool_call",
        "approval",
        "approval",
        "approval",
        "approval",
        "tool_result",
        "tool_result",
        "assistant",
    ]
    results = [m.payload["text"] for m in history if m.kind == "tool_result"]
    assert results == ["launched at moon", "Error: a person denied this call: not the sun"]
