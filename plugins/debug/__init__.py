"""Debug endpoints (SPEC F16), only with ``AGENTIK_DEBUG_ENDPOINTS=1``: run a feature's
background work now and see what it did (``POST /debug/reflect``, ``/debug/compact``,
``/debug/skill-mine``, ``/debug/curate``), and a conversation's token accounting
(``GET /debug/tokens``). Off, the routes do not exist (404: they are not advertised).

Feature plugins offer their actions through the ``register_debug_actions`` hook, so a new
feature plugs in without touching this one (see docs/plugin_hooks.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from agentik.core import settings as cfg
from agentik.core.settings import Setting, Settings
from agentik.hookspecs import hookimpl

log = logging.getLogger(__name__)

ENABLE = Setting(
    "AGENTIK_DEBUG_ENDPOINTS",
    False,
    cfg.parse_bool,
    "1 adds the debug endpoints (POST /debug/reflect, /debug/skill-mine, /debug/compact, "
    "/debug/curate, GET /debug/tokens). They run background work on demand: never on a "
    "server others can reach.",
)


@hookimpl
def register_settings(register: Callable[[Setting], None]) -> None:
    register(ENABLE)


def setup(app: Any, agent: Any, settings: Settings) -> None:
    if not settings["AGENTIK_DEBUG_ENDPOINTS"]:
        return
    from agentik_debug.routes import add_routes

    log.warning("debug endpoints are on (AGENTIK_DEBUG_ENDPOINTS=1): never expose this server")
    add_routes(app, agent, settings)


@hookimpl
def register_transports(register: Callable[..., None]) -> None:
    register("debug", setup)


@hookimpl
def banner_lines(settings: Settings) -> list[str] | None:
    if not settings["AGENTIK_DEBUG_ENDPOINTS"]:
        return None
    posts = ["reflect?conversationId=", "skill-mine?conversationId=", "compact?conversationId="]
    return [
        *(f"  POST /debug/{path:<45}-> 200" for path in [*posts, "curate"]),
        f"  GET  /debug/{'tokens?conversationId=':<45}-> 200",
        "WARNING: debug endpoints are on (AGENTIK_DEBUG_ENDPOINTS=1): never expose this server",
    ]
