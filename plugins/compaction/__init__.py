"""Context compaction (SPEC F10): when the live context reaches a share of the model's context
window, the old turns become one summary so that a conversation can go on for thousands of
turns.

This plugin owns the policy only: when (``AGENTIK_COMPRESSION_THRESHOLD`` of the backend's
``context_window``) and how to summarise (``summary.py``). The work, an atomic operation on
working memory, is the core's ``ChatConversation.compact``; the turn engine asks the
``compact_context`` hook before every send, as it would ask any third-party plugin.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from agentik.core import settings as cfg
from agentik.core.settings import Setting, Settings
from agentik.hookspecs import hookimpl

if TYPE_CHECKING:
    from agentik.core.agent import ChatAgent
    from agentik.core.conversation import ChatConversation

THRESHOLD = Setting(
    "AGENTIK_COMPRESSION_THRESHOLD",
    0.8,
    cfg.parse_fraction,
    "Share of the model's context window (OPENAI_CONTEXT_WINDOW, AGENTIK_GOOGLE_CONTEXT_WINDOW "
    "or the model's own) at which old turns are compacted into a summary.",
)
WINDOW_VARIABLES = "OPENAI_CONTEXT_WINDOW or AGENTIK_GOOGLE_CONTEXT_WINDOW"


@hookimpl
def register_settings(register: Callable[[Setting], None]) -> None:
    register(THRESHOLD)


@hookimpl
def register_services(register: Callable[..., None], agent: ChatAgent, settings: Settings) -> None:
    @contextlib.asynccontextmanager
    async def compactor() -> AsyncIterator[None]:
        from agentik_compaction.summary import Compactor

        agent.state["agentik_compaction"] = Compactor(
            agent, settings["AGENTIK_COMPRESSION_THRESHOLD"]
        )
        try:
            yield
        finally:
            agent.state.pop("agentik_compaction", None)

    register("compaction", compactor)


@hookimpl
def compact_context(
    conversation: ChatConversation, context_tokens: int, forced: bool
) -> Awaitable[Any] | None:
    compactor = conversation.agent.state.get("agentik_compaction")
    if compactor is None:
        return None
    limit = compactor.limit
    if limit is None or (not forced and context_tokens < limit):
        return None
    return compactor.compact(conversation, context_tokens, forced)


@hookimpl
def register_debug_actions(register: Callable[..., None], agent: ChatAgent) -> None:
    compactor = agent.state.get("agentik_compaction")
    if compactor is None or compactor.limit is None:
        register("compact", None, off=WINDOW_VARIABLES)
        return

    async def compact_now(conversation: ChatConversation) -> dict[str, Any]:
        return await compactor.debug(conversation)

    register("compact", compact_now)


@hookimpl
def banner_lines(agent: ChatAgent, settings: Settings) -> list[str]:
    window = agent.llm.context_window
    if not window:
        return ["compaction: off (no context window)"]
    threshold = settings["AGENTIK_COMPRESSION_THRESHOLD"]
    return [f"compaction: on at {threshold:.0%} of {window} tokens"]
