"""The agent as an MCP server (SPEC F22; ``docs/mcp_server.md``): ``/mcp``, streamable HTTP, on
the same port and behind the same keys as every other route, so Claude Desktop, IDEs and other
agents (another agentik among them, through its ``mcp.json``) use it as a tool.

Hooks, settings and the route only: the ``mcp`` SDK (``pip install 'agentik-runtime[mcp]'``) is
imported at the first request to ``/mcp`` (:mod:`agentik_transport_mcp_server.server`), not at
start-up.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agentik import __version__, hookimpl
from agentik.core.settings import Setting, Settings, parse_url_path

if TYPE_CHECKING:
    from aiohttp import web

    from agentik.core.agent import ChatAgent

log = logging.getLogger(__name__)

PATH = "AGENTIK_MCP_SERVER_PATH"
STATE = "agentik_transport_mcp_server"  # agent.state key of the MCPDoor
MISSING = (
    "the MCP server (/mcp) is off: it needs the mcp package (pip install 'agentik-runtime[mcp]')"
)
CLOSE_TIMEOUT = 5.0  # seconds the SDK's sessions get to close at shutdown


def sdk_installed() -> bool:
    return importlib.util.find_spec("mcp") is not None  # looked up, not imported


@hookimpl
def register_settings(register: Callable[[Setting], None]) -> None:
    register(Setting(PATH, "/mcp", parse_url_path, "URL path of the MCP server (streamable HTTP)."))


def identity(settings: Settings) -> tuple[str, str, str]:
    """The server's name, version and description: the agent card's (the A2A plugin's settings,
    one source of truth for who the agent is), or agentik's own when that plugin is not loaded."""
    return (
        settings.get("AGENTIK_A2A_NAME") or "agentik",
        settings.get("AGENTIK_A2A_VERSION") or __version__,
        settings.get("AGENTIK_A2A_DESCRIPTION") or "A stateful chat agent.",
    )


class MCPDoor:
    """The route's handler. The SDK and its session manager start at the first request; the
    manager's task group lives in a task of its own (anyio's scopes are left by the task that
    entered them) until :meth:`close`."""

    def __init__(self, agent: ChatAgent, settings: Settings) -> None:
        self.agent, self.settings = agent, settings
        self._manager: Any = None
        self._lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        from agentik_transport_mcp_server.asgi import serve

        manager = await self._started()
        return await serve(manager.handle_request, request)

    async def _started(self) -> Any:
        async with self._lock:
            if self._manager is None:
                from agentik_transport_mcp_server.server import build_server, session_manager

                quiet_sdk()
                manager = session_manager(build_server(self.agent, *identity(self.settings)))
                ready = asyncio.get_running_loop().create_future()

                async def hold() -> None:
                    async with manager.run():
                        ready.set_result(None)
                        await self._stop.wait()

                def ended(task: asyncio.Task[None]) -> None:
                    if not ready.done():  # it failed to start
                        error = None if task.cancelled() else task.exception()
                        ready.set_exception(error or RuntimeError("the MCP server stopped"))

                self._task = asyncio.create_task(hold(), name="mcp-server")
                self._task.add_done_callback(ended)
                await ready
                self._manager = manager
        return self._manager

    async def close(self) -> None:
        """End every MCP session and its open streams."""
        self._stop.set()
        if self._task is not None:
            _, pending = await asyncio.wait([self._task], timeout=CLOSE_TIMEOUT)
            for task in pending:
                task.cancel()


def quiet_sdk() -> None:
    """The SDK logs every session it opens and closes at INFO: kept for debug runs."""
    sdk = logging.getLogger("mcp.server")
    if sdk.level == logging.NOTSET and logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        sdk.setLevel(logging.WARNING)


def setup(app: web.Application, agent: ChatAgent, settings: Settings) -> None:
    if not sdk_installed():  # an optional extra: the rest of the server runs without it
        log.warning(MISSING)
        return
    door = agent.state[STATE] = MCPDoor(agent, settings)

    async def handle(request: web.Request) -> web.StreamResponse:
        return await door.handle(request)

    path = settings[PATH]
    for method in ("POST", "GET", "DELETE"):
        app.router.add_route(method, path, handle)

    async def close(app: web.Application) -> None:  # open MCP streams end with the server
        await door.close()

    app.on_shutdown.append(close)


@hookimpl
def register_transports(register: Callable[..., None]) -> None:
    register("mcp", setup)


@hookimpl
def banner_lines(settings: Settings) -> list[str]:
    if not sdk_installed():
        return [MISSING]
    return [f"  {'POST ' + settings[PATH]:<48} -> MCP server (streamable HTTP)"]
