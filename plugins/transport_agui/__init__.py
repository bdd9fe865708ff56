"""The AG-UI endpoint (SPEC F14): ``POST /agui`` takes a ``RunAgentInput`` and answers the run as
a stream of AG-UI events, so CopilotKit and any ``@ag-ui/client`` app talk to the same stateful
agent. ``docs/agui.md`` says how a client's messages meet the agent's history.

The protocol package (``ag-ui-protocol``, the ``agui`` extra) is imported only at the first
run, in :mod:`agentik_transport_agui.endpoint`.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agentik import hookimpl
from agentik.core.settings import Setting, Settings, parse_url_path
from agentik.core.tools import ToolSpec

if TYPE_CHECKING:
    from agentik.core.conversation import ChatConversation
    from agentik.core.turns import TurnRecord

log = logging.getLogger(__name__)

PATH = "AGENTIK_AGUI_PATH"
TRANSPORT = "agui"  # the ``via`` of the messages the endpoint sends (endpoint.VIA)
MISSING = "the AG-UI endpoint is off: it needs ag-ui-protocol (pip install 'agentik-runtime[agui]')"


def protocol_installed() -> bool:
    return importlib.util.find_spec("ag_ui") is not None


@hookimpl
def register_settings(register: Callable[[Setting], None]) -> None:
    register(Setting(PATH, "/agui", parse_url_path, "URL path of the AG-UI endpoint (POST)."))


def setup(app: Any, agent: Any, settings: Settings) -> None:
    if not protocol_installed():  # an optional extra: the rest of the server runs without it
        log.warning(MISSING)
        return

    async def handler(request: Any) -> Any:
        # the protocol package and pydantic (~12 MB) load at the first run, not at start:
        # a server that never serves AG-UI does not carry them (B8's RSS at rest)
        from agentik_transport_agui.endpoint import run

        return await run(request, agent)

    app.router.add_post(settings[PATH], handler)


@hookimpl
def turn_tools(conversation: ChatConversation, turn: TurnRecord) -> list[ToolSpec] | None:
    """The front end's own tools (``RunAgentInput.tools``) of a turn an AG-UI run started:
    kept in its user message's metadata (under ``agui``, translate.META), so a turn taken up
    after a restart has them too. Only a turn the AG-UI endpoint sent: metadata another door
    passes on (HTTP, A2A) cannot make a turn wait for a front end that is not there."""
    via = turn.user.payload.get("via") or {}
    if via.get("transport") != TRANSPORT:
        return None
    meta = (turn.user.payload.get("context") or {}).get("metadata") or {}
    tools = (meta.get("agui") or {}).get("tools")
    if not tools:
        return None
    return [ToolSpec(t["name"], t["description"], t["parameters"]) for t in tools]


@hookimpl
def register_transports(register: Callable[..., None]) -> None:
    register("agui", setup)


@hookimpl
def banner_lines(settings: Settings) -> list[str]:
    if not protocol_installed():
        return [MISSING]
    return [f"  POST {settings[PATH]:<43} -> SSE (AG-UI)"]
