"""Issue #28: the ways a plugin author breaks a plugin, each through the real entry-point path.

Every broken plugin below is a module of one throwaway distribution (``agentik-breakages``,
pip-installed once for this file) and is loaded next to ``br_healthy``, which uses every kind
of hook. Each breakage must give **one line naming the plugin**:

- ``RUNS`` rows: the agent starts and runs a turn; the log has that line (and no other problem
  line), and ``br_healthy``'s tool, prompt section, context block, banner line and job all still
  work: the other plugins keep working.
- ``STOPS`` rows: start-up must not go on (a selected backend that cannot be built, a plugin
  whose start-up hook raises, a conflict someone must settle); ``agentik serve`` exits with
  status 2 and that one line, no traceback.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agentik.core.app import create_app, load_settings, running
from agentik.core.cli import banner, main
from agentik.core.llm import ToolCallRequest
from agentik.core.plugins import StartupError, make_plugins
from agentik.core.settings import undeclared_variables
from agentik.core.testing import run_turn
from tests.test_plugins import install_plugins

DIST = "agentik-breakages"

HEALTHY = """
    import asyncio

    from agentik.api import ScriptedLLM, hookimpl, tool

    @hookimpl
    def register_llm_backends(register):
        register("healthy", lambda settings: ScriptedLLM())

    @hookimpl
    def register_tools(register):
        @tool
        def healthy_tool(x: int = 1) -> str:
            "A tool that works."
            return str(x)

        register(healthy_tool)

    @hookimpl
    def register_prompt_sections(register):
        register("healthy", lambda: "HEALTHY SECTION", order=300)

    @hookimpl
    def before_turn(text):
        return "[healthy context]"

    @hookimpl
    def banner_lines():
        return ["healthy: up"]

    @hookimpl
    def register_jobs(register, agent):
        async def tick():
            agent.state["healthy_ticks"] = agent.state.get("healthy_ticks", 0) + 1

        register("tick", tick, interval=0.02)
"""

#: module name -> source; the entry point of each is its module's name, except where noted
SOURCES = {
    "br_healthy": HEALTHY,
    # --- loading ----------------------------------------------------------------------------
    "br_import_missing": "import no_such_sdk_xyz",
    "br_import_raises": "raise RuntimeError('config file missing')",
    "br_misspelt_hook": """
        from agentik.api import hookimpl

        @hookimpl
        def register_tool(register):
            pass
    """,
    "br_async_hook": """
        from agentik.api import hookimpl

        @hookimpl
        async def before_turn(text):
            return "never awaited"
    """,
    "br_wrong_argument": """
        from agentik.api import hookimpl

        @hookimpl
        def before_turn(conv, text):
            return None
    """,
    "br_api_too_new": """
        from agentik.api import require_api

        require_api("9.0")
    """,
    "br_clash": """
        from agentik.api import hookimpl

        @hookimpl
        def banner_lines():
            return ["clash: loaded"]
    """,
    "br_dir_twin": """
        from agentik.api import hookimpl

        @hookimpl
        def banner_lines():
            return ["twin: installed"]
    """,
    # --- settings ---------------------------------------------------------------------------
    "br_settings_raise": """
        from agentik.api import hookimpl

        @hookimpl
        def register_settings(register):
            raise RuntimeError("settings file unreadable")
    """,
    "br_settings_conflict": """
        from agentik.api import Setting, hookimpl, parse_port

        @hookimpl
        def register_settings(register):
            register(Setting("AGENTIK_PORT", 9999, parse_port, "My own port."))
    """,
    "br_settings_not_a_setting": """
        from agentik.api import hookimpl

        @hookimpl
        def register_settings(register):
            register("HEARTBEAT_INTERVAL")
    """,
    "br_prefix_typo": """
        from agentik.api import Setting, SettingPrefix, hookimpl, parse_positive_int

        @hookimpl
        def register_settings(register):
            register(Setting("HEARTBEAT_INTERVAL", 60, parse_positive_int, "Seconds."))
            register(SettingPrefix("HEARTBEAT_"))
    """,
    # --- backends ---------------------------------------------------------------------------
    "br_backend_twin_a": """
        from agentik.api import EchoLLM, hookimpl

        @hookimpl
        def register_llm_backends(register):
            register("twin", lambda settings: EchoLLM())
    """,
    "br_backend_twin_b": """
        from agentik.api import EchoLLM, hookimpl

        @hookimpl
        def register_llm_backends(register):
            register("twin", lambda settings: EchoLLM())
    """,
    "br_factory_raises": """
        from agentik.api import hookimpl

        def make(settings):
            raise RuntimeError("no GPU here")

        @hookimpl
        def register_llm_backends(register):
            register("boom", make)
    """,
    "br_factory_missing_dep": """
        from agentik.api import hookimpl

        @hookimpl
        def register_llm_backends(register):
            register("fancy", lambda s: None, requires=("no_such_sdk_xyz",), extra="gpu")
    """,
    "br_factory_wrong_type": """
        from agentik.api import hookimpl

        @hookimpl
        def register_llm_backends(register):
            register("nothing", lambda settings: None)
    """,
    "br_memory_wrong_type": """
        from agentik.api import hookimpl

        @hookimpl
        def register_memory_backends(register):
            register("nomemory", lambda settings: {})
    """,
    "br_bad_usage": """
        from agentik.api import LLMBackend, LLMConversation, TextDelta, Usage, hookimpl

        class Conversation(LLMConversation):
            async def stream(self, inputs):
                yield TextDelta("counted")
                yield Usage(input_tokens=-3, output_tokens=1)

        class BadCounter(LLMBackend):
            description = "badcounter"

            def create_conversation(self, system_prompt, history, tools):
                return Conversation()

            async def complete(self, prompt, *, system_prompt=None):
                return ""

        @hookimpl
        def register_llm_backends(register):
            register("badcounter", lambda settings: BadCounter())
    """,
    "br_shrinking_usage": """
        from agentik.api import (
            LLMBackend, LLMConversation, TextDelta, ToolCallRequest, ToolResultInput, Usage,
            hookimpl,
        )

        class Conversation(LLMConversation):
            async def stream(self, inputs):
                if isinstance(inputs[-1], ToolResultInput):
                    yield TextDelta("done")
                    yield Usage(input_tokens=2, output_tokens=1)  # only the new input: wrong
                else:
                    yield ToolCallRequest("c1", "healthy_tool", "{}")
                    yield Usage(input_tokens=10, output_tokens=1)

        class Shrinking(LLMBackend):
            description = "shrinking"

            def create_conversation(self, system_prompt, history, tools):
                return Conversation()

            async def complete(self, prompt, *, system_prompt=None):
                return ""

        @hookimpl
        def register_llm_backends(register):
            register("shrinking", lambda settings: Shrinking())
    """,
    # --- tools ------------------------------------------------------------------------------
    "br_tool_not_a_tool": """
        from agentik.api import hookimpl

        @hookimpl
        def register_tools(register):
            register(lambda sides: sides)
    """,
    "br_tool_twin": """
        from agentik.api import hookimpl, tool

        @hookimpl
        def register_tools(register):
            @tool
            def healthy_tool() -> str:
                "The same name as br_healthy's."
                return ""

            register(healthy_tool)
    """,
    "br_tool_untyped": """
        from agentik.api import hookimpl, tool

        class Opaque:
            pass

        @hookimpl
        def register_tools(register):
            def upload(blob: Opaque) -> str:
                "Upload."
                return ""

            register(tool(upload))
    """,
    "br_tool_raises": """
        from agentik.api import hookimpl, tool

        @hookimpl
        def register_tools(register):
            @tool
            def flaky() -> str:
                "Always fails."
                raise RuntimeError("backend down")

            register(flaky)
    """,
    "br_tool_hangs": """
        import asyncio

        from agentik.api import hookimpl, tool

        @hookimpl
        def register_tools(register):
            @tool
            async def stuck() -> str:
                "Never answers."
                await asyncio.sleep(3600)
                return ""

            register(stuck)
    """,
    # --- prompt sections --------------------------------------------------------------------
    "br_section_async": """
        from agentik.api import hookimpl

        async def render():
            return "never"

        @hookimpl
        def register_prompt_sections(register):
            register("weather", render)
    """,
    "br_section_raises": """
        from agentik.api import hookimpl

        def render(agent):
            return agent.state["weather"]  # KeyError: its service never ran

        @hookimpl
        def register_prompt_sections(register):
            register("weather", render)
    """,
    "br_section_coroutine": """
        from agentik.api import hookimpl

        async def fetch():
            return "sunny"

        @hookimpl
        def register_prompt_sections(register):
            register("weather", lambda: fetch())
    """,
    # --- turn hooks -------------------------------------------------------------------------
    "br_before_turn_raises": """
        from agentik.api import hookimpl

        @hookimpl
        def before_turn():
            raise RuntimeError("prefetch down")
    """,
    "br_before_turn_awaitable_raises": """
        from agentik.api import hookimpl

        async def prefetch():
            raise ConnectionError("vector store unreachable")

        @hookimpl
        def before_turn():
            return prefetch()
    """,
    "br_before_turn_hangs": """
        import asyncio

        from agentik.api import hookimpl

        @hookimpl
        def before_turn():
            return asyncio.sleep(3600, "never")
    """,
    "br_after_turn_raises": """
        from agentik.api import hookimpl

        @hookimpl
        def after_turn():
            raise RuntimeError("review down")
    """,
    "br_after_turn_awaitable_raises": """
        from agentik.api import hookimpl

        async def review():
            raise RuntimeError("review failed later")

        @hookimpl
        def after_turn():
            return review()
    """,
    # --- services and jobs ------------------------------------------------------------------
    "br_service_raises": """
        import contextlib

        from agentik.api import hookimpl

        @contextlib.asynccontextmanager
        async def client():
            raise ConnectionRefusedError("weather API down")
            yield

        @hookimpl
        def register_services(register):
            register("weather", client)
    """,
    "br_service_hangs": """
        import asyncio
        import contextlib

        from agentik.api import hookimpl

        @contextlib.asynccontextmanager
        async def client():
            await asyncio.sleep(3600)
            yield

        @hookimpl
        def register_services(register):
            register("weather", client)
    """,
    "br_job_raises_early": """
        from agentik.api import hookimpl

        def run():
            raise RuntimeError("before any awaitable")

        @hookimpl
        def register_jobs(register):
            register("heartbeat", run, interval=0.02)
    """,
    "br_job_awaitable_raises": """
        from agentik.api import hookimpl

        async def run():
            raise RuntimeError("heartbeat endpoint down")

        @hookimpl
        def register_jobs(register):
            register("heartbeat", run)
    """,
    "br_job_not_awaitable": """
        from agentik.api import hookimpl

        @hookimpl
        def register_jobs(register):
            register("heartbeat", lambda: None)
    """,
    # --- transports, banner, commands -------------------------------------------------------
    "br_route_twin": """
        from aiohttp import web
        from agentik.api import hookimpl

        async def health(request):
            return web.json_response({"mine": True})

        @hookimpl
        def register_transports(register):
            register("health", lambda app, agent, settings: app.router.add_get("/health", health))
    """,
    "br_route_shadowed": """
        from aiohttp import web
        from agentik.api import hookimpl

        async def mine(request):
            return web.json_response([])

        def setup(app, agent, settings):
            app.router.add_get("/agentik/conversations", mine)

        @hookimpl
        def register_transports(register):
            register("list", setup)
    """,
    "br_transport_raises": """
        from agentik.api import hookimpl

        def setup(app, agent, settings):
            raise KeyError("ROUTES_FILE")

        @hookimpl
        def register_transports(register):
            register("broken", setup)
    """,
    "br_banner_raises": """
        from agentik.api import hookimpl

        @hookimpl
        def banner_lines(agent):
            raise RuntimeError("no status yet")
    """,
    "br_banner_coroutine": """
        from agentik.api import hookimpl

        async def lines():
            return ["never"]

        @hookimpl
        def banner_lines():
            return lines()
    """,
    "br_command_twin": """
        from agentik.api import hookimpl

        @hookimpl
        def register_commands(register):
            register("serve", lambda parser: None, lambda args, settings: 0)
    """,
}
#: entry points whose name is not their module's
ENTRY_POINTS = {**{m: m for m in SOURCES}, "agentik_memory": "br_clash"}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return install_plugins(tmp_path_factory, DIST, SOURCES, ENTRY_POINTS)


@pytest.fixture
def installed(site, monkeypatch):
    monkeypatch.syspath_prepend(str(site))
    for name in SOURCES:
        sys.modules.pop(name, None)
    for name in [n for n in sys.modules if n.startswith("agentik_plugins_dir.")]:
        sys.modules.pop(name)
    return site


@dataclass
class Case:
    plugins: str  # the broken plugins loaded next to br_healthy (comma list)
    line: str  # what the one line says (a part of it), naming the plugin
    env: dict[str, str] = field(default_factory=dict)
    count: int = 1  # lines naming the plugin (a periodic job's failure repeats)
    named: str = ""  # the name the line uses, when not the first plugin's
    call: str = ""  # a tool the model calls in the turn

    @property
    def name(self) -> str:
        return self.named or self.plugins.split(",")[0]


RUNS = {
    "import error: a missing dependency": Case(
        "br_import_missing",
        "plugin br_import_missing failed to load and is skipped: ModuleNotFoundError: "
        "No module named 'no_such_sdk_xyz'",
    ),
    "import error: the module raises": Case(
        "br_import_raises",
        "plugin br_import_raises failed to load and is skipped: RuntimeError: config file missing",
    ),
    "a misspelt hook": Case("br_misspelt_hook", "unknown hook 'register_tool'"),
    "an async def hook": Case("br_async_hook", "hook before_turn is `async def`"),
    "a hook argument the spec lacks": Case(
        "br_wrong_argument", "Argument(s) {'conv'} are declared in the hookimpl"
    ),
    "a plugin that needs a newer API": Case(
        "br_api_too_new", "APIVersionError: needs the agentik plugin API 9.0"
    ),
    "an entry point named like a built-in (agentik_memory)": Case(
        "agentik_memory,agentik_memory_md",
        "plugin agentik_memory (agentik-breakages) failed to load and is skipped: "
        "agentik-runtime defines an `agentik` entry point of the same name, which is loaded "
        "instead",
        env={"AGENTIK_MEMORY_BACKEND": "md", "AGENTIK_MEMORY_REVIEW": "0"},
        named="agentik-breakages",
    ),
    "a plugin-dir file named like an installed plugin": Case(
        "br_dir_twin",
        "replaces the installed plugin of that name (agentik-breakages 0.1); rename the file",
    ),
    "a typo in a plugin's own variable": Case(
        "br_prefix_typo",
        "HEARTBEAT_INTERVL is set but no loaded plugin declares it (did you mean "
        "HEARTBEAT_INTERVAL?) (HEARTBEAT_* belongs to plugin br_prefix_typo)",
        env={"HEARTBEAT_INTERVL": "5"},
    ),
    "one backend name from two plugins, not selected": Case(
        "br_backend_twin_a,br_backend_twin_b",
        "llm backend 'twin' is registered by both br_backend_twin_a and br_backend_twin_b",
    ),
    "backend token counts that break the Usage contract": Case(
        "br_bad_usage",
        "LLM backend badcounter reported token counts that break the Usage contract: "
        "input_tokens=-3",
        env={"AGENTIK_LLM_BACKEND": "badcounter"},
        named="badcounter",
    ),
    "backend token counts that shrink within a turn": Case(
        "br_shrinking_usage",
        "LLM backend shrinking reported token counts that break the Usage contract: the "
        "context shrank within the turn (10 → 3)",
        env={"AGENTIK_LLM_BACKEND": "shrinking"},
        named="shrinking",
    ),
    "a tool that raises": Case(
        "br_tool_raises",
        "tool flaky of plugin br_tool_raises failed: RuntimeError: backend down",
        call="flaky",
    ),
    "a tool that hangs": Case(
        "br_tool_hangs",
        "tool stuck of plugin br_tool_hangs did not answer within 0.2 s (AGENTIK_TOOL_TIMEOUT)",
        env={"AGENTIK_TOOL_TIMEOUT": "0.2"},
        call="stuck",
    ),
    "a prompt section that raises": Case(
        "br_section_raises",
        "prompt section 'weather' of plugin br_section_raises (left out) failed: KeyError",
    ),
    "a prompt section that returns a coroutine": Case(
        "br_section_coroutine",
        "prompt section 'weather' of plugin br_section_coroutine returned coroutine, not text",
    ),
    "before_turn raises": Case(
        "br_before_turn_raises", "before_turn of plugin br_before_turn_raises in conv-"
    ),
    "before_turn's awaitable raises": Case(
        "br_before_turn_awaitable_raises",
        "failed: ConnectionError: vector store unreachable",
    ),
    "before_turn hangs": Case(
        "br_before_turn_hangs",
        "before_turn of plugin br_before_turn_hangs did not answer within 0.2 s",
        env={"AGENTIK_BEFORE_TURN_TIMEOUT": "0.2"},
    ),
    "after_turn raises": Case("br_after_turn_raises", "RuntimeError: review down"),
    "after_turn's awaitable raises": Case(
        "br_after_turn_awaitable_raises", "RuntimeError: review failed later"
    ),
    "a periodic job that raises before returning an awaitable": Case(
        "br_job_raises_early",
        "job 'heartbeat' of plugin br_job_raises_early failed: RuntimeError: before any",
        count=2,  # at least: it keeps its schedule
    ),
    "a job whose awaitable raises": Case(
        "br_job_awaitable_raises",
        "job 'heartbeat' of plugin br_job_awaitable_raises failed: RuntimeError: heartbeat",
    ),
    "a job that returns no awaitable": Case(
        "br_job_not_awaitable",
        "job 'heartbeat' of plugin br_job_not_awaitable failed: TypeError: it returned "
        "NoneType, not an awaitable",
    ),
    "banner_lines raises": Case(
        "br_banner_raises", "banner_lines of plugin br_banner_raises failed: RuntimeError"
    ),
    "banner_lines returns a coroutine": Case(
        "br_banner_coroutine",
        "banner_lines of plugin br_banner_coroutine returned coroutine, not a list of strings",
    ),
}


@pytest.mark.parametrize("case", RUNS.values(), ids=RUNS.keys())
async def test_a_breakage_is_one_line_and_the_other_plugins_keep_working(
    case, installed, tmp_path, caplog
):
    caplog.set_level(logging.INFO)
    env = {
        "AGENTIK_LOAD_PLUGINS": f"br_healthy,{case.plugins}",
        "AGENTIK_DB_PATH": ":memory:",
        "AGENTIK_MEMORY_BACKEND": "off",
        "AGENTIK_MEMORY_DIR": str(tmp_path / "memory"),
        "AGENTIK_LLM_BACKEND": "healthy",
        **case.env,
    }
    if case.plugins == "br_dir_twin":
        folder = tmp_path / "plugins"
        folder.mkdir()
        (folder / "br_dir_twin.py").write_text(
            "from agentik.api import hookimpl\n\n@hookimpl\n"
            "def banner_lines():\n    return ['twin: from the file']\n"
        )
        env["AGENTIK_PLUGINS_DIR"] = str(folder)
    plugins = make_plugins(env=env)
    settings = load_settings(plugins, env)
    for warning in undeclared_variables(settings.declared, env, settings.prefixes):
        logging.getLogger("agentik").warning("%s", warning)  # what `agentik serve` does
    app = create_app(settings, plugins)
    async with running(app) as agent:
        lines = await banner(app, "127.0.0.1", 8080)
        if case.call:  # the model calls the broken tool, then answers
            agent.llm.steps = [[ToolCallRequest("c1", case.call, "{}")], ["answered"]]
        turn = await run_turn(agent, "hello")
        await agent.jobs.wait_idle()
        await asyncio.sleep(0.1)  # periodic jobs come round
        healthy = agent.llm if case.env.get("AGENTIK_LLM_BACKEND") is None else None
        ticks = agent.state.get("healthy_ticks", 0)
        tools = agent.tools.names()
    problems = [r for r in caplog.records if r.levelno >= logging.WARNING]
    named = [r for r in problems if case.name in r.getMessage()]
    assert named, f"no line names {case.name}: {[r.getMessage() for r in problems]}"
    assert case.line in named[0].getMessage()
    if case.count == 1:
        assert len(named) == 1, [r.getMessage() for r in named]
    else:
        assert len(named) >= case.count
    assert [r.getMessage() for r in problems if r not in named] == []  # nothing else broke
    for record in named:  # one line each: the traceback only at debug level
        assert "\n" not in record.getMessage() and record.exc_info is None
    # the other plugins keep working
    assert "healthy_tool" in tools
    assert "  healthy: up" in lines
    assert ticks >= 1
    assert turn.history[-1].kind == "assistant", turn.types
    if healthy is not None:
        assert "HEALTHY SECTION" in healthy.prompts[0]
        assert healthy.received[0][0].text.startswith("[healthy context]")
    if case.plugins.startswith("agentik_memory"):  # the built-in memory is the one loaded
        assert plugins.infos["agentik_memory"].dist == "agentik-runtime"
        assert "memory_save" in tools
    if case.plugins == "br_bad_usage":  # unknown, never negative
        assert turn.history[-1].payload["tokens"] == {"input": None, "output": None}
    if case.plugins == "br_shrinking_usage":  # the first step's input stands; no growth
        assert turn.history[-1].payload["tokens"] == {"input": 10, "output": None}
    if case.plugins == "br_dir_twin":
        assert "  twin: from the file" in lines and "  twin: installed" not in lines


STOPS = {
    "entry point named like a built-in, strict": (
        "agentik_memory",
        {"AGENTIK_STRICT_PLUGINS": "1"},
        "plugin agentik_memory of agentik-breakages: agentik-runtime defines an `agentik` "
        "entry point of the same name",
    ),
    "register_settings raises": (
        "br_settings_raise",
        {},
        "plugin br_settings_raise: register_settings failed: RuntimeError: settings file "
        "unreadable",
    ),
    "a setting declared unlike the core": (
        "br_settings_conflict",
        {},
        "AGENTIK_PORT is declared differently by agentik.core (default: 8080) and "
        "br_settings_conflict (default: 9999)",
    ),
    "register() given a string": (
        "br_settings_not_a_setting",
        {},
        "plugin br_settings_not_a_setting: register_settings failed: TypeError: register() "
        "takes a Setting or a SettingPrefix, not str",
    ),
    "one backend name from two plugins, selected": (
        "br_backend_twin_a,br_backend_twin_b",
        {"AGENTIK_LLM_BACKEND": "twin"},
        "AGENTIK_LLM_BACKEND='twin': llm backend 'twin' is registered by both "
        "br_backend_twin_a and br_backend_twin_b",
    ),
    "the selected backend's factory raises": (
        "br_factory_raises",
        {"AGENTIK_LLM_BACKEND": "boom"},
        "plugin br_factory_raises: creating the llm backend 'boom' failed: RuntimeError: "
        "no GPU here",
    ),
    "the selected backend's dependency is missing": (
        "br_factory_missing_dep",
        {"AGENTIK_LLM_BACKEND": "fancy"},
        "AGENTIK_LLM_BACKEND='fancy': the llm backend of plugin br_factory_missing_dep needs "
        f"no_such_sdk_xyz; pip install '{DIST}[gpu]'",
    ),
    "the selected backend's factory returns None": (
        "br_factory_wrong_type",
        {"AGENTIK_LLM_BACKEND": "nothing"},
        "plugin br_factory_wrong_type: creating the llm backend 'nothing' failed: TypeError: "
        "the factory returned NoneType, not LLMBackend",
    ),
    "the selected memory backend is no MemoryBackend": (
        "br_memory_wrong_type",
        {"AGENTIK_MEMORY_BACKEND": "nomemory"},
        "plugin br_memory_wrong_type: creating the memory backend 'nomemory' failed: "
        "TypeError: the factory returned dict, not MemoryBackend",
    ),
    "register_tools given a function": (
        "br_tool_not_a_tool",
        {},
        "plugin br_tool_not_a_tool: register_tools failed: TypeError: register() takes a Tool",
    ),
    "a tool name another plugin has": (
        "br_tool_twin",
        {},
        "plugin br_tool_twin: register_tools failed: ValueError: tool 'healthy_tool' "
        "registered twice (by br_healthy and br_tool_twin)",
    ),
    "a tool parameter without a JSON form": (
        "br_tool_untyped",
        {},
        "plugin br_tool_untyped: register_tools failed: ToolTypeError: tool upload, parameter "
        "blob: the type 'Opaque' has no JSON form",
    ),
    "an async def prompt section": (
        "br_section_async",
        {},
        "plugin br_section_async: register_prompt_sections failed: TypeError: prompt section "
        "'weather': render is `async def`",
    ),
    "a service that raises": (
        "br_service_raises",
        {},
        "plugin br_service_raises: starting service 'weather' failed: ConnectionRefusedError: "
        "weather API down",
    ),
    "a service that hangs": (
        "br_service_hangs",
        {"AGENTIK_SERVICE_START_TIMEOUT": "0.3"},
        "plugin br_service_hangs: starting service 'weather' failed: TimeoutError: not "
        "started within 0.3 s (AGENTIK_SERVICE_START_TIMEOUT)",
    ),
    "a route the core has": (
        "br_route_twin",
        {},
        "plugin br_route_twin adds the route GET /health, which the core has already",
    ),
    "a route of another plugin's sub-application": (
        "agentik_transport_http,br_route_shadowed",
        {},
        # (this distribution is first on sys.path: its plugins are registered first)
        "plugin agentik_transport_http adds the route GET /agentik/conversations, which plugin "
        "br_route_shadowed has already",
    ),
    "a transport whose setup raises": (
        "br_transport_raises",
        {},
        "plugin br_transport_raises: register_transports failed: KeyError: 'ROUTES_FILE'",
    ),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("plugins", "env", "line"), STOPS.values(), ids=STOPS.keys())
def test_a_breakage_that_must_stop_start_up_is_one_line(
    plugins, env, line, installed, monkeypatch, capsys
):
    for name in [n for n in __import__("os").environ if n.startswith(("AGENTIK_", "OPENAI_"))]:
        monkeypatch.delenv(name)
    given = {
        "AGENTIK_LOAD_PLUGINS": f"br_healthy,{plugins}",
        "AGENTIK_DB_PATH": ":memory:",
        "AGENTIK_MEMORY_BACKEND": "off",
        "AGENTIK_LLM_BACKEND": "healthy",
        "AGENTIK_PORT": "0",
        **env,
    }
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith(f"agentik: error: {line}"), err
    # the traceback of the plugin's code only when asked for (strict mode is for its author)
    assert ("Traceback" in err) == ("AGENTIK_STRICT_PLUGINS" in env)


def test_a_plugin_command_named_like_a_core_one_is_one_line(installed, capsys):
    plugins = make_plugins(env={"AGENTIK_LOAD_PLUGINS": "br_command_twin"})
    assert main(["anything"], plugins=plugins) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "agentik: error: plugin br_command_twin: register_commands failed: ValueError: the "
        "command 'serve' exists already"
    )


def test_strict_mode_makes_the_entry_point_clash_fatal_at_load(installed):
    with pytest.raises(StartupError, match="plugin agentik_memory of agentik-breakages"):
        make_plugins(env={"AGENTIK_LOAD_PLUGINS": "agentik_memory", "AGENTIK_STRICT_PLUGINS": "1"})
