"""The aiohttp app factory: settings, backends, the agent, transports and their lifecycle.

``create_app`` is pure: it builds everything from the plugins and settings it is given and
starts nothing. The agent, the LLM backend and the jobs start in one cleanup context (in order,
closed in reverse), and every open event stream ends in ``on_shutdown``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from agentik.core.agent import ChatAgent
from agentik.core.conversation import PromptSection
from agentik.core.db import Database
from agentik.core.llm import LLMBackend
from agentik.core.memory import MemoryBackend, memory_off
from agentik.core.plugins import Plugins, make_plugins
from agentik.core.registry import BackendError, BackendRegistry
from agentik.core.settings import Setting, Settings, SettingsError
from agentik.core.store import SqliteStore
from agentik.core.tools import Tool, ToolRegistry

log = logging.getLogger(__name__)

AGENT = web.AppKey("agentik.agent", ChatAgent)
SETTINGS = web.AppKey("agentik.settings", Settings)
PLUGINS = web.AppKey("agentik.plugins", Plugins)
MAX_BODY = 1024 * 1024

NO_LLM_HINT = (
    "agentik needs an OpenAI-compatible LLM endpoint, e.g. for a local Ollama: "
    "OPENAI_BASE_URL=http://localhost:11434/v1 OPENAI_API_KEY=ollama OPENAI_MODEL=llama3.2 "
    "make serve (other backends: AGENTIK_LLM_BACKEND, see `agentik plugins`)"
)


class StartupError(Exception):
    """Start-up cannot go on; the message says what to set or fix."""


def declared_settings(plugins: Plugins) -> list[Setting]:
    """Every plugin's settings, each tagged with the plugin that declared it."""
    declared: list[Setting] = []
    for impl in plugins.hook.register_settings.get_hookimpls():

        def register(s: Setting, plugin: str = impl.plugin_name) -> None:
            declared.append(Setting(s.name, s.default, s.parse, s.help, s.secret, plugin))

        impl.function(register=register)
    return declared


def load_settings(plugins: Plugins, env: Mapping[str, str] | None = None) -> Settings:
    return Settings(declared_settings(plugins), env)


def registries(plugins: Plugins) -> dict[str, BackendRegistry]:
    """Every backend of every kind, registered by name."""
    kinds = {
        "llm": "register_llm_backends",
        "memory": "register_memory_backends",
        "embedding": "register_embedding_backends",
    }
    out = {}
    for kind, hook in kinds.items():
        reg = out[kind] = BackendRegistry(kind)
        for impl in getattr(plugins.hook, hook).get_hookimpls():  # registration order
            impl.function(register=reg.register_for(impl.plugin_name))
    return out


def select_llm(plugins: Plugins, settings: Settings) -> LLMBackend:
    name = settings["AGENTIK_LLM_BACKEND"]
    try:
        backend = registries(plugins)["llm"].get(name, variable="AGENTIK_LLM_BACKEND")
        llm = backend.factory(settings)
    except SettingsError as e:
        raise StartupError(f"{e}. {NO_LLM_HINT}" if name == "openai" else str(e)) from e
    except BackendError as e:
        raise StartupError(str(e)) from e
    if not isinstance(llm, LLMBackend):
        raise StartupError(f"LLM backend {name!r} did not return an LLMBackend")
    return llm


def select_memory(plugins: Plugins, settings: Settings) -> MemoryBackend | None:
    """The memory backend ``AGENTIK_MEMORY_BACKEND`` names; None when memory is off."""
    if memory_off(settings):
        return None
    name = settings["AGENTIK_MEMORY_BACKEND"]
    try:
        backend = registries(plugins)["memory"].get(name, variable="AGENTIK_MEMORY_BACKEND")
        memory = backend.factory(settings)
    except (BackendError, SettingsError) as e:
        raise StartupError(f"{e} (or off)" if "available:" in str(e) else str(e)) from e
    if not isinstance(memory, MemoryBackend):
        raise StartupError(f"memory backend {name!r} did not return a MemoryBackend")
    return memory


def collect_tools(plugins: Plugins, settings: Settings) -> ToolRegistry:
    registry = ToolRegistry(timeout=settings["AGENTIK_TOOL_TIMEOUT"])
    for impl in plugins.hook.register_tools.get_hookimpls():

        def register(t: Tool, plugin: str = impl.plugin_name) -> None:
            registry.add(Tool(t.spec, t.fn, plugin))

        kwargs = {"register": register, "settings": settings}
        impl.function(*[kwargs[a] for a in impl.argnames])
    return registry


def collect_prompt_sections(plugins: Plugins, settings: Settings) -> list[PromptSection]:
    sections: list[PromptSection] = []

    def register(name: str, render: Callable[[], str | None], order: int = 100) -> None:
        sections.append((order, name, render))

    plugins.hook.register_prompt_sections(register=register, settings=settings)
    return sections


def build_agent(plugins: Plugins, settings: Settings, llm: LLMBackend | None = None) -> ChatAgent:
    try:
        tools = collect_tools(plugins, settings)
    except ValueError as e:
        raise StartupError(str(e)) from e
    path = settings["AGENTIK_DB_PATH"]
    try:
        database = Database(path)
    except OSError as e:
        raise StartupError(f"AGENTIK_DB_PATH={path!r}: cannot create its folder: {e}") from e
    return ChatAgent(
        store=SqliteStore(database),
        llm=llm if llm is not None else select_llm(plugins, settings),
        tools=tools,
        prompt_sections=collect_prompt_sections(plugins, settings),
        hooks=plugins.hook,
        event_buffer=settings["AGENTIK_EVENT_BUFFER"],
        max_live=settings["AGENTIK_LIVE_CONVERSATIONS"],
        memory=select_memory(plugins, settings),
    )


@web.middleware
async def json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every error is JSON ``{"error": {"code", "message"}}``; never a stack trace."""
    try:
        return await handler(request)  # type: ignore[no-any-return]
    except web.HTTPException as e:
        if e.status < 400 or e.content_type == "application/json":
            raise
        code = e.reason.lower().replace(" ", "_")
        message = e.text if e.text and not e.text.startswith(f"{e.status}:") else e.reason
        return error_response(e.status, code, message, headers=e.headers)
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, "internal", "internal server error")


def error_response(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    keep = {k: v for k, v in (headers or {}).items() if k.lower() in ("allow", "retry-after")}
    return web.json_response(
        {"error": {"code": code, "message": message}}, status=status, headers=keep
    )


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "agent": request.app[AGENT].id})


def create_app(
    settings: Settings | None = None,
    plugins: Plugins | None = None,
    *,
    llm: LLMBackend | None = None,
    env: Mapping[str, str] | None = None,
) -> web.Application:
    """Build the server. ``llm`` overrides the selected backend (tests, embedding)."""
    plugins = plugins if plugins is not None else make_plugins(env=env)
    settings = settings if settings is not None else load_settings(plugins, env)
    agent = build_agent(plugins, settings, llm)
    app = web.Application(middlewares=[json_errors], client_max_size=MAX_BODY)
    app[AGENT] = agent
    app[SETTINGS] = settings
    app[PLUGINS] = plugins
    app.router.add_get("/health", health)
    plugins.hook.register_transports(register=lambda name, setup: setup(app, agent, settings))
    app.cleanup_ctx.append(_lifecycle)
    app.on_shutdown.append(_end_streams)
    return app


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    agent, settings, plugins = app[AGENT], app[SETTINGS], app[PLUGINS]
    services = contextlib.AsyncExitStack()
    await agent.llm.start()
    try:
        try:
            await agent.open()
        except Exception as e:
            path = settings["AGENTIK_DB_PATH"]
            raise StartupError(f"AGENTIK_DB_PATH={path!r}: cannot open the database: {e}") from e
        if agent.memory is not None:
            await _start_memory(services, agent.memory, settings)
        await _start_services(services, agent, plugins, settings)
        _start_jobs(agent, plugins, settings)
        yield
    finally:
        await agent.close()  # turns stop before the services they may be using
        await services.aclose()
        await agent.llm.aclose()


async def _start_services(
    stack: contextlib.AsyncExitStack, agent: ChatAgent, plugins: Plugins, settings: Settings
) -> None:
    services: list[tuple[str, Callable[[], contextlib.AbstractAsyncContextManager[Any]]]] = []
    plugins.hook.register_services(
        register=lambda name, context: services.append((name, context)),
        agent=agent,
        settings=settings,
    )
    for name, context in services:
        try:
            await stack.enter_async_context(context())
        except Exception as e:
            raise StartupError(f"service {name!r} failed to start: {e}") from e


async def _start_memory(
    stack: contextlib.AsyncExitStack, memory: MemoryBackend, settings: Settings
) -> None:
    name = settings["AGENTIK_MEMORY_BACKEND"]
    try:
        await memory.start()
    except Exception as e:
        raise StartupError(f"AGENTIK_MEMORY_BACKEND={name!r}: cannot start: {e}") from e
    stack.push_async_callback(memory.close)  # closed after the services that may use it


def _start_jobs(agent: ChatAgent, plugins: Plugins, settings: Settings) -> None:
    def register(
        name: str, run: Callable[[], Awaitable[Any]], interval: float | None = None
    ) -> None:
        if interval is None:
            agent.jobs.spawn(name, run())
        else:
            agent.jobs.every(name, interval, run)

    plugins.hook.register_jobs(register=register, agent=agent, settings=settings)


async def _end_streams(app: web.Application) -> None:
    app[AGENT].end_streams()
