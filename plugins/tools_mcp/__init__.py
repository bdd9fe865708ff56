"""MCP tools: every tool of the MCP servers in ``mcp.json``, as ``server__tool``.

Hooks only: ``mcp`` is imported when the service starts, and only when
``AGENTIK_MCP_CONFIG`` names a config: nothing else is read (a stray ``./mcp.json`` would run
its commands). The servers start in parallel before requests are served; one that fails is
logged, shown in the banner and skipped. See ``docs/mcp.md``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from agentik.core import settings as cfg
from agentik.core.settings import Setting, Settings
from agentik.hookspecs import hookimpl

OFF = "off"
STRAY = Path("mcp.json")  # not read unless named: the banner says so when it is there


def parse_config(raw: str) -> Path | str:
    """A path, or ``off`` (also ``none``, ``0``, ``false``, ``no``): no MCP servers at all."""
    if raw.strip().lower() in ("off", "none", "0", "false", "no"):
        return OFF
    return cfg.parse_path(raw)


SETTINGS = (
    Setting(
        "AGENTIK_MCP_CONFIG",
        OFF,
        parse_config,
        "Claude-Desktop-format mcp.json with the MCP servers whose tools the agent gets "
        "(unset or `off`: no MCP servers; a ./mcp.json is read only when named here).",
    ),
    Setting(
        "AGENTIK_MCP_START_TIMEOUT",
        30.0,
        cfg.parse_positive_float,
        "Seconds an MCP server may take to start and list its tools before it is skipped.",
    ),
    Setting(
        "AGENTIK_MCP_CALL_TIMEOUT",
        60.0,
        cfg.parse_positive_float,
        "Seconds an MCP tool call may take before the model gets an error result "
        "(AGENTIK_TOOL_TIMEOUT still caps every tool call).",
    ),
)

#: where the running MCP tools of an agent are kept, in ``agent.state`` (for the banner)
STATE = "agentik_tools_mcp"


@hookimpl
def register_settings(register: Callable[[Setting], None]) -> None:
    for setting in SETTINGS:
        register(setting)


def config_path(settings: Settings) -> Path | None:
    """The config to read: the one ``AGENTIK_MCP_CONFIG`` names, else none."""
    value = settings["AGENTIK_MCP_CONFIG"]
    return value if isinstance(value, Path) else None


@hookimpl
def register_services(register: Callable[..., None], agent: Any, settings: Settings) -> None:
    path = config_path(settings)
    if path is not None:
        register("mcp", lambda: mcp_service(agent, settings, path))


@contextlib.asynccontextmanager
async def mcp_service(agent: Any, settings: Settings, path: Path) -> AsyncIterator[Any]:
    """Start the servers, add their tools to the agent; close them all at shutdown."""
    try:
        from agentik_tools_mcp.servers import MCPTools
    except ImportError as e:
        raise RuntimeError(
            f"AGENTIK_MCP_CONFIG={str(path)!r} needs the mcp package: "
            f"pip install 'agentik-runtime[mcp]' ({e})"
        ) from e
    from agentik_tools_mcp.config import ConfigError

    quiet_libraries()

    try:
        # ${VAR} in mcp.json expands from the process environment, like Claude Desktop does
        tools = MCPTools.from_file(
            path,
            os.environ,
            start_timeout=settings["AGENTIK_MCP_START_TIMEOUT"],
            call_timeout=settings["AGENTIK_MCP_CALL_TIMEOUT"],
        )
    except ConfigError as e:
        raise RuntimeError(f"AGENTIK_MCP_CONFIG: {e}") from e
    try:
        for t in await tools.start(taken=agent.tools.names()):
            agent.tools.add(t)
        agent.state[STATE] = tools
        yield tools
    finally:
        agent.state.pop(STATE, None)
        await tools.aclose()


def quiet_libraries() -> None:
    """httpx2 logs every HTTP request at INFO, the SDK each session id: keep that for debug."""
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        for name in ("httpx2", "mcp"):
            if logging.getLogger(name).level == logging.NOTSET:
                logging.getLogger(name).setLevel(logging.WARNING)


@hookimpl
def banner_lines(agent: Any, settings: Settings) -> list[str] | None:
    tools = agent.state.get(STATE)
    if tools is not None:
        return list(tools.banner())
    if config_path(settings) is None and STRAY.is_file():
        return [f"mcp: off (./{STRAY} is not read: AGENTIK_MCP_CONFIG={STRAY} loads it)"]
    return None


@hookimpl
def plugin_details(settings: Settings) -> Awaitable[dict[str, Any]] | None:
    """For ``agentik plugins``: each server of the config, whether it starts, and its tools."""
    path = config_path(settings)
    return None if path is None else mcp_details(settings, path)


async def mcp_details(settings: Settings, path: Path) -> dict[str, Any]:
    """Start the servers as the service does, report them, and close them all again.

    ``{"config": path, "servers": {name: {"state": "ok" | "failed" | "skipped", "error": why,
    "tools": [exposed names]}}}``: ``failed`` did not start, ``skipped`` is a malformed entry.
    """
    report: dict[str, Any] = {"config": str(path)}
    try:
        from agentik_tools_mcp.servers import MCPTools
    except ImportError as e:
        report["error"] = f"needs the mcp package: pip install 'agentik-runtime[mcp]' ({e})"
        return report
    from agentik_tools_mcp.config import ConfigError

    quiet_libraries()
    try:
        tools = MCPTools.from_file(
            path,
            os.environ,
            start_timeout=settings["AGENTIK_MCP_START_TIMEOUT"],
            call_timeout=settings["AGENTIK_MCP_CALL_TIMEOUT"],
        )
    except ConfigError as e:
        report["error"] = str(e)
        return report
    skipped = dict(tools.failed)  # malformed entries, before start() adds the failures
    try:
        exposed = iter(await tools.start())
        servers: dict[str, Any] = {}
        for server in tools.servers:
            if server.state == "failed":
                servers[server.name] = {"state": "failed", "error": server.error, "tools": []}
            else:  # start() exposes the tools of the servers that started, in their order
                names = [next(exposed).name for _ in server.tools]
                servers[server.name] = {"state": "ok", "error": None, "tools": names}
        for name, why in skipped.items():
            servers[name] = {"state": "skipped", "error": why, "tools": []}
        report["servers"] = servers
        return report
    finally:
        await tools.aclose()  # every child stopped and reaped before the command goes on
