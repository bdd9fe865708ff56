"""The agent as an A2A server (SPEC F13; ``docs/a2a.md``): the JSON-RPC binding of A2A 1.0 and
0.3 at ``AGENTIK_A2A_PATH`` (``/a2a``), the agent card, durable tasks.

Hooks and settings only. a2a-sdk (``pip install agentik-runtime[a2a]``) is imported by the modules
beside this one at the first JSON-RPC call (or at start-up when tasks were left unfinished).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from agentik import __version__, hookimpl
from agentik.core.settings import Setting, Settings

if TYPE_CHECKING:
    from agentik.core.agent import ChatAgent

log = logging.getLogger(__name__)

STATE = "agentik_transport_a2a"


def parse_root(raw: str) -> str:
    root = "/" + raw.strip().strip("/")
    if root == "/" or any(c in root for c in "{}?#% "):
        raise ValueError("must be a path such as /a2a")
    return root


def parse_public_url(raw: str) -> str:
    url = raw.strip().rstrip("/")
    if not url.startswith(("http://", "https://")) or "://" not in url or len(url) < 10:
        raise ValueError("must be an http(s) URL such as https://agent.example.com")
    return url


SETTINGS = (
    Setting("AGENTIK_A2A_PATH", "/a2a", parse_root, "Where the A2A endpoint is mounted."),
    Setting(
        "AGENTIK_A2A_NAME",
        "agentik",
        str,
        "The agent's name on its A2A agent card (and of its MCP server, /mcp).",
    ),
    Setting(
        "AGENTIK_A2A_DESCRIPTION",
        "A stateful chat agent.",
        str,
        "The agent's description on its A2A agent card (and its MCP server's instructions).",
    ),
    Setting(
        "AGENTIK_A2A_VERSION",
        __version__,
        str,
        "The agent's version on its A2A agent card (and of its MCP server).",
    ),
    Setting(
        "AGENTIK_PUBLIC_URL",
        None,
        parse_public_url,
        "The URL clients reach this server at (behind a proxy), used in the A2A agent card; "
        "unset: the scheme and Host of each request.",
    ),
)


@hookimpl
def register_settings(register: Callable[[Setting], None]) -> None:
    for setting in SETTINGS:
        register(setting)


def setup(app: Any, agent: ChatAgent, settings: Settings) -> None:
    from agentik_transport_a2a.routes import A2ARoutes

    A2ARoutes(agent, settings, settings["AGENTIK_A2A_PATH"]).add_to(app)


@hookimpl
def register_transports(register: Callable[..., None]) -> None:
    register("a2a", setup)


@hookimpl
def register_services(register: Callable[..., None], agent: ChatAgent) -> None:
    @contextlib.asynccontextmanager
    async def tasks() -> AsyncIterator[None]:
        from agentik_transport_a2a.tasks import Tasks, TaskStore, task_models

        model, statuses = task_models()
        db = await agent.store.add_models([model, statuses])
        if db is None:
            log.warning("a2a: the store has no database; A2A calls answer an internal error")
            yield
            return
        found = Tasks(agent, TaskStore(db, model, statuses, agent.store))
        await found.start()
        agent.state[STATE] = found
        try:
            yield
        finally:
            agent.state.pop(STATE, None)
            await found.close()

    register("a2a-tasks", tasks)


#: many instances: how often one of them settles the tasks whose follower died (seconds), and
#: how long after its turn's end a task is left to its follower
ORPHANS_EVERY = 15.0
ORPHAN_GRACE = 10.0


@hookimpl
def register_jobs(register: Callable[..., None], agent: ChatAgent, settings: Settings) -> None:
    if not agent.ownership.shared:  # one instance follows every task it took
        return

    async def settle() -> None:
        tasks = agent.state.get(STATE)
        if tasks is not None:
            await tasks.settle_orphans(ORPHAN_GRACE)

    register("a2a: tasks whose follower is gone", settle, interval=ORPHANS_EVERY)


def _urls(settings: Settings) -> tuple[str, str]:
    base = settings["AGENTIK_PUBLIC_URL"]
    if base is None:
        host = settings["AGENTIK_HOST"] or "127.0.0.1"
        base = f"http://{host}:{settings['AGENTIK_PORT']}"
    root = base + settings["AGENTIK_A2A_PATH"]
    return root + "/.well-known/agent-card.json", root + "/"


def sdk_missing() -> bool:
    import importlib.util

    return importlib.util.find_spec("a2a") is None  # looked up, not imported


@hookimpl
def banner_lines(settings: Settings) -> list[str]:
    card, rpc = _urls(settings)
    if sdk_missing():
        return [f"a2a: agent card {card}; JSON-RPC off: pip install 'agentik-runtime[a2a]'"]
    return [f"a2a: agent card {card}", f"a2a: JSON-RPC {rpc} (A2A 1.0 and 0.3)"]


@hookimpl
def plugin_details(settings: Settings) -> dict[str, Any]:
    card, rpc = _urls(settings)
    details: dict[str, Any] = {"agentCard": card, "jsonrpc": rpc, "versions": ["1.0", "0.3"]}
    if sdk_missing():
        details["missing"] = "a2a-sdk: pip install 'agentik-runtime[a2a]'"
    return details
