"""One test per hook (a test fails when a hook has none), and every hook documented."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from agentik import hookimpl
from agentik.core.app import AGENT, registries
from agentik.core.cli import banner
from agentik.core.llm import HistoryItem, ToolCallRequest
from agentik.core.plugins import Plugins
from agentik.core.settings import Setting, parse_positive_int
from agentik.core.testing import ScriptedLLM, make_app, test_plugins
from agentik.core.tools import ToolSpec, tool
from agentik.core.turns import TurnState, Wait
from agentik.core.types import TextPart

DOCS = Path(__file__).resolve().parent.parent / "docs" / "plugin_hooks.md"
HOOKS = sorted(name for name in dir(Plugins().pm.hook) if not name.startswith("_"))


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_has_a_test(hook):
    assert f"test_hook_{hook}" in globals(), f"no test_hook_{hook} in {__file__}"


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_is_documented_with_its_signature(hook):
    caller = getattr(Plugins().pm.hook, hook)
    signature = f"{hook}({', '.join(caller.spec.argnames)})"
    assert f"## {signature}" in DOCS.read_text(), f"docs/plugin_hooks.md lacks '## {signature}'"


def test_documented_hooks_all_exist():
    documented = re.findall(r"^## (\w+)\(", DOCS.read_text(), re.MULTILINE)
    assert sorted(documented) == HOOKS


async def run_turn(app, text: str = "hi"):
    agent = app[AGENT]
    conv = await agent.create_conversation()
    await conv.send([TextPart(text)])
    await conv.wait_idle()
    return conv


def test_hook_register_settings():
    class P:
        @hookimpl
        def register_settings(self, register):
            register(Setting("MY_LIMIT", 3, parse_positive_int, "A limit."))

    app = make_app(plugins=[("p", P())], env={"MY_LIMIT": "7"})
    from agentik.core.app import SETTINGS

    assert app[SETTINGS]["MY_LIMIT"] == 7
    assert app[SETTINGS].declared["MY_LIMIT"].plugin == "p"


def test_hook_register_llm_backends():
    class P:
        @hookimpl
        def register_llm_backends(self, register):
            register("scripted", lambda settings: ScriptedLLM(["fixed"]))

    plugins = test_plugins([("p", P())])
    backend = registries(plugins)["llm"].get("scripted", variable="AGENTIK_LLM_BACKEND")
    assert isinstance(backend.factory(None), ScriptedLLM) and backend.plugin == "p"


def test_hook_register_memory_backends():
    class P:
        @hookimpl
        def register_memory_backends(self, register):
            register("notes", lambda settings: {"kind": "notes"}, aliases=("md2",))

    reg = registries(test_plugins([("p", P())]))["memory"]
    assert reg.get("md2", variable="AGENTIK_MEMORY_BACKEND").factory(None) == {"kind": "notes"}


def test_hook_register_embedding_backends():
    class P:
        @hookimpl
        def register_embedding_backends(self, register):
            register("hash", lambda settings: "hash-embedder")

    reg = registries(test_plugins([("p", P())]))["embedding"]
    assert reg.get("hash", variable="AGENTIK_EMBEDDING_BACKEND").factory(None) == "hash-embedder"


async def test_hook_register_transports(aiohttp_client):
    from aiohttp import web

    class P:
        @hookimpl
        def register_transports(self, register):
            async def ping(request):
                return web.json_response({"agent": request.app[AGENT].id})

            register("ping", lambda app, agent, settings: app.router.add_get("/ping", ping))

    client = await aiohttp_client(make_app(plugins=[("p", P())], builtins=[]))
    assert (await (await client.get("/ping")).json()) == {"agent": "agentik"}
    assert (await client.get("/agentik/conversations")).status == 404  # http transport not loaded


async def test_hook_register_tools(aiohttp_client):
    from agentik.core.llm import ToolCallRequest

    class P:
        @hookimpl
        def register_tools(self, register, settings):
            register(tool(lambda text: text[::-1], name="reverse", description="Reverse."))

    llm = ScriptedLLM([ToolCallRequest("c1", "reverse", '{"text": "abc"}')], ["ok"])
    app = make_app(llm=llm, plugins=[("p", P())])
    client = await aiohttp_client(app)
    await run_turn(app)
    assert app[AGENT].tools.names() == ["reverse"]
    assert llm.received[1][0].text == "cba"
    assert client is not None


async def test_hook_register_prompt_sections(aiohttp_client):
    class P:
        @hookimpl
        def register_prompt_sections(self, register):
            register("soul", lambda: "You are Ada.", order=0)
            register("later", lambda: "Skills: none.", order=200)

    llm = ScriptedLLM()
    app = make_app(llm=llm, plugins=[("p", P())], env={"AGENTIK_SYSTEM_PROMPT": "Be brief."})
    await aiohttp_client(app)
    await run_turn(app)
    assert llm.prompts == ["You are Ada.\n\nBe brief.\n\nSkills: none."]


async def test_hook_register_jobs(aiohttp_client):
    runs: list[str] = []
    ticked = asyncio.Event()

    class P:
        @hookimpl
        def register_jobs(self, register, agent):
            async def once():
                runs.append(f"once:{agent.id}")

            async def tick():
                runs.append("tick")
                ticked.set()

            async def broken():
                raise RuntimeError("logged, not raised")

            register("once", once)
            register("tick", tick, interval=0.01)
            register("broken", broken, interval=0.01)

    app = make_app(plugins=[("p", P())])
    client = await aiohttp_client(app)
    await asyncio.wait_for(ticked.wait(), 5)
    assert runs[0] == "once:agentik" and "tick" in runs
    assert (await client.get("/health")).status == 200


async def test_hook_register_observers(aiohttp_client):
    from agentik.core.observe import Observer

    seen: list[tuple[str, str]] = []

    class Watcher(Observer):
        def start(self, span):
            seen.append(("start", span.name))

        def end(self, span):
            seen.append(("end", span.name))

    class P:
        @hookimpl
        def register_observers(self, register, agent, settings):
            assert agent.id == "agentik" and "AGENTIK_DB_PATH" in settings
            register(Watcher())

    app = make_app(plugins=[("p", P())])
    await aiohttp_client(app)
    await run_turn(app)
    assert seen == [
        ("start", "invoke_agent agentik"),
        ("start", "chat echo"),
        ("end", "chat echo"),
        ("end", "invoke_agent agentik"),
    ]


async def test_hook_before_turn(aiohttp_client):
    class P:
        @hookimpl
        def before_turn(self, conversation, text):
            async def recall():
                return f"[Memory context: {conversation.id} asked about {text}]"

            return recall()

    class Broken:
        @hookimpl
        def before_turn(self):
            raise RuntimeError("prefetch down")

    llm = ScriptedLLM()
    app = make_app(llm=llm, plugins=[("p", P())])
    await aiohttp_client(app)
    conv = await run_turn(app, "cats")
    assert llm.received[0][0].text == f"[Memory context: {conv.id} asked about cats]\n\ncats"
    # working memory keeps the user's text without the per-turn context block
    memory = await app[AGENT].store.list_memory(conv.id)
    assert memory[0].item.text == "cats"

    llm2 = ScriptedLLM()
    app2 = make_app(llm=llm2, plugins=[("b", Broken())])
    await aiohttp_client(app2)
    await run_turn(app2, "dogs")
    assert llm2.received[0][0].text == "dogs"  # a failing hook never kills the turn


async def test_hook_after_turn(aiohttp_client):
    seen: list[tuple[str, str]] = []
    reviewed = asyncio.Event()

    class P:
        @hookimpl
        def after_turn(self, user_text, assistant_text):
            async def review():
                seen.append((user_text, assistant_text))
                reviewed.set()

            return review()

    app = make_app(llm=ScriptedLLM(["fine"]), plugins=[("p", P())])
    await aiohttp_client(app)
    await run_turn(app, "how are you")
    await asyncio.wait_for(reviewed.wait(), 5)
    assert seen == [("how are you", "fine")]


async def test_hook_tool_call_gate(aiohttp_client):
    """A held call makes its turn wait, with no task, until resume_turn answers it; then it
    runs."""
    ran: list[dict] = []

    @tool
    def launch(target: str) -> str:
        ran.append({"target": target})
        return f"launched at {target}"

    class Gate:
        @hookimpl
        def tool_call_gate(self, conversation, call):
            return Wait("", "check", {"tool": call.name}) if call.name == "launch" else None

    llm = ScriptedLLM([ToolCallRequest("c1", "launch", '{"target": "moon"}')], ["done"])
    app = make_app(llm=llm, plugins=[("gate", Gate()), ("t", _tools(launch))])
    await aiohttp_client(app)
    conv = await run_turn(app, "go")
    turn = (await conv.store.open_turns(conv.id))[0]
    assert turn.state is TurnState.WAITING and ran == [] and not conv.inbox.running
    assert [(w.call_id, w.kind, w.request) for w in turn.waits] == [
        ("c1", "check", {"tool": "launch"})
    ]
    await conv.resume_turn(turn.id, "c1", {"approve": True})
    await conv.wait_idle()
    assert ran == [{"target": "moon"}]
    assert (await conv.turn(turn.id)).state is TurnState.DONE


async def test_hook_tool_call_answer(aiohttp_client):
    """The answer's verdict: a call with other arguments, or a result instead of the call."""
    ran: list[str] = []

    @tool
    def launch(target: str) -> str:
        ran.append(target)
        return f"launched at {target}"

    class Gate:
        @hookimpl
        def tool_call_gate(self, call):
            return Wait("", "check")

        @hookimpl
        def tool_call_answer(self, call, wait):
            if wait.answer == "deny":
                return "Denied by a person.", True
            return ToolCallRequest(call.call_id, call.name, json.dumps({"target": wait.answer}))

    calls = [ToolCallRequest("a", "launch", '{"target": "moon"}'),
             ToolCallRequest("b", "launch", '{"target": "sun"}')]  # fmt: skip
    llm = ScriptedLLM(calls, ["done"])
    app = make_app(llm=llm, plugins=[("gate", Gate()), ("t", _tools(launch))])
    await aiohttp_client(app)
    conv = await run_turn(app, "go")
    turn = (await conv.store.open_turns(conv.id))[0]
    await conv.resume_turn(turn.id, "b", "deny")
    assert (await conv.turn(turn.id)).state is TurnState.WAITING  # a still waits
    await conv.resume_turn(turn.id, "a", "mars")
    await conv.wait_idle()
    assert ran == ["mars"]
    results = [m.payload for m in await conv.get_messages() if m.kind == "tool_result"]
    assert [(r["callId"], r["text"], r["isError"]) for r in results] == [
        ("a", "launched at mars", False),
        ("b", "Denied by a person.", True),
    ]


async def test_hook_turn_tools(aiohttp_client, caplog):
    """A turn's own tools are offered beside the agent's for that turn only; a call to one
    waits for its result (no gate is asked), which the model then gets."""
    asked: list[str] = []

    @tool
    def launch(target: str) -> str:
        return f"launched at {target}"

    class FrontEnd:
        @hookimpl
        def turn_tools(self, turn):
            if "choose" not in turn.user.payload["content"][0]["body"]:
                return None
            pick = ToolSpec("pick_colour", "Let the user pick a colour")
            return [pick, ToolSpec("launch", "taken: the agent has it"), ToolSpec("a b", "bad")]

        @hookimpl
        def tool_call_gate(self, call):
            asked.append(call.name)
            return Wait("", "check")

    llm = ScriptedLLM([ToolCallRequest("c1", "pick_colour", "{}")], ["blue it is"], ["plain"])
    plugins = [("front", FrontEnd()), ("t", _tools(launch))]
    app = make_app(llm=llm, plugins=plugins)
    await aiohttp_client(app)
    conv = await run_turn(app, "choose a colour")
    assert llm.offered[-1] == ["launch", "pick_colour"]
    assert "turn tool 'launch' of plugin front left out" in caplog.text
    turn = (await conv.store.open_turns(conv.id))[0]
    assert [(w.call_id, w.kind, w.request) for w in turn.waits] == [
        ("c1", "client_tool", {"toolName": "pick_colour", "argsJson": "{}"})
    ]
    assert asked == []  # the front end's call is the front end's: no gate holds it
    await conv.resume_turn(turn.id, "c1", {"result": "blue", "isError": False})
    await conv.wait_idle()
    results = [m.payload for m in await conv.get_messages() if m.kind == "tool_result"]
    assert [(r["callId"], r["text"], r["isError"]) for r in results] == [("c1", "blue", False)]
    await conv.send([TextPart("thanks")])
    await conv.wait_idle()
    assert llm.offered[-1] == ["launch"]  # the next turn has none of its own


def _tools(*tools):
    class Tools:
        @hookimpl
        def register_tools(self, register):
            for t in tools:
                register(t)

    return Tools()


async def test_hook_before_compaction(aiohttp_client, caplog):
    seen: list[tuple[str, list[str]]] = []
    both_started = asyncio.Event()

    class Reviewer:
        @hookimpl
        def before_compaction(self, conversation, items):
            async def review():
                seen.append((conversation.id, [i.text for i in items]))
                if len(seen) == 2:
                    both_started.set()
                await asyncio.wait_for(both_started.wait(), 5)  # the two run at the same time

            return review()

    class Broken:
        @hookimpl
        def before_compaction(self, items):
            raise RuntimeError("boom")

    class BrokenLater:
        @hookimpl
        def before_compaction(self, items):
            async def fail():
                raise RuntimeError("late boom")

            return fail()

    app = make_app(
        plugins=[
            ("r1", Reviewer()),
            ("broken", Broken()),
            ("r2", Reviewer()),
            ("bl", BrokenLater()),
        ]
    )
    await aiohttp_client(app)
    agent = app[AGENT]
    conv = await agent.create_conversation()
    items = [HistoryItem("user", "old question"), HistoryItem("assistant", "old answer")]
    await agent.before_compaction(conv, items)
    assert seen == [(conv.id, ["old question", "old answer"])] * 2
    assert f"before_compaction of plugin broken in {conv.id} failed: RuntimeError" in caplog.text
    assert f"before_compaction of plugin bl in {conv.id} failed: RuntimeError" in caplog.text


async def test_hook_compact_context(aiohttp_client):
    from agentik.core.llm import CONTEXT_LENGTH, LLMError

    calls: list[tuple[int, bool]] = []
    limit = [60]

    class Compactor:
        @hookimpl
        def compact_context(self, conversation, context_tokens, forced):
            calls.append((context_tokens, forced))
            if context_tokens < limit[0] and not forced:
                return None

            async def summarize(items):
                return f"{len(items)} old entries"

            return conversation.compact(summarize)

    llm = ScriptedLLM(*[[f"answer {i}"] for i in range(6)])
    app = make_app(llm=llm, plugins=[("c", Compactor())])
    await aiohttp_client(app)
    agent = app[AGENT]
    conv = await agent.create_conversation()
    for i in range(6):
        await conv.send([TextPart(f"question number {i}")])
        await conv.wait_idle()
    # the running estimate grows by each turn; it reaches 60 at the 4th turn, but there is
    # something to summarise (beyond the last 4 whole turns) only at the 6th
    assert [forced for _, forced in calls] == [False] * 6
    assert calls[0][0] < calls[1][0] < calls[2][0] < 60 <= calls[3][0]
    assert conv.compactions == 1
    history = llm.conversations[-1].history
    assert history[0] == HistoryItem("summary", "2 old entries")
    assert [h.text for h in history[1:] if h.role == "user"] == [
        f"question number {i}" for i in range(1, 5)
    ]

    # the endpoint refuses the step as too long: one forced compaction, one retry
    limit[0] = 10_000
    llm.steps = [LLMError("context too long", CONTEXT_LENGTH), ["fits now"]]
    await conv.send([TextPart("one more")])
    await conv.wait_idle()
    assert calls[-2:] == [(calls[-2][0], False), (calls[-2][0], True)]
    assert conv.compactions == 2
    messages = await conv.get_messages(limit=100)
    assert messages[-1].kind == "assistant", messages[-1].payload
    assert messages[-1].payload["text"] == "fits now"


async def test_hook_register_debug_actions(aiohttp_client):
    class P:
        @hookimpl
        def register_debug_actions(self, register, agent, settings):
            async def count(conversation):
                return {
                    "conversationId": conversation.id,
                    "turns": await conversation.count_turns(),
                }

            async def ping():
                return {"agent": agent.id, "port": settings["AGENTIK_PORT"]}

            register("count", count)
            register("ping", ping, conversation=False)
            register("mine", None, off="MY_MINING_INTERVAL")

    app = make_app(
        plugins=[("p", P())],
        builtins=["agentik_transport_http", "agentik_debug"],
        env={"AGENTIK_DEBUG_ENDPOINTS": "1"},
    )
    client = await aiohttp_client(app)
    conv = await run_turn(app)
    r = await client.post("/debug/count", params={"conversationId": conv.id})
    assert await r.json() == {"conversationId": conv.id, "turns": 1}
    assert await (await client.post("/debug/ping")).json() == {"agent": "agentik", "port": 8080}
    r = await client.post("/debug/mine", params={"conversationId": conv.id})
    assert r.status == 409 and "MY_MINING_INTERVAL" in (await r.json())["error"]["message"]


async def test_hook_banner_lines(aiohttp_client):
    class P:
        @hookimpl
        def banner_lines(self, agent, settings):
            return [f"mcp: 0 tools from 0 servers ({agent.id})"]

    app = make_app(plugins=[("p", P())])
    await aiohttp_client(app)
    lines = await banner(app, "127.0.0.1", 8080)
    assert lines[0] == "agentik listening on http://127.0.0.1:8080 (this machine only; no API key)"
    assert "  GET  /health" in lines
    assert "  mcp: 0 tools from 0 servers (agentik)" in lines
    assert any(line.startswith("  POST /agentik/conversations") for line in lines)
    assert lines[-1] == "  tokens: 0 convs, 0 turns, in=0, out=0, total=0"


async def test_hook_register_services(aiohttp_client):
    import contextlib

    from aiohttp.test_utils import TestServer

    from agentik.core.plugins import PluginError

    log: list[str] = []

    class P:
        @hookimpl
        def register_services(self, register, agent):
            @contextlib.asynccontextmanager
            async def discovered_tools():
                log.append("start")
                agent.tools.add(tool(lambda: "pong", name="ping", description="Ping."))
                yield
                log.append("stop")

            register("pinger", discovered_tools)

    app = make_app(plugins=[("p", P())])
    server = TestServer(app)
    await server.start_server()
    assert log == ["start"] and app[AGENT].tools.names() == ["ping"]
    await server.close()
    assert log == ["start", "stop"]

    class Broken:
        @hookimpl
        def register_services(self, register):
            @contextlib.asynccontextmanager
            async def nope():
                raise RuntimeError("no such server")
                yield

            register("broken", nope)

    with pytest.raises(
        PluginError,
        match="plugin b: starting service 'broken' failed: RuntimeError: no such server",
    ):
        await TestServer(make_app(plugins=[("b", Broken())])).start_server()


async def test_hook_plugin_details():
    from agentik.core.app import load_settings
    from agentik.core.cli import plugin_details

    class P:
        @hookimpl
        def plugin_details(self, settings):
            async def probe():
                return {"servers": {"time": {"state": "ok", "port": settings["AGENTIK_PORT"]}}}

            return probe()

    class Broken:
        @hookimpl
        def plugin_details(self):
            raise RuntimeError("cannot tell")

    plugins = test_plugins([("p", P()), ("b", Broken())], builtins=[])
    details = await plugin_details(plugins, load_settings(plugins, {}))
    assert details == {
        "p": {"servers": {"time": {"state": "ok", "port": 8080}}},
        "b": {"error": "RuntimeError: cannot tell"},
    }


def test_hook_register_commands(capsys):
    from agentik.core.cli import main

    class P:
        @hookimpl
        def register_commands(self, register):
            def setup(parser):
                parser.add_argument("name")

            def run(args, settings):
                print(f"hello {args.name} on port {settings['AGENTIK_PORT']}")
                return 3

            register("greet", setup, run, help="say hello")

    class Clash:
        @hookimpl
        def register_commands(self, register):
            register("serve", lambda parser: None, lambda args, settings: 0)

    plugins = test_plugins([("p", P())])
    assert main(["greet", "you"], plugins) == 3
    assert capsys.readouterr().out == "hello you on port 8080\n"
    with pytest.raises(SystemExit):
        main(["greet", "--help"], plugins)
    assert "usage: agentik greet [-h] name" in capsys.readouterr().out
    assert main(["x"], test_plugins([("c", Clash())])) == 2
    assert "plugin c: register_commands failed" in capsys.readouterr().err
