"""Self-reflection (SPEC F11): every ``AGENTIK_REFLECTION_INTERVAL`` user turns of a
conversation a background one-shot call scores the recent turns 1-5 and names weak spots; the
last ``AGENTIK_REFLECTION_TOP_K`` reflections go into the system prompt (section order 400).

Hooks only; the work is in ``reflector.py``. Its ``reflection`` table is created on the agent's
database at start-up by a service (``Store.add_models``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from agentik.core import settings as cfg
from agentik.core.settings import Setting, Settings
from agentik.hookspecs import hookimpl

if TYPE_CHECKING:
    from agentik.core.agent import ChatAgent
    from agentik.core.conversation import ChatConversation

log = logging.getLogger(__name__)

SETTINGS = (
    Setting(
        "AGENTIK_REFLECTION_INTERVAL",
        10,
        cfg.parse_non_negative_int,
        "Self-reflection: every N user turns of a conversation the model scores its recent "
        "turns and names weak spots (in the background); 0 turns it off.",
    ),
    Setting(
        "AGENTIK_REFLECTION_TOP_K",
        3,
        cfg.parse_non_negative_int,
        "How many of the latest reflections go into the system prompt as weak spots to avoid; "
        "0 keeps them out.",
    ),
)
SECTION = "reflection"
SECTION_ORDER = 400


def weak_spots(agent: ChatAgent) -> str | None:
    """The system prompt section: the agent's latest weak spots, once its reflector runs."""
    reflector = agent.state.get("agentik_reflection")
    return reflector.prompt_section() if reflector is not None else None


@hookimpl
def register_settings(register: Callable[[Setting], None]) -> None:
    for setting in SETTINGS:
        register(setting)


@hookimpl
def register_prompt_sections(register: Callable[..., None], settings: Settings) -> None:
    if settings["AGENTIK_REFLECTION_INTERVAL"] and settings["AGENTIK_REFLECTION_TOP_K"]:
        register(SECTION, weak_spots, order=SECTION_ORDER)


@hookimpl
def register_services(register: Callable[..., None], agent: ChatAgent, settings: Settings) -> None:
    interval = settings["AGENTIK_REFLECTION_INTERVAL"]
    if not interval:
        return

    @contextlib.asynccontextmanager
    async def reflector() -> AsyncIterator[None]:
        from agentik_reflection.reflector import Reflector, reflection_model

        model = reflection_model()
        db = await agent.store.add_models([model])
        if db is None:
            log.warning("reflection: the store has no database; reflection is off")
            yield
            return
        r = Reflector(agent, db, model, interval, settings["AGENTIK_REFLECTION_TOP_K"])
        await r.load()
        agent.state["agentik_reflection"] = r
        try:
            yield
        finally:
            agent.state.pop("agentik_reflection", None)

    register("reflection", reflector)


@hookimpl
def after_turn(conversation: ChatConversation) -> Awaitable[Any] | None:
    reflector = conversation.agent.state.get("agentik_reflection")
    return reflector.after_turn(conversation) if reflector is not None else None


@hookimpl
def register_debug_actions(register: Callable[..., None], agent: ChatAgent) -> None:
    reflector = agent.state.get("agentik_reflection")
    if reflector is None:
        register("reflect", None, off="AGENTIK_REFLECTION_INTERVAL")
    else:
        register("reflect", reflector.reflect)


@hookimpl
def banner_lines(settings: Settings) -> list[str]:
    interval = settings["AGENTIK_REFLECTION_INTERVAL"]
    if not interval:
        return ["reflection: off (AGENTIK_REFLECTION_INTERVAL=0)"]
    return [f"reflection: on (every {interval} turns, top {settings['AGENTIK_REFLECTION_TOP_K']})"]
