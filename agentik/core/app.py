"""The aiohttp app factory: settings, backends, the agent, transports and their lifecycle.

``create_app`` is pure: it builds everything from the plugins and settings it is given and
starts nothing. The agent, the LLM backend and the jobs start in one cleanup context (in order,
closed in reverse), and every open event stream ends in ``on_shutdown``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import re
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

import peewee
from aiohttp import web

from agentik.core import security
from agentik.core.agent import ChatAgent
from agentik.core.conversation import PromptSection
from agentik.core.db import Database
from agentik.core.embedding import EmbeddingBackend
from agentik.core.failures import log_failure
from agentik.core.health import Readiness
from agentik.core.health import add_routes as add_health_routes
from agentik.core.limits import ClientLimits
from agentik.core.listener import TroubleLog
from agentik.core.llm import LLMBackend
from agentik.core.memory import MemoryBackend, memory_off
from agentik.core.plugins import (
    PluginError,
    Plugins,
    call_impl,
    call_startup,
    make_plugins,
)
from agentik.core.plugins import StartupError as StartupError  # defined beside PluginError
from agentik.core.registry import BackendError, BackendRegistry
from agentik.core.responses import error_response
from agentik.core.settings import Setting, SettingPrefix, Settings, SettingsError
from agentik.core.store import SqliteStore, Store
from agentik.core.store.url import shown_url
from agentik.core.tools import Tool, ToolRegistry

log = logging.getLogger(__name__)

AGENT = web.AppKey("agentik.agent", ChatAgent)
SETTINGS = web.AppKey("agentik.settings", Settings)
PLUGINS = web.AppKey("agentik.plugins", Plugins)
#: counts client trouble (refused connections, malformed requests, slow bodies) for the log
TROUBLE = web.AppKey("agentik.trouble", TroubleLog)
#: per-client connection limits (the listener's, and its middleware's behind a trusted proxy)
LIMITS = web.AppKey("agentik.limits", ClientLimits)
#: what /health/ready answers (the stop sets ``stopping``; storage errors are reported to it)
READINESS = web.AppKey("agentik.readiness", Readiness)
MAX_BODY = 1024 * 1024

NO_LLM_HINT = (
    "agentik needs an OpenAI-compatible LLM endpoint, e.g. for a local Ollama: "
    "OPENAI_BASE_URL=http://localhost:11434/v1 OPENAI_API_KEY=ollama OPENAI_MODEL=llama3.2 "
    "make serve (other backends: AGENTIK_LLM_BACKEND, see `agentik plugins`)"
)
#: the backend that needs nothing configured: an on-device model it fetches once
ON_DEVICE_LLM = "litert"


def declared_settings(plugins: Plugins) -> list[Setting | SettingPrefix]:
    """Every plugin's settings (and the prefixes it claims), each tagged with the plugin that
    declared it."""
    declared: list[Setting | SettingPrefix] = []
    for impl in plugins.hook.register_settings.get_hookimpls():

        def register(s: Setting | SettingPrefix, plugin: str = impl.plugin_name) -> None:
            if isinstance(s, SettingPrefix):
                declared.append(SettingPrefix(s.prefix, plugin, tuple(s.others)))
                return
            if not isinstance(s, Setting):
                raise TypeError(
                    f"register() takes a Setting or a SettingPrefix, not {type(s).__name__}"
                )
            declared.append(Setting(s.name, s.default, s.parse, s.help, s.secret, plugin))

        try:
            call_impl(plugins.hook.register_settings, impl, {"register": register})
        except Exception as e:
            raise PluginError(impl.plugin_name, "register_settings", e) from e
    return declared


def load_settings(plugins: Plugins, env: Mapping[str, str] | None = None) -> Settings:
    return Settings(declared_settings(plugins), env)


BACKEND_HOOKS = {
    "llm": "register_llm_backends",
    "memory": "register_memory_backends",
    "embedding": "register_embedding_backends",
}


def registries(plugins: Plugins, problems: list[str] | None = None) -> dict[str, BackendRegistry]:
    """Every backend of every kind, registered by name. With ``problems``, a conflict or a
    failing plugin is added to it and the rest goes on (``agentik plugins``); without, it stops
    start-up."""
    out = {}
    for kind, hook in BACKEND_HOOKS.items():
        reg = out[kind] = BackendRegistry(kind)
        reg.explain_unknown = functools.partial(_left_out, plugins, kind, hook)
        caller = getattr(plugins.hook, hook)
        for impl in caller.get_hookimpls():  # registration order
            info = plugins.infos.get(impl.plugin_name)
            register = reg.register_for(impl.plugin_name, info.dist if info else None)
            try:
                call_impl(caller, impl, {"register": register})
            except BackendError as e:
                if problems is None:
                    raise
                problems.append(str(e))
            except Exception as e:
                error = PluginError(impl.plugin_name, hook, e)
                if problems is None:
                    raise error from e
                problems.append(str(error))
        # a name two plugins registered stops start-up only if it is the one selected
        for line in reg.conflict_lines():
            if problems is None:
                log.warning("%s", line)
            else:
                problems.append(line)
    return out


def _left_out(plugins: Plugins, kind: str, hook: str, name: str) -> str | None:
    info = plugins.provider_left_out(hook, name)
    if info is None:
        return None
    return f"the {kind} backend {name!r} comes from plugin {info.name}, which {info.reason} " + (
        "disables" if info.status == "blocked" else "does not list"
    )


def llm_choice(settings: Mapping[str, Any]) -> tuple[str, str | None]:
    """The LLM backend to use, and why when ``AGENTIK_LLM_BACKEND`` does not name it: the
    endpoint a user has configured (any ``OPENAI_*`` variable set) comes first, else the
    on-device backend, which needs nothing configured."""
    if settings.get("AGENTIK_LLM_BACKEND"):
        return settings["AGENTIK_LLM_BACKEND"], None
    given = sorted(n for n in getattr(settings, "explicit", ()) if n.startswith("OPENAI_"))
    if given:
        return "openai", f"{', '.join(given)} set"
    return ON_DEVICE_LLM, "no AGENTIK_LLM_BACKEND and no OPENAI_* set: the on-device default"


def select_llm(
    plugins: Plugins, settings: Settings, regs: dict[str, BackendRegistry] | None = None
) -> LLMBackend:
    """The LLM backend ``AGENTIK_LLM_BACKEND`` names, or the one :func:`llm_choice` picks
    (``regs``: registries already built)."""
    name, why = llm_choice(settings)
    regs = regs if regs is not None else registries(plugins)
    try:
        variable = "AGENTIK_LLM_BACKEND" if why is None else "the default AGENTIK_LLM_BACKEND"
        llm: LLMBackend = regs["llm"].create(name, settings, variable=variable)
    except SettingsError as e:
        # someone who set no OPENAI_* at all gets an example endpoint; one who set some is
        # told exactly what is missing, nothing more
        started = any(n.startswith("OPENAI_") for n in settings.explicit)
        hint = name == "openai" and not started
        raise StartupError(f"{e}. {NO_LLM_HINT}" if hint else str(e)) from e
    except BackendError as e:
        if why is not None and name == ON_DEVICE_LLM:  # the default is not installed here
            raise StartupError(f"no LLM is configured and {e}. {NO_LLM_HINT}") from e
        raise StartupError(str(e)) from e
    return llm


def select_embedding(
    plugins: Plugins, settings: Settings, regs: dict[str, BackendRegistry] | None = None
) -> EmbeddingBackend:
    """The embedding backend ``AGENTIK_EMBEDDING_BACKEND`` names (built only for a memory
    backend whose factory takes ``embedding``)."""
    name = settings["AGENTIK_EMBEDDING_BACKEND"]
    regs = regs if regs is not None else registries(plugins)
    try:
        embedding: EmbeddingBackend = regs["embedding"].create(
            name, settings, variable="AGENTIK_EMBEDDING_BACKEND"
        )
    except (BackendError, SettingsError) as e:
        raise StartupError(str(e)) from e
    if not embedding.name:
        embedding.name = name
    return embedding


def select_memory(
    plugins: Plugins,
    settings: Settings,
    regs: dict[str, BackendRegistry] | None = None,
    provide: Mapping[str, Callable[[], Any]] | None = None,
) -> MemoryBackend | None:
    """The memory backend ``AGENTIK_MEMORY_BACKEND`` names; None when memory is off.
    ``provide``: what its factory may ask for by parameter name (``embedding``, ``store``)."""
    if memory_off(settings):
        return None
    name = settings["AGENTIK_MEMORY_BACKEND"]
    regs = regs if regs is not None else registries(plugins)
    try:
        memory: MemoryBackend = regs["memory"].create(
            name, settings, variable="AGENTIK_MEMORY_BACKEND", provide=provide
        )
    except BackendError as e:
        if "AGENTIK_MEMORY_BACKEND" not in getattr(settings, "explicit", ()):
            # the default backend's plugin is not loaded (disabled, or left out): no memory
            log.info("memory is off: %s", e)
            return None
        raise StartupError(f"{e} (or off)" if "available:" in str(e) else str(e)) from e
    except SettingsError as e:
        raise StartupError(f"{e} (or off)" if "available:" in str(e) else str(e)) from e
    return memory


def collect_tools(plugins: Plugins, settings: Settings) -> ToolRegistry:
    registry = ToolRegistry(timeout=settings["AGENTIK_TOOL_TIMEOUT"])
    for impl in plugins.hook.register_tools.get_hookimpls():

        def register(t: Tool, plugin: str = impl.plugin_name) -> None:
            if not isinstance(t, Tool):
                raise TypeError(
                    f"register() takes a Tool (see agentik.core.tools.tool), not {type(t).__name__}"
                )
            registry.add(replace(t, plugin=plugin))

        try:
            call_impl(
                plugins.hook.register_tools, impl, {"register": register, "settings": settings}
            )
        except Exception as e:
            raise PluginError(impl.plugin_name, "register_tools", e) from e
    return registry


def collect_prompt_sections(plugins: Plugins, settings: Settings) -> list[PromptSection]:
    sections: list[PromptSection] = []

    def register_for(plugin: str) -> Callable[..., None]:
        def register(name: str, render: Callable[..., str | None], order: int = 100) -> None:
            if inspect.iscoroutinefunction(render) or not callable(render):
                what = "`async def`" if callable(render) else f"a {type(render).__name__}"
                raise TypeError(
                    f"prompt section {name!r}: render is {what}; it must be a plain function "
                    "that returns the section's text (or None)"
                )
            sections.append((order, name, checked_section(plugin, name, render)))

        return register

    call_startup(plugins.hook.register_prompt_sections, register_for, settings=settings)
    return sections


def checked_section(plugin: str, name: str, render: Callable[..., Any]) -> Callable[..., Any]:
    """``render`` as the agent calls it, ``render(agent)``: a section that raises or returns
    anything but text or None is logged naming its plugin and left out of the prompt."""
    takes_agent = takes_positional(render)
    where = f"prompt section {name!r} of plugin {plugin}"

    def section(agent: ChatAgent) -> str | None:
        try:
            text = render(agent) if takes_agent else render()
        except Exception as e:
            log_failure(f"{where} (left out)", e)
            return None
        if text is None or isinstance(text, str):
            return text
        if inspect.iscoroutine(text):
            text.close()  # never awaited: no "was never awaited" warning
        log.error("%s returned %s, not text; it is left out", where, type(text).__name__)
        return None

    return section


def takes_positional(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes a positional argument (a prompt section's ``render(agent)``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: called without one
        return False
    return any(
        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params
    )


def make_store(settings: Settings) -> Store:
    """The store the settings name: PostgreSQL with AGENTIK_DATABASE_URL, else the SQLite file
    AGENTIK_DB_PATH. The PostgreSQL driver is imported only then."""
    url = settings["AGENTIK_DATABASE_URL"]
    if url:
        try:
            from agentik.core.store.postgres import PgDatabase, PostgresStore
        except ImportError as e:
            raise StartupError(
                f"AGENTIK_DATABASE_URL={shown_url(url)}: PostgreSQL needs the postgres extra "
                f"(pip install 'agentik-runtime[postgres]'): {e}"
            ) from e
        return PostgresStore(PgDatabase(url))
    path = settings["AGENTIK_DB_PATH"]
    try:
        return SqliteStore(Database(path))
    except OSError as e:
        raise StartupError(f"AGENTIK_DB_PATH={path!r}: cannot create its folder: {e}") from e


def storage_of(settings: Settings) -> str:
    """Where the store is (the URL without its password, or the SQLite file), for messages."""
    url = settings["AGENTIK_DATABASE_URL"]
    return shown_url(url) if url else str(settings["AGENTIK_DB_PATH"])


def database_named(settings: Settings) -> str:
    """The variable that names the store's database, with its value, for messages."""
    if settings["AGENTIK_DATABASE_URL"]:
        return f"AGENTIK_DATABASE_URL={storage_of(settings)}"
    return f"AGENTIK_DB_PATH={settings['AGENTIK_DB_PATH']!r}"


def build_agent(plugins: Plugins, settings: Settings, llm: LLMBackend | None = None) -> ChatAgent:
    tools = collect_tools(plugins, settings)
    store = make_store(settings)
    regs = registries(plugins)  # every register_*_backends hook called once
    llm = llm if llm is not None else select_llm(plugins, settings, regs)
    # a memory factory gets what it names: the embedding backend (built only then), the store
    embeddings: list[EmbeddingBackend] = []

    def embedding() -> EmbeddingBackend:
        if not embeddings:
            embeddings.append(select_embedding(plugins, settings, regs))
        return embeddings[0]

    memory = select_memory(
        plugins, settings, regs, provide={"embedding": embedding, "store": lambda: store}
    )
    return ChatAgent(
        store=store,
        llm=llm,
        tools=tools,
        prompt_sections=collect_prompt_sections(plugins, settings),
        hooks=plugins.hook,
        before_turn_timeout=settings["AGENTIK_BEFORE_TURN_TIMEOUT"],
        event_buffer=settings["AGENTIK_EVENT_BUFFER"],
        max_live=settings["AGENTIK_LIVE_CONVERSATIONS"],
        resume_queued=settings["AGENTIK_RESUME_QUEUED"],
        resume_turns=settings["AGENTIK_RESUME_TURNS"],
        background_idle=settings["AGENTIK_BACKGROUND_IDLE"],
        max_tool_rounds=settings["AGENTIK_MAX_TOOL_ROUNDS"],
        lease_ttl=settings["AGENTIK_LEASE_TTL"],
        memory=memory,
        embedding=embeddings[0] if embeddings else None,
    )


def json_errors(trouble: TroubleLog, readiness: Readiness) -> Any:
    """Every error is JSON ``{"error": {"code", "message"}}``; never a stack trace."""

    @web.middleware
    async def answer_json(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)  # type: ignore[no-any-return]
        except web.RequestPayloadError as e:  # a body that cannot be read: broken gzip, cut short
            response = error_response(400, "bad_body", f"the request body could not be read: {e}")
            # the rest of the body is unreadable too: neither drain it (aiohttp would log the
            # same error with a traceback) nor keep the connection
            request.content.feed_eof()
            response.force_close()
            return response
        except web.HTTPException as e:
            if e.status < 400 or e.content_type == "application/json":
                raise
            code = e.reason.lower().replace(" ", "_")
            message = e.text if e.text and not e.text.startswith(f"{e.status}:") else e.reason
            return error_response(e.status, code, message, headers=e.headers)
        except (OSError, sqlite3.OperationalError, peewee.OperationalError) as e:
            if isinstance(e, ConnectionError):  # the client went away: nobody to answer
                raise
            # the disk or the database failed (full, I/O error): nothing was done, or a commit
            # was not confirmed, and a retry with the same Idempotency-Key completes it; say so.
            # Logged once a minute per kind of failure with a count, the traceback once: the
            # clients told to retry every second would otherwise fill the log
            readiness.storage_failed(e)
            trouble.count(
                f"storage errors ({type(e).__name__}: {e})",
                f"{request.method} {request.path}",
                exc_info=e,
            )
            return error_response(
                503,
                "storage_unavailable",
                "the database could not complete the request; retry it",
                headers={"Retry-After": "1"},
            )
        except Exception:
            log.exception("unhandled error on %s %s", request.method, request.path)
            return error_response(500, "internal", "internal server error")

    return answer_json


def body_in_time(seconds: float, trouble: TroubleLog) -> Any:
    """Read a request's body (at most ``MAX_BODY``) before its handler runs, within ``seconds``:
    a client that announces more than it sends, or trickles it, gets a 408 instead of holding
    its handler forever. Every transport's handlers then read the body from memory."""

    @web.middleware
    def in_time(request: web.Request, handler: Any) -> Awaitable[web.StreamResponse]:
        if not request.body_exists:  # passed on, not awaited (security.answered says why)
            return handler(request)  # type: ignore[no-any-return]
        return read_body(request, handler)

    async def read_body(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            async with asyncio.timeout(seconds):
                await request.read()
        except TimeoutError:
            trouble.count("slow_body", str(request.remote))
            response = error_response(
                408, "request_timeout", f"the request body did not arrive within {seconds:g} s"
            )
            request.content.feed_eof()  # what is left of it is not read
            response.force_close()
            return response
        return await handler(request)  # type: ignore[no-any-return]

    return in_time


def create_app(
    settings: Settings | None = None,
    plugins: Plugins | None = None,
    *,
    llm: LLMBackend | None = None,
    env: Mapping[str, str] | None = None,
) -> web.Application:
    """Build the server. ``llm`` overrides the selected backend (tests, embedding)."""
    plugins = plugins if plugins is not None else make_plugins(env=env)
    plugins.report()
    settings = settings if settings is not None else load_settings(plugins, env)
    agent = build_agent(plugins, settings, llm)
    call_startup(
        plugins.hook.register_observers,
        lambda plugin: agent.observers.add,
        agent=agent,
        settings=settings,
    )
    trouble = TroubleLog()
    readiness = Readiness(agent)
    limits = ClientLimits(
        settings["AGENTIK_MAX_CLIENT_CONNECTIONS"],
        settings["AGENTIK_CLIENT_CONNECTION_RATE"],
        settings["AGENTIK_TRUSTED_PROXIES"],
    )
    app = web.Application(
        middlewares=[
            limits.middleware(functools.partial(_over_limit, trouble)),
            security.middleware(settings),
            json_errors(trouble, readiness),
            body_in_time(settings["AGENTIK_BODY_TIMEOUT"], trouble),
        ],
        client_max_size=MAX_BODY,
    )
    app.on_response_prepare.append(security.response_headers(settings))
    app[AGENT] = agent
    app[SETTINGS] = settings
    app[PLUGINS] = plugins
    app[TROUBLE] = trouble
    app[READINESS] = readiness
    app[LIMITS] = limits
    add_health_routes(app, agent, readiness)
    routes = RouteOwners(app)
    routes.claim("the core")

    def transports_for(plugin: str) -> Callable[..., None]:
        def register(name: str, setup: Callable[..., Any]) -> None:
            with routes.checking(f"plugin {plugin}"):
                setup(app, agent, settings)
            routes.claim(f"plugin {plugin}")

        return register

    call_startup(plugins.hook.register_transports, transports_for)
    app.cleanup_ctx.append(_lifecycle)
    app.on_shutdown.append(_end_streams)
    app.on_cleanup.append(_stop_counting)
    return app


class RouteOwners:
    """Who added each route (method and path, sub-applications included): a transport that
    adds one another has already (``GET /health``) would shadow it or be shadowed, silently,
    so start-up stops naming both."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.owners: dict[tuple[str, str], tuple[int, str]] = {}

    def claim(self, owner: str) -> None:
        for method, path, route in _routes(self.app.router):
            first = self.owners.setdefault((method, path), (id(route), owner))
            if first[0] != id(route):
                self._clash(owner, method, path)

    @contextlib.contextmanager
    def checking(self, owner: str) -> Iterator[None]:
        """aiohttp refuses a duplicate of the route added last itself, naming no path: that
        error becomes the one line naming both owners (other duplicates: :meth:`claim`)."""
        try:
            yield
        except RuntimeError as e:
            refused = re.match(r"Added route will never be executed, method (\w+) is", str(e))
            resources = list(self.app.router.resources())
            if refused and resources:
                self._clash(owner, refused.group(1), resources[-1].canonical)
            raise

    def _clash(self, owner: str, method: str, path: str) -> None:
        if method == "HEAD" and ("GET", path) in self.owners:  # add_get adds HEAD first
            method = "GET"
        first = self.owners[(method, path)][1]
        raise StartupError(
            f"{owner} adds the route {method} {path}, which {first} has already; one would "
            "hide the other (use another path)"
        )


def _routes(router: web.UrlDispatcher) -> list[tuple[str, str, Any]]:
    out = []
    for resource in router.resources():
        if isinstance(resource, web.PrefixedSubAppResource):  # its routes carry the prefix
            out += _routes(resource.get_info()["app"].router)
            continue
        out += [(route.method, resource.canonical, route) for route in resource]
    return out


def _over_limit(trouble: TroubleLog, reason: str) -> web.Response:
    """The answer to a request over its forwarded client's limits (behind a trusted proxy)."""
    trouble.count("client_limit", reason)
    return error_response(
        429, "too_many_client_connections", f"{reason}; retry later", {"Retry-After": "1"}
    )


async def _stop_counting(app: web.Application) -> None:
    app[TROUBLE].close()


@contextlib.asynccontextmanager
async def running(app: web.Application) -> AsyncIterator[ChatAgent]:
    """Start ``app``'s agent as ``agentik serve`` does (the LLM backend, the database, the
    services, the jobs) without listening anywhere, and stop it cleanly on exit: running turns
    are interrupted, event streams end, the services and the database are closed. For embedding
    the agent in a Python program::

        async with running(create_app()) as agent:
            conv = await agent.create_conversation()
    """
    app.freeze()
    try:
        await app.startup()
    except BaseException:
        await app.cleanup()
        raise
    try:
        yield app[AGENT]
    finally:
        await app.shutdown()
        await app.cleanup()


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    agent, settings, plugins = app[AGENT], app[SETTINGS], app[PLUGINS]
    services = contextlib.AsyncExitStack()
    await agent.llm.start()
    try:
        try:
            await agent.open()
        except Exception as e:
            raise StartupError(f"{database_named(settings)}: cannot open the database: {e}") from e
        if agent.embedding is not None:  # before the memory backend that uses it
            await _start_embedding(services, agent.embedding, settings)
        if agent.memory is not None:
            await _start_memory(services, agent.memory, settings)
        await _start_services(services, agent, plugins, settings)
        await agent.resume()  # the tools the queued turns may call are up now
        _start_jobs(agent, plugins, settings)
        yield
    finally:
        try:
            await agent.close()  # turns stop before the services they may be using
        finally:
            try:
                await services.aclose()
            finally:
                await agent.llm.aclose()


async def _start_services(
    stack: contextlib.AsyncExitStack, agent: ChatAgent, plugins: Plugins, settings: Settings
) -> None:
    services: list[tuple[str, str, Callable[[], contextlib.AbstractAsyncContextManager[Any]]]] = []

    def register_for(plugin: str) -> Callable[..., None]:
        return lambda name, context: services.append((plugin, name, context))

    call_startup(plugins.hook.register_services, register_for, agent=agent, settings=settings)
    limit = settings["AGENTIK_SERVICE_START_TIMEOUT"]
    for plugin, name, context in services:
        try:
            async with asyncio.timeout(limit):
                await stack.enter_async_context(context())
        except TimeoutError as e:
            late = TimeoutError(f"not started within {limit:g} s (AGENTIK_SERVICE_START_TIMEOUT)")
            raise PluginError(plugin, f"starting service {name!r}", late) from e
        except Exception as e:
            raise PluginError(plugin, f"starting service {name!r}", e) from e


async def _start_embedding(
    stack: contextlib.AsyncExitStack, embedding: EmbeddingBackend, settings: Settings
) -> None:
    name = settings["AGENTIK_EMBEDDING_BACKEND"]
    try:
        await embedding.start()
    except StartupError:
        raise
    except Exception as e:
        raise StartupError(f"AGENTIK_EMBEDDING_BACKEND={name!r}: cannot start: {e}") from e
    stack.push_async_callback(embedding.close)  # closed after the memory that uses it


async def _start_memory(
    stack: contextlib.AsyncExitStack, memory: MemoryBackend, settings: Settings
) -> None:
    name = settings["AGENTIK_MEMORY_BACKEND"]
    try:
        await memory.start()
    except StartupError:  # its own line, naming the variable (a dimension mismatch)
        raise
    except Exception as e:
        raise StartupError(f"AGENTIK_MEMORY_BACKEND={name!r}: cannot start: {e}") from e
    stack.push_async_callback(memory.close)  # closed after the services that may use it


def _start_jobs(agent: ChatAgent, plugins: Plugins, settings: Settings) -> None:
    def register_for(plugin: str) -> Callable[..., None]:
        def register(
            name: str, run: Callable[[], Awaitable[Any]], interval: float | None = None
        ) -> None:
            if not callable(run):
                raise TypeError(f"job {name!r}: run must be callable, not {type(run).__name__}")
            job = f"job {name!r} of plugin {plugin}"  # what its failures are logged as
            if interval is None:
                agent.jobs.spawn_call(job, run)
            else:
                agent.jobs.every(job, interval, run, one_instance=True)

        return register

    call_startup(plugins.hook.register_jobs, register_for, agent=agent, settings=settings)


async def _end_streams(app: web.Application) -> None:
    app[READINESS].stopping = True
    await app[AGENT].stop_turns()  # their listeners get Interrupted and End first
    app[AGENT].end_streams()
