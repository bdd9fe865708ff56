"""The MCP server (``/mcp``) in-process over real loopback HTTP, driven by the ``mcp`` SDK's own
client in both protocol eras (2026-07-28 without a session, 2025-11-25 with the initialize
handshake): the tools and their annotations, ``chat`` with its text as progress, retries, errors,
interrupts, the conversation resources, the server's identity from the agent card settings, the
keys, and the SDK loaded only at the first request. ``tests/test_mcp_server_e2e.py`` runs the MCP
Inspector CLI and a second agentik against ``agentik serve``."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

from agentik.core.app import AGENT
from agentik.core.llm import LLMError
from agentik.core.testing import ScriptedLLM, make_app

BUILTINS = ("agentik_transport_http", "agentik_transport_mcp_server")
KEY = "mcp-test-key-0123456789"
MODES = ("auto", "legacy")  # 2026-07-28 (probed), and the initialize handshake


@pytest.fixture
def serve(aiohttp_client: Any, tmp_path: Any) -> Any:
    async def make(
        llm: ScriptedLLM | None = None, builtins: tuple[str, ...] = BUILTINS, **env: str
    ) -> Any:
        env = {"AGENTIK_DB_PATH": str(tmp_path / "a.db"), **env}
        app = make_app(llm=llm or ScriptedLLM(), builtins=builtins, env=env)
        return await aiohttp_client(app)

    return make


@contextlib.asynccontextmanager
async def connect(served: Any, mode: str = "auto", key: str | None = None) -> AsyncIterator[Client]:
    url = str(served.make_url("/mcp"))
    server: Any = url
    if key is not None:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"})
        server = streamable_http_client(url, http_client=http)
    async with Client(server, mode=mode) as client:  # type: ignore[arg-type]
        yield client


@pytest.mark.parametrize("mode", MODES)
async def test_the_tools_and_who_the_server_is(serve: Any, mode: str) -> None:
    served = await serve(
        builtins=(*BUILTINS, "agentik_transport_a2a"),
        AGENTIK_A2A_NAME="helper",
        AGENTIK_A2A_VERSION="7.1",
        AGENTIK_A2A_DESCRIPTION="Answers questions about the weather.",
    )
    async with connect(served, mode) as client:
        assert client.protocol_version == ("2026-07-28" if mode == "auto" else "2025-11-25")
        assert (client.server_info.name, client.server_info.version) == ("helper", "7.1")
        assert client.instructions.startswith("Answers questions about the weather.")
        assert "conversationId" in client.instructions
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert list(tools) == [
        "chat", "new_conversation", "list_conversations", "get_messages", "interrupt",
    ]  # fmt: skip
    read_only = {name for name, t in tools.items() if t.annotations.read_only_hint}
    assert read_only == {"list_conversations", "get_messages"}
    assert tools["interrupt"].annotations.destructive_hint is True
    assert tools["chat"].annotations.destructive_hint is False
    assert tools["chat"].annotations.open_world_hint is True
    assert tools["chat"].input_schema["required"] == ["text"]
    assert tools["chat"].output_schema["required"] == ["conversationId", "reply", "status"]


async def test_without_the_a2a_plugin_the_server_is_agentik(serve: Any) -> None:
    from agentik import __version__

    async with connect(await serve()) as client:
        assert (client.server_info.name, client.server_info.version) == ("agentik", __version__)


@pytest.mark.parametrize("mode", MODES)
async def test_chat_streams_its_reply_as_progress(serve: Any, mode: str) -> None:
    parts = ["The ", "weather ", "is ", "fine."]
    served = await serve(ScriptedLLM(parts, ["Still fine."], delay=0.02))
    progress: list[tuple[float, str | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, message))

    async with connect(served, mode) as client:
        result = await client.call_tool("chat", {"text": "weather?"}, progress_callback=on_progress)
        assert not result.is_error
        assert result.content[0].text == "The weather is fine."
        cid = result.structured_content["conversationId"]
        assert result.structured_content == {
            "conversationId": cid, "reply": "The weather is fine.", "status": "completed",
        }  # fmt: skip
        assert "".join(m for _, m in progress if m) == "The weather is fine."
        assert [d for d, _ in progress] == sorted(d for d, _ in progress)  # it only grows
        assert progress[-1][0] == len("The weather is fine.")
        again = await client.call_tool("chat", {"text": "and now?", "conversationId": cid})
        assert again.structured_content["reply"] == "Still fine."
    r = await served.get(f"/agentik/conversations/{cid}/messages")  # one agent, every door
    texts = [m.get("text") or m["content"][0]["body"] for m in (await r.json())["items"]]
    assert texts == ["weather?", "The weather is fine.", "and now?", "Still fine."]


async def test_a_chat_sent_again_with_its_message_id_runs_once(serve: Any) -> None:
    served = await serve()
    async with connect(served) as client:
        args = {"text": "once", "messageId": "m-1"}
        first = await client.call_tool("chat", args)
        cid = first.structured_content["conversationId"]
        args["conversationId"] = cid
        again = await client.call_tool("chat", args)
        assert again.structured_content == {**first.structured_content, "conversationId": cid}
    conv = await served.app[AGENT].get_conversation(cid)
    assert [r.kind for r in await conv.get_messages()] == ["user", "assistant"]


async def test_failures_are_error_results_a_model_can_read(serve: Any) -> None:
    served = await serve(ScriptedLLM(LLMError("the model is down", "unavailable")))
    async with connect(served) as client:
        failed = await client.call_tool("chat", {"text": "hi"})
        assert failed.is_error and "the model is down" in failed.content[0].text
        unknown = await client.call_tool("chat", {"text": "hi", "conversationId": "conv-nope"})
        assert unknown.is_error and "conv-nope" in unknown.content[0].text
        bad = await client.call_tool("chat", {"text": 3})
        assert bad.is_error and "invalid arguments: text" in bad.content[0].text
        extra = await client.call_tool("list_conversations", {"limit": 0, "colour": "red"})
        assert extra.is_error and "invalid arguments" in extra.content[0].text
        with pytest.raises(MCPError, match="Unknown tool"):
            await client.call_tool("delete_everything", {})
        page = await client.call_tool("get_messages", {"conversationId": "conv-nope"})
        assert page.is_error


async def test_interrupt_stops_a_running_chat(serve: Any) -> None:
    served = await serve(ScriptedLLM([f"w{i} " for i in range(200)], delay=0.01))
    async with connect(served) as client:
        chat = asyncio.ensure_future(client.call_tool("chat", {"text": "talk"}))
        for _ in range(200):
            listed = await client.call_tool("list_conversations", {})
            busy = [c["id"] for c in listed.structured_content["conversations"] if c["busy"]]
            if busy:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)  # into the reply
        stopped = await client.call_tool("interrupt", {"conversationId": busy[0]})
        assert stopped.structured_content == {"interrupted": True}
        result = await chat
        assert result.structured_content["status"] == "interrupted"
        assert result.structured_content["reply"].startswith("w0 w1 ")
        idle = await client.call_tool("interrupt", {"conversationId": busy[0]})
        assert idle.structured_content == {"interrupted": False}


async def test_conversations_messages_and_resources(serve: Any) -> None:
    served = await serve()
    agent = served.app[AGENT]
    async with connect(served) as client:
        made = await client.call_tool("new_conversation", {"title": "Plans"})
        cid = made.structured_content["conversationId"]
        await client.call_tool("chat", {"text": "a plan", "conversationId": cid})
        listed = await client.call_tool("list_conversations", {"limit": 5})
        (first,) = listed.structured_content["conversations"]
        assert (first["id"], first["title"], first["busy"]) == (cid, "Plans", False)
        page = await client.call_tool("get_messages", {"conversationId": cid, "limit": 1})
        (message,) = page.structured_content["messages"]
        assert (message["type"], message["content"]) == (
            "user",
            [{"type": "text", "body": "a plan"}],
        )
        rest = await client.call_tool(
            "get_messages", {"conversationId": cid, "after": message["id"]}
        )
        assert [m["type"] for m in rest.structured_content["messages"]] == ["assistant"]
        bad = await client.call_tool("get_messages", {"conversationId": cid, "after": "msg-x"})
        assert bad.is_error

        for _ in range(100):  # more than a page of resources
            await agent.create_conversation()
        first_page = await client.list_resources()
        assert len(first_page.resources) == 100 and first_page.next_cursor
        second = await client.list_resources(cursor=first_page.next_cursor)
        uris = [r.uri for r in first_page.resources + second.resources]
        assert len(uris) == len(set(uris)) == 101
        assert f"agentik://conversations/{cid}" in uris
        plans = next(r for r in second.resources if r.title == "Plans")
        assert plans.mime_type == "text/markdown"
        read = await client.read_resource(f"agentik://conversations/{cid}")
        text = read.contents[0].text
        assert text.startswith(f"# Plans ({cid})")
        assert "a plan" in text and "echo: a plan" in text
        for uri in ("agentik://conversations/conv-nope", "file:///etc/passwd"):
            with pytest.raises(MCPError) as e:
                await client.read_resource(uri)
            assert e.value.error.code == -32002
        (template,) = (await client.list_resource_templates()).resource_templates
        assert template.uri_template == "agentik://conversations/{id}"


@pytest.mark.parametrize("mode", MODES)
async def test_the_keys_guard_the_server(serve: Any, mode: str) -> None:
    served = await serve(AGENTIK_API_KEY=KEY)
    async with connect(served, mode, key=KEY) as client:
        result = await client.call_tool("chat", {"text": "with a key"})
        assert result.content[0].text == "echo: with a key"
    for key in (None, "wrong-key-0123456789"):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        r = await served.post(
            "/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            headers={**headers, "Accept": "application/json, text/event-stream"},
        )
        assert r.status == 401
    assert await served.app[AGENT].count_conversations() == 1


async def test_a_client_that_leaves_does_not_stop_the_turn(serve: Any) -> None:
    words = [f"w{i} " for i in range(40)]
    served = await serve(ScriptedLLM(words, delay=0.02))
    agent = served.app[AGENT]
    async with connect(served) as client:
        call = asyncio.ensure_future(client.call_tool("chat", {"text": "long"}))
        while not [c for c in await agent.list_conversations() if agent.is_busy(c.id)]:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)
        call.cancel()  # the client gives up on the call and leaves
        with contextlib.suppress(asyncio.CancelledError):
            await call
    (info,) = await agent.list_conversations()
    conv = await agent.get_conversation(info.id)
    await asyncio.wait_for(conv.wait_idle(), 10)
    end = (await conv.get_messages())[-1]
    assert end.kind == "assistant" and end.payload["text"] == "".join(words)
    assert "interrupted" not in end.payload


def test_the_sdk_is_loaded_at_the_first_request_not_at_start_up() -> None:
    code = (
        "import sys; from agentik.core.testing import make_app;"
        "app = make_app(builtins=['agentik_transport_mcp_server']);"
        "import agentik_transport_mcp_server as p; from agentik.core.app import SETTINGS;"
        "p.banner_lines(app[SETTINGS]);"
        "heavy = [m for m in ('mcp', 'httpx2', 'pydantic', 'starlette') if m in sys.modules];"
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


async def test_the_path_is_a_setting(serve: Any) -> None:
    from agentik.core.settings import SettingsError

    served = await serve(AGENTIK_MCP_SERVER_PATH="/tools/mcp/")
    url = str(served.make_url("/tools/mcp"))
    async with Client(url) as client:
        assert len((await client.list_tools()).tools) == 5
    assert (await served.post("/mcp", json={})).status == 404
    with pytest.raises(SettingsError, match="AGENTIK_MCP_SERVER_PATH='mcp' is invalid"):
        make_app(builtins=BUILTINS, env={"AGENTIK_MCP_SERVER_PATH": "mcp"})
