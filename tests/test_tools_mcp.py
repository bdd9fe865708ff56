"""The MCP tools plugin against real MCP servers, no mocks: PyPI ``mcp-server-time`` over stdio
and npm ``@modelcontextprotocol/server-everything`` over stdio and streamable HTTP
(``npm ci --prefix tests/mcp``, which ``make test`` runs), in process and through
``agentik serve`` with the fake OpenAI server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest

from agentik.core.llm import ToolCallRequest, ToolResultInput, UserInput
from agentik.core.settings import Settings
from agentik.core.testing import ScriptedLLM
from agentik.core.tools import ToolError, ToolRegistry
from agentik.core.types import TextPart
from agentik_tools_mcp.config import ConfigError, ServerConfig, load, parse_entry
from agentik_tools_mcp.names import exposed_name
from tests.conftest import BIN, ROOT, collect_turn, free_port, read_sse, script_fake

EVERYTHING = ROOT / "tests/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
# skipped only by hand: in CI (CI=true, as .ci/run runs) a missing npm install must fail
needs_everything = pytest.mark.skipif(
    not os.environ.get("CI") and (not EVERYTHING.is_file() or shutil.which("node") is None),
    reason="needs node and `npm ci --prefix tests/mcp` (make test does both)",
)
TIME = ServerConfig("time", "stdio", command=sys.executable, args=("-m", "mcp_server_time"))


def everything(name: str = "every", **env: str) -> ServerConfig:
    return ServerConfig(name, "stdio", command="node", args=(str(EVERYTHING), "stdio"), env=env)


def children() -> dict[int, str]:
    """This process's child processes (zombies included), pid → command line."""
    out = {}
    for p in psutil.Process().children():
        try:
            out[p.pid] = " ".join(p.cmdline()) or p.name()
        except psutil.Error:
            out[p.pid] = "?"
    return out


async def started(*configs: ServerConfig, **kwargs: Any) -> Any:
    from agentik_tools_mcp.servers import MCPTools

    tools = MCPTools(list(configs), **kwargs)
    await tools.start()
    return tools


@pytest.fixture
async def mcp_tools() -> AsyncIterator[Any]:
    """``await mcp_tools(*configs, **kwargs)``: started MCPTools, closed after the test, and
    no child process of theirs left behind."""
    before = set(children())
    made: list[Any] = []

    async def make(*configs: ServerConfig, **kwargs: Any) -> Any:
        made.append(await started(*configs, **kwargs))
        return made[-1]

    yield make
    for tools in made:
        await tools.aclose()
    left = {pid: cmd for pid, cmd in children().items() if pid not in before}
    assert not left, f"MCP server processes left behind: {left}"


def start_everything(transport: str, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    """server-everything over HTTP (``streamableHttp`` or ``sse``) on a free port."""
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["node", str(EVERYTHING), transport],
            env={**os.environ, "PORT": str(port)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 20
    while f"on port {port}".encode() not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(log.read_text())
        time.sleep(0.02)
    return proc, port


@pytest.fixture
def everything_http(tmp_path: Path) -> Iterator[str]:
    """server-everything over streamable HTTP on a free port; yields its /mcp URL."""
    proc, port = start_everything("streamableHttp", tmp_path / "everything-http.log")
    yield f"http://127.0.0.1:{port}/mcp"
    proc.terminate()
    proc.wait(10)


async def eventually(check: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition never became true"
        await asyncio.sleep(0.02)


def pid_of(needle: str) -> int:
    pids = [pid for pid, cmd in children().items() if needle in cmd]
    assert len(pids) == 1, children()
    return pids[0]


# --- the plugin as a plugin -------------------------------------------------------------------


def test_importing_the_plugin_does_not_import_mcp():
    code = (
        "import sys, agentik_tools_mcp; "
        "heavy = [m for m in ('mcp', 'httpx2', 'anyio', 'pydantic') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_plugin_is_an_entry_point_and_declares_its_settings():
    from importlib.metadata import entry_points

    import agentik_tools_mcp as plugin

    assert "agentik_tools_mcp" in {ep.name for ep in entry_points(group="agentik")}
    settings = Settings(plugin.SETTINGS, {"AGENTIK_MCP_CALL_TIMEOUT": "5"})
    assert settings["AGENTIK_MCP_CALL_TIMEOUT"] == 5.0
    assert settings["AGENTIK_MCP_START_TIMEOUT"] == 30.0
    # unset or `off`: no MCP (a ./mcp.json is never read unless named)
    assert plugin.config_path(settings) is None and settings["AGENTIK_MCP_CONFIG"] == "off"
    off = Settings(plugin.SETTINGS, {"AGENTIK_MCP_CONFIG": "off"})
    assert plugin.config_path(off) is None
    given = Settings(plugin.SETTINGS, {"AGENTIK_MCP_CONFIG": "/x/mcp.json"})
    assert plugin.config_path(given) == Path("/x/mcp.json")


# --- mcp.json ---------------------------------------------------------------------------------


def test_mcp_json_entries_types_and_variables(tmp_path: Path):
    path = tmp_path / "mcp.json"
    path.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "time": {"command": "uvx", "args": ["mcp-server-time", 3], "env": {"N": 1}},
                    "web": {"url": "https://${HOST}/mcp", "headers": {"Authorization": "${TOK}"}},
                    "typed": {"type": "streamable-http", "url": "http://h:${PORT:-8000}/mcp"},
                    "legacy": {"type": "sse", "url": "http://h/sse"},
                    "home": {"type": "stdio", "command": "${BIN:-srv}", "args": ["${HOME_DIR}"]},
                    "off": {"command": "x", "disabled": True},
                    "unset": {"command": "srv", "env": {"KEY": "${MISSING}"}},
                    "nothing": {"args": []},
                    "badargs": {"command": "x", "args": "--flag"},
                    "badtype": {"type": "websocket", "url": "ws://h"},
                    "badurl": {"url": "h:80"},
                    "badenv": {"command": "x", "env": {"A": ["b"]}},
                    "notobj": "npx server",
                }
            }
        )
    )
    env = {"HOST": "example.com", "TOK": "Bearer t0k", "HOME_DIR": "/home/me", "PORT": ""}
    servers, skipped = load(path, env)
    by = {s.name: s for s in servers}
    assert list(by) == ["time", "web", "typed", "legacy", "home"]
    assert by["time"] == ServerConfig(
        "time", "stdio", command="uvx", args=("mcp-server-time", "3"), env={"N": "1"}
    )
    assert (by["web"].type, by["web"].url) == ("http", "https://example.com/mcp")
    assert by["web"].headers == {"Authorization": "Bearer t0k"}
    assert (by["typed"].type, by["typed"].url) == ("http", "http://h:8000/mcp")  # empty → default
    assert by["legacy"].type == "sse"
    assert (by["home"].command, by["home"].args) == ("srv", ("/home/me",))
    assert skipped.keys() == {
        "unset",
        "nothing",
        "badargs",
        "badtype",
        "badurl",
        "badenv",
        "notobj",
    }
    assert skipped["unset"] == "${MISSING} is not set"
    assert "neither" in skipped["nothing"] and "websocket" in skipped["badtype"]
    with pytest.raises(ConfigError, match="not valid JSON"):
        path.write_text("{nope")
        load(path, {})
    with pytest.raises(ConfigError, match="mcpServers"):
        path.write_text('{"servers": {}}')
        load(path, {})
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "missing.json", {})
    with pytest.raises(ConfigError, match="empty"):
        parse_entry(" ", {"command": "x"}, {})


def test_tool_names_are_valid_and_unique():
    taken = {"time__now"}
    assert exposed_name("time", "get_current_time", taken) == "time__get_current_time"
    assert exposed_name("my server", "do.it/now", taken) == "my_server__do_it_now"
    assert exposed_name("time", "now", taken) == "time__now_2"
    assert exposed_name("time", "now", taken | {"time__now_2"}) == "time__now_3"
    long = exposed_name("s" * 40, "t" * 40, taken)
    assert len(long) == 64 and long != exposed_name("s" * 40, "t" * 39 + "u", taken)
    assert exposed_name("s" * 40, "t" * 40, {long}) == long[:62] + "_2"


def test_results_are_summarised_not_dumped():
    import mcp.types as t

    from agentik_tools_mcp.results import result_text

    blob = "A" * 4000  # 3000 bytes of base64 data
    result = t.CallToolResult(
        content=[
            t.TextContent(type="text", text="hello"),
            t.ImageContent(type="image", data=blob, mime_type="image/png"),
            t.AudioContent(type="audio", data="AAAA", mime_type="audio/wav"),
            t.EmbeddedResource(
                type="resource",
                resource=t.TextResourceContents(uri="file:///a", mime_type="text/plain", text="A"),
            ),
            t.EmbeddedResource(
                type="resource",
                resource=t.BlobResourceContents(uri="file:///b.bin", mime_type="x/y", blob=blob),
            ),
            t.ResourceLink(type="resource_link", name="doc", uri="file:///doc", description="d"),
        ],
        structured_content={"n": 1},
    )
    assert result_text(result).splitlines() == [
        "hello",
        "[image: image/png, 2.9 KB]",
        "[audio: audio/wav, 3 bytes]",
        "[resource <file:///a> (text/plain)]",
        "A",
        "[resource <file:///b.bin>: x/y, 2.9 KB, not shown]",
        "[resource link: doc <file:///doc>: d]",
        '{"n": 1}',
    ]
    # structured content that a text block already carries is not repeated
    same = t.CallToolResult(
        content=[t.TextContent(type="text", text='{"n":1}')], structured_content={"n": 1}
    )
    assert result_text(same) == '{"n":1}'
    assert result_text(t.CallToolResult(content=[], structured_content={"n": 1})) == '{"n": 1}'


# --- real servers, in process -----------------------------------------------------------------


@needs_everything
async def test_stdio_and_http_servers_give_their_tools(mcp_tools, everything_http, monkeypatch):
    monkeypatch.setenv("AGENTIK_TEST_SECRET", "do-not-leak")
    tools = await mcp_tools(
        TIME,
        everything("every", GREETING="hi from mcp.json"),
        ServerConfig("web", "http", url=everything_http, headers={"X-Agentik": "1"}),
    )
    assert tools.banner() == ["mcp: 28 tools from 3 servers"]
    by = {t.name: t for t in tools.tools}
    assert {"time__get_current_time", "time__convert_time", "every__echo", "web__echo"} <= set(by)
    spec = by["time__get_current_time"].spec
    assert spec.parameters["type"] == "object" and spec.parameters["required"] == ["timezone"]
    assert "timezone" in spec.description.lower()
    assert "$schema" not in by["every__echo"].spec.parameters  # JSON-schema draft marker dropped
    registry = ToolRegistry(tools.tools)

    text, error = await registry.invoke("time__get_current_time", '{"timezone": "UTC"}')
    assert not error and json.loads(text)["timezone"] == "UTC"
    assert await registry.invoke("every__echo", '{"message": "hi"}') == ("Echo: hi", False)
    assert await registry.invoke("web__echo", '{"message": "over http"}') == (
        "Echo: over http",
        False,
    )
    text, error = await registry.invoke("web__get-tiny-image", "{}")
    assert not error and "[image: image/png, 3.9 KB]" in text and "iVBOR" not in text
    text, _ = await registry.invoke("every__get-resource-reference", "{}")
    assert "[resource <demo://resource/dynamic/text/1> (text/plain)]\nResource 1:" in text
    text, _ = await registry.invoke("every__get-structured-content", '{"location": "Chicago"}')
    assert json.loads(text) == {
        "temperature": 36,
        "conditions": "Light rain / drizzle",
        "humidity": 82,
    }
    # a stdio child gets a minimal environment plus the entry's env, not agentik's secrets
    text, _ = await registry.invoke("every__get-env", "{}")
    env = json.loads(text)
    assert env["GREETING"] == "hi from mcp.json" and "PATH" in env
    assert "AGENTIK_TEST_SECRET" not in env


@needs_everything
async def test_an_sse_server(mcp_tools, tmp_path):
    proc, port = start_everything("sse", tmp_path / "everything-sse.log")
    try:
        url = f"http://127.0.0.1:{port}/sse"
        tools = await mcp_tools(ServerConfig("old", "sse", url=url))
        registry = ToolRegistry(tools.tools)
        assert await registry.invoke("old__echo", '{"message": "sse"}') == ("Echo: sse", False)
        await tools.aclose()
    finally:
        proc.terminate()
        proc.wait(10)


async def test_servers_that_fail_to_start_are_reported_and_skipped(tmp_path, caplog):
    from agentik_tools_mcp.servers import MCPTools

    path = tmp_path / "mcp.json"
    path.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "my time": {"command": sys.executable, "args": ["-m", "mcp_server_time"]},
                    "ghost": {"command": str(tmp_path / "no-such-server")},
                    "quits": {"command": sys.executable, "args": ["-c", "raise SystemExit(3)"]},
                    "hangs": {
                        "command": sys.executable,
                        "args": ["-c", "import time; time.sleep(60)"],
                    },
                    "broken": {"command": 42},
                }
            }
        )
    )
    before = set(children())
    caplog.set_level(logging.INFO, "agentik_tools_mcp")
    # mcp-server-time imports in ~2 s, several times that on a loaded machine
    tools = MCPTools.from_file(path, {}, start_timeout=12)
    began = time.monotonic()
    await tools.start(taken={"my_time__convert_time"})  # an in-agent tool has that name
    assert time.monotonic() - began < 12 + 3  # in parallel, bounded by the start timeout
    # names made valid and unique, and the renames logged
    assert [t.name for t in tools.tools] == ["my_time__get_current_time", "my_time__convert_time_2"]
    assert "the tools of 'my time' are exposed as my_time__<tool>" in caplog.text
    assert "tool 'convert_time' of 'my time' is exposed as 'my_time__convert_time_2'" in caplog.text
    lines = tools.banner()
    assert lines[0] == f"mcp: 2 tools from 1 servers in {path}"
    assert lines[1:] == [
        "mcp: skipped 'broken': \"command\" must be a string",
        f"mcp: skipped 'ghost': command not found: {tmp_path / 'no-such-server'}",
        "mcp: skipped 'quits': the server closed the connection (did the command exit? see its "
        "stderr)",
        "mcp: skipped 'hangs': no answer within 12 s",
    ]
    assert [s.state for s in tools.servers] == ["running", "failed", "failed", "failed"]
    await tools.aclose()  # waits for the hanging one too: closed stdin, then SIGTERM
    assert set(children()) <= before


async def test_tool_failures_become_error_results_not_exceptions(mcp_tools):
    tools = await mcp_tools(TIME)
    registry = ToolRegistry(tools.tools)
    # the tool reports an error (is_error)
    text, error = await registry.invoke("time__get_current_time", '{"timezone": "Nowhere/Land"}')
    assert error and text.startswith("Error: ") and "Nowhere/Land" in text
    # the server answers with a JSON-RPC error (MCPError)
    with pytest.raises(ToolError, match="MCP server 'time': Unknown tool: no_such_tool"):
        await tools.servers[0].call("no_such_tool", {})
    # and the server goes on
    assert not (await registry.invoke("time__get_current_time", '{"timezone": "UTC"}'))[1]


@needs_everything
async def test_a_tool_that_takes_too_long_times_out(mcp_tools):
    tools = await mcp_tools(everything(), call_timeout=1)
    registry = ToolRegistry(tools.tools)
    began = time.monotonic()
    text, error = await registry.invoke(
        "every__trigger-long-running-operation", '{"duration": 2, "steps": 2}'
    )
    assert error and "did not answer trigger-long-running-operation within 1 s" in text
    assert time.monotonic() - began < 3
    assert await registry.invoke("every__echo", '{"message": "still here"}') == (
        "Echo: still here",
        False,
    )


async def test_a_server_killed_between_calls_is_restarted_on_the_next_call(mcp_tools, caplog):
    caplog.set_level(logging.INFO, "agentik_tools_mcp")
    tools = await mcp_tools(TIME)
    server = tools.servers[0]
    registry = ToolRegistry(tools.tools)
    assert not (await registry.invoke("time__get_current_time", '{"timezone": "UTC"}'))[1]
    first = pid_of("mcp_server_time")
    os.kill(first, signal.SIGKILL)
    await eventually(lambda: server.state == "down")
    assert first not in children()  # reaped
    text, error = await registry.invoke("time__get_current_time", '{"timezone": "Asia/Tokyo"}')
    assert not error and json.loads(text)["timezone"] == "Asia/Tokyo"
    assert server.state == "running" and server.restarts == 1
    assert pid_of("mcp_server_time") != first
    logged = caplog.text
    assert "'time' closed the connection" in logged and "server 'time' restarted" in logged


@needs_everything
async def test_a_server_killed_during_a_call_fails_that_call_only(mcp_tools):
    tools = await mcp_tools(everything())
    registry = ToolRegistry(tools.tools)
    server = psutil.Process(pid_of(str(EVERYTHING)))
    read = server.io_counters().read_chars
    call = asyncio.ensure_future(
        registry.invoke("every__trigger-long-running-operation", '{"duration": 10, "steps": 10}')
    )
    await eventually(lambda: server.io_counters().read_chars > read)  # it got the call
    server.kill()
    text, error = await asyncio.wait_for(call, 5)
    assert error and "closed the connection during the call" in text
    assert await registry.invoke("every__echo", '{"message": "back"}') == ("Echo: back", False)


async def test_restarts_back_off_while_the_server_cannot_start(mcp_tools, tmp_path):
    marker = tmp_path / "broken"
    script = 'test -e "$1" && exit 1; exec "$2" -m mcp_server_time'
    args = ("-c", script, "sh", str(marker), sys.executable)
    flaky = ServerConfig("flaky", "stdio", command="sh", args=args)
    tools = await mcp_tools(flaky, backoff=(1.0, 2.0))
    server = tools.servers[0]
    registry = ToolRegistry(tools.tools)
    marker.touch()  # from now on the command exits at once
    os.kill(pid_of("mcp_server_time"), signal.SIGKILL)
    await eventually(lambda: server.state == "down")
    text, error = await registry.invoke("flaky__get_current_time", '{"timezone": "UTC"}')
    assert error and "failed to restart" in text
    text, error = await registry.invoke("flaky__get_current_time", '{"timezone": "UTC"}')
    assert error and "the next restart is in" in text  # no restart storm
    marker.unlink()
    deadline = time.monotonic() + 10
    while (result := await registry.invoke("flaky__get_current_time", '{"timezone": "UTC"}'))[1]:
        assert time.monotonic() < deadline, result
        await asyncio.sleep(0.05)
    assert server.state == "running" and server.restarts >= 2


class ToolCallingLLM(ScriptedLLM):
    """Asks for the tool named in the user's text (``tool {json args}``), then says the result."""

    calls = 0

    def default(self, inputs: Any) -> Any:
        last = inputs[-1]
        if isinstance(last, UserInput):
            self.calls += 1
            name, _, args = last.text.partition(" ")
            return [ToolCallRequest(f"call-{self.calls}", name, args)]
        assert isinstance(last, ToolResultInput)
        return [f"result: {last.text}"]


@needs_everything
async def test_twenty_parallel_tool_calls_across_conversations(
    mcp_tools, make_agent, everything_http
):
    tools = await mcp_tools(TIME, everything(), ServerConfig("web", "http", url=everything_http))
    agent = await make_agent(ToolCallingLLM(), tools=tools.tools)
    convs = [await agent.create_conversation() for _ in range(20)]
    asks = []
    for i in range(len(convs)):
        if i % 3 == 0:
            asks.append(("time__get_current_time", {"timezone": ["UTC", "Asia/Tokyo"][i % 2]}))
        else:
            asks.append((["every__echo", "web__echo"][i % 2], {"message": f"conversation {i}"}))
    turns = [asyncio.ensure_future(collect_turn(conv, timeout=30)) for conv in convs]
    await asyncio.sleep(0)
    await asyncio.gather(
        *(c.send([TextPart(f"{n} {json.dumps(a)}")]) for c, (n, a) in zip(convs, asks, strict=True))
    )
    for events, (name, args) in zip(await asyncio.gather(*turns), asks, strict=True):
        result = next(e for e in events if e.type == "ToolResult")
        assert not result.is_error, result.text
        if name.startswith("time"):
            assert json.loads(result.text)["timezone"] == args["timezone"]
        else:
            assert result.text == f"Echo: {args['message']}"
    for conv in convs:
        kinds = [m.kind for m in await conv.get_messages()]
        assert kinds == ["user", "tool_call", "tool_result", "assistant"]


async def test_a_broken_config_file_stops_start_up(tmp_path):
    import agentik_tools_mcp
    from agentik.core.app import StartupError
    from agentik.core.testing import make_app

    (tmp_path / "mcp.json").write_text("{not json")
    app = make_app(
        plugins=[("agentik_tools_mcp", agentik_tools_mcp)],
        env={"AGENTIK_MCP_CONFIG": str(tmp_path / "mcp.json")},
    )
    from aiohttp.test_utils import TestServer

    server = TestServer(app)
    with pytest.raises(StartupError, match=r"AGENTIK_MCP_CONFIG: .*not valid JSON"):
        await server.start_server()
    await server.close()


# --- agentik plugins: each server, its state and its tools ------------------------------------


async def test_plugin_details_start_report_and_close_every_server(tmp_path):
    import agentik_tools_mcp
    from agentik.core.app import load_settings
    from agentik.core.cli import plugin_details
    from agentik.core.testing import test_plugins

    path = tmp_path / "mcp.json"
    path.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "time": {"command": sys.executable, "args": ["-m", "mcp_server_time"]},
                    "ghost": {"command": str(tmp_path / "no-such-server")},
                    "quits": {"command": sys.executable, "args": ["-c", "raise SystemExit(3)"]},
                    "broken": {"command": 42},
                }
            }
        )
    )
    plugins = test_plugins([("agentik_tools_mcp", agentik_tools_mcp)], builtins=[])
    before = set(children())
    settings = load_settings(plugins, {"AGENTIK_MCP_CONFIG": str(path)})
    details = (await plugin_details(plugins, settings))["agentik_tools_mcp"]
    assert set(children()) <= before  # every server stopped and reaped before it returns
    assert details == {
        "config": str(path),
        "servers": {
            "time": {
                "state": "ok",
                "error": None,
                "tools": ["time__get_current_time", "time__convert_time"],
            },
            "ghost": {
                "state": "failed",
                "error": f"command not found: {tmp_path / 'no-such-server'}",
                "tools": [],
            },
            "quits": {
                "state": "failed",
                "error": "the server closed the connection (did the command exit? see its stderr)",
                "tools": [],
            },
            "broken": {"state": "skipped", "error": '"command" must be a string', "tools": []},
        },
    }
    # no config, no details (and nothing started); a broken file is reported, not raised
    assert await plugin_details(plugins, load_settings(plugins, {})) == {}
    path.write_text("{nope")
    details = (await plugin_details(plugins, settings))["agentik_tools_mcp"]
    assert details["config"] == str(path) and "not valid JSON" in details["error"]


def test_agentik_plugins_lists_the_servers_and_leaves_no_child(tmp_path):
    mark = f"agentik-plugins-test-{os.getpid()}-{tmp_path.name}"
    path = tmp_path / "mcp.json"
    entries = {
        "time": {"command": "${PYTHON}", "args": ["-m", "mcp_server_time"]},
        "quits": {"command": "${PYTHON}", "args": ["-c", "raise SystemExit(3)"]},
        # a server that never answers is stopped too: stdin closed, then SIGTERM
        "hangs": {"command": "${PYTHON}", "args": ["-c", "import time; time.sleep(60)"]},
    }
    for entry in entries.values():
        entry["env"] = {"AGENTIK_TEST_MARK": mark}  # finds the children once they are orphans
    path.write_text(json.dumps({"mcpServers": entries}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTIK_", "OPENAI_"))}
    env |= {
        "AGENTIK_MCP_CONFIG": str(path),
        "AGENTIK_MCP_START_TIMEOUT": "15",  # mcp-server-time imports in ~2 s (more when loaded)
        "PYTHON": sys.executable,
    }
    out = subprocess.run(
        [str(BIN / "agentik"), "plugins", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    report = {p["name"]: p for p in json.loads(out.stdout)["plugins"]}
    details = report["agentik_tools_mcp"]["details"]
    assert details["config"] == str(path)
    servers = details["servers"]
    assert servers["time"]["state"] == "ok" and servers["time"]["error"] is None
    assert "time__get_current_time" in servers["time"]["tools"]
    assert servers["quits"] == {
        "state": "failed",
        "error": "the server closed the connection (did the command exit? see its stderr)",
        "tools": [],
    }
    assert servers["hangs"] == {"state": "failed", "error": "no answer within 15 s", "tools": []}
    left = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.environ().get("AGENTIK_TEST_MARK") == mark:
                left.append((p.pid, p.status(), " ".join(p.cmdline())))
    assert not left, f"MCP server processes left behind: {left}"


# --- end to end: agentik serve, the fake OpenAI server, real MCP servers ----------------------


async def test_end_to_end_through_agentik_serve(serve, fake_openai_proc, tmp_path):
    config = tmp_path / "mcp.json"
    config.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "time": {"command": "${PYTHON}", "args": ["-m", "mcp_server_time"]},
                    "ghost": {"command": "/no/such/mcp-server"},
                    "broken": {"url": "not a url"},
                }
            }
        )
    )
    proc, base = serve(
        {
            "OPENAI_BASE_URL": fake_openai_proc,
            "OPENAI_API_KEY": "sk-test",
            "OPENAI_MODEL": "fake-model",
            "OPENAI_MAX_RETRIES": "0",
            "AGENTIK_MCP_CONFIG": str(config),
            "PYTHON": sys.executable,
        }
    )
    output = proc.wait_output("tokens:")
    assert f"mcp: 2 tools from 1 servers in {config}" in output  # which file was loaded
    assert "mcp: skipped 'ghost': command not found: /no/such/mcp-server" in output
    assert "mcp: skipped 'broken'" in output
    assert "tools: 2 (time__get_current_time, time__convert_time)" in output
    servers = psutil.Process(proc.proc.pid).children(recursive=True)
    assert any("mcp_server_time" in " ".join(p.cmdline()) for p in servers)

    await script_fake(
        fake_openai_proc,
        {"tool_calls": [["time__get_current_time", {"timezone": "Europe/Paris"}]]},
        {"text": "It is late in Paris."},
    )
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{base}/agentik/conversations") as r:
            cid = (await r.json())["id"]
        events = await s.get(f"{base}/agentik/conversations/{cid}/events")
        body = [{"type": "text", "body": "what time is it in Paris?"}]
        async with s.post(f"{base}/agentik/conversations/{cid}/messages", json=body) as r:
            assert r.status == 202
        frames = (await read_sse(events, timeout=20))[1:]  # after the UserMessage
        events.close()
        kinds = [f["event"] for f in frames]
        assert kinds[:2] == ["ToolCall", "ToolResult"] and kinds[-1] == "End"
        call, result = frames[0]["data"], frames[1]["data"]
        assert call["toolName"] == "time__get_current_time"
        assert result["callId"] == call["callId"] and result["isError"] is False
        assert json.loads(result["text"])["timezone"] == "Europe/Paris"
        # the result reached the model, linked to its call; the model saw the MCP tool
        async with s.get(fake_openai_proc.removesuffix("/v1") + "/_fake/requests") as r:
            sent = await r.json()
        tool_msg = sent[-1]["messages"][-1]
        assert tool_msg["role"] == "tool" and tool_msg["tool_call_id"] == call["callId"]
        assert json.loads(tool_msg["content"])["timezone"] == "Europe/Paris"
        offered = {t["function"]["name"]: t["function"] for t in sent[0]["tools"]}
        assert offered["time__get_current_time"]["parameters"]["required"] == ["timezone"]
        # the history holds the pair, linked by tool_call_id
        async with s.get(f"{base}/agentik/conversations/{cid}/messages") as r:
            items = (await r.json())["items"]
        assert [m["type"] for m in items] == ["user", "tool_call", "tool_result", "assistant"]
        assert items[2]["toolCallId"] == items[1]["id"]

    # shutdown closes the session: the server process is gone and reaped, nothing left behind
    assert proc.stop() == 0
    deadline = time.monotonic() + 5
    while left := [p for p in servers if psutil.pid_exists(p.pid)]:
        assert time.monotonic() < deadline, f"left behind: {[(p.pid, p.status()) for p in left]}"
        await asyncio.sleep(0.02)


async def test_a_stray_mcp_json_is_not_read(serve, fake_openai_proc, tmp_path):
    """A ./mcp.json in the folder the server starts from runs nothing unless
    AGENTIK_MCP_CONFIG names it (the seeds: unset means MCP off); the banner says it is
    there and how to load it, and `agentik plugins` shows the setting as `off`."""
    folder = tmp_path / "here"
    folder.mkdir()
    marker = tmp_path / "it-ran"
    code = f"open({str(marker)!r}, 'w').close()"
    (folder / "mcp.json").write_text(
        json.dumps({"mcpServers": {"stray": {"command": sys.executable, "args": ["-c", code]}}})
    )
    env = {
        "OPENAI_BASE_URL": fake_openai_proc,
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_MODEL": "fake-model",
    }
    proc, _ = serve(env, cwd=folder)
    output = proc.wait_output("tokens:")
    assert "mcp: off (./mcp.json is not read: AGENTIK_MCP_CONFIG=mcp.json loads it)" in output
    assert "tools: 0" in output and not marker.exists()
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTIK_", "OPENAI_"))}
    plugins = await asyncio.create_subprocess_exec(
        str(BIN / "agentik"), "plugins", env=clean, cwd=folder, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(plugins.communicate(), 60)
    assert plugins.returncode == 0
    assert "  AGENTIK_MCP_CONFIG=off  (default: off) " in out.decode()
    assert not marker.exists()
