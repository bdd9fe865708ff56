"""The MCP server end to end against ``agentik serve`` (the fake OpenAI server behind it): the MCP
Inspector CLI (npm, ``tests/mcp_inspector``) lists and calls, and a second agentik uses the first
as an MCP tool through its own ``tools_mcp`` plugin (an ``mcp.json`` entry with a ``url`` and
headers): a sub-agent with no new code."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import ROOT, read_sse, script_fake
from tests.test_serve import openai_env

KEY = "mcp-e2e-key-0123456789"
INSPECTOR = ROOT / "tests" / "mcp_inspector" / "node_modules" / ".bin" / "mcp-inspector"
AUTH = {"Authorization": f"Bearer {KEY}"}


async def inspector(url: str, *args: str, key: str | None = KEY) -> tuple[int, str, str]:
    """The CLI's exit status, its output (JSON) and what it said on stderr."""
    headers = ["--header", f"Authorization: Bearer {key}"] if key else []
    proc = await asyncio.create_subprocess_exec(
        "node", str(INSPECTOR), "--cli", url, "--transport", "http", *headers, *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


@pytest.mark.skipif(
    shutil.which("node") is None or not INSPECTOR.exists(),
    reason="needs node and `npm ci --prefix tests/mcp_inspector` (make test does both)",
)
async def test_the_mcp_inspector_cli_lists_and_calls(serve: Any, fake_openai_proc: str) -> None:
    proc, base = serve(openai_env(fake_openai_proc, AGENTIK_API_KEY=KEY))
    proc.wait_output("MCP server")
    url = f"{base}/mcp"
    rc, out, err = await inspector(url, "--method", "tools/list", "--strict")
    assert rc == 0, out + err
    assert "Warning" not in err and "Error" not in err  # schemas portable to every client
    tools = {t["name"]: t for t in json.loads(out)["tools"]}
    assert set(tools) == {
        "chat", "new_conversation", "list_conversations", "get_messages", "interrupt",
    }  # fmt: skip
    assert tools["get_messages"]["annotations"]["readOnlyHint"] is True
    await script_fake(fake_openai_proc, {"text": "Hello from the agent"})
    rc, out, err = await inspector(url, "--method", "tools/call", "--tool-name", "chat",
                              "--tool-arg", "text=hi")  # fmt: skip
    assert rc == 0, out + err
    result = json.loads(out)
    assert result["isError"] is False
    assert result["content"] == [{"type": "text", "text": "Hello from the agent"}]
    cid = result["structuredContent"]["conversationId"]
    rc, out, err = await inspector(url, "--method", "resources/list")
    assert rc == 0, out + err
    assert [r["uri"] for r in json.loads(out)["resources"]] == [f"agentik://conversations/{cid}"]
    rc, out, err = await inspector(url, "--method", "resources/read",
                              "--uri", f"agentik://conversations/{cid}")  # fmt: skip
    assert rc == 0, out + err
    assert "Hello from the agent" in json.loads(out)["contents"][0]["text"]
    rc, out, err = await inspector(url, "--method", "tools/list", key="wrong-key-0123456789")
    assert rc != 0  # the key guards /mcp as every route


async def test_an_agentik_uses_another_as_an_mcp_tool(
    serve: Any, fake_openai_proc: str, tmp_path: Path
) -> None:
    """B's model calls ``helper__chat``: B's tools_mcp plugin calls A's /mcp, A runs a turn of
    its own (its model answers), and B's model gets A's reply as the tool result."""
    helper, helper_base = serve(
        openai_env(fake_openai_proc, AGENTIK_API_KEY=KEY, AGENTIK_A2A_NAME="helper")
    )
    helper.wait_output("MCP server")
    config = tmp_path / "mcp.json"
    entry = {"url": f"{helper_base}/mcp", "headers": {"Authorization": "Bearer ${HELPER_KEY}"}}
    config.write_text(json.dumps({"mcpServers": {"helper": entry}}))
    main, base = serve(
        openai_env(
            fake_openai_proc,
            AGENTIK_MCP_CONFIG=str(config),
            AGENTIK_DB_PATH=str(tmp_path / "main.db"),
            HELPER_KEY=KEY,
        )
    )
    banner = main.wait_output("tokens:", timeout=30)
    assert "helper__chat" in banner and "helper__list_conversations" in banner
    await script_fake(
        fake_openai_proc,
        {"tool_calls": [["helper__chat", {"text": "What is 2+2?"}]]},  # B's model
        {"text": "It is 4."},  # A's model, in A's own turn
        {"text": "The helper says: 4."},  # B's model, with the tool result
    )
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{base}/agentik/conversations", json={}) as r:
            cid = (await r.json())["id"]
        async with s.get(
            f"{base}/agentik/conversations/{cid}/events",
            headers={"Accept": "text/event-stream"},
        ) as events:
            body = [{"type": "text", "body": "ask the helper"}]
            async with s.post(f"{base}/agentik/conversations/{cid}/messages", json=body) as r:
                assert r.status == 202
            frames = await read_sse(events, timeout=60)
    kinds = [f["event"] for f in frames]
    assert "ToolCall" in kinds and kinds[-1] == "End"
    result = next(f["data"] for f in frames if f["event"] == "ToolResult")
    assert not result["isError"]
    assert result["text"].startswith("It is 4.")
    text = "".join(f["data"]["text"] for f in frames if f["event"] == "AppendText")
    assert text == "The helper says: 4."
    # A's side: an ordinary conversation of its own, through every door
    async with aiohttp.ClientSession(headers=AUTH) as s:
        async with s.get(f"{helper_base}/agentik/conversations") as r:
            (conv,) = (await r.json())["items"]
        async with s.get(f"{helper_base}/agentik/conversations/{conv['id']}/messages") as r:
            items = (await r.json())["items"]
    assert [(m["type"], m.get("text")) for m in items] == [
        ("user", None),
        ("assistant", "It is 4."),
    ]
    assert items[0]["content"] == [{"type": "text", "body": "What is 2+2?"}]
