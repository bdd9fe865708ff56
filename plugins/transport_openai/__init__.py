"""The agent as an OpenAI-compatible model (SPEC F22; ``docs/openai_api.md``): ``GET /v1/models``
and ``POST /v1/chat/completions`` on the same port, so chat front ends and any OpenAI SDK talk to
the stateful agent. Needs nothing beyond the core (aiohttp, peewee)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from agentik import hookimpl
from agentik.core.settings import Setting, Settings, parse_bool

if TYPE_CHECKING:
    from agentik.core.agent import ChatAgent

log = logging.getLogger(__name__)

STATE = "agentik_transport_openai"  # agent.state key of the ThreadStore


def parse_model_id(raw: str) -> str:
    value = raw.strip()
    if not value or any(c.isspace() for c in value) or len(value) > 200:
        raise ValueError("must be a model name without spaces, such as agentik")
    return value


SETTINGS = (
    Setting(
        "AGENTIK_OPENAI_MODEL_ID",
        "agentik",
        parse_model_id,
        "The model name the OpenAI-compatible API (/v1) lists and answers to.",
    ),
    Setting(
        "AGENTIK_OPENAI_SHOW_TOOLS",
        False,
        parse_bool,
        "Stream the agent's tool calls and results to /v1/chat/completions clients as "
        "reasoning_content (UIs fold it like a model's reasoning); off: only the reply.",
    ),
)


@hookimpl
def register_settings(register: Callable[[Setting], None]) -> None:
    for setting in SETTINGS:
        register(setting)


def setup(app: Any, agent: ChatAgent, settings: Settings) -> None:
    from agentik_transport_openai.completions import OpenAIRoutes

    model_id = settings["AGENTIK_OPENAI_MODEL_ID"]
    OpenAIRoutes(agent, model_id, settings["AGENTIK_OPENAI_SHOW_TOOLS"]).add_to(app)


@hookimpl
def register_transports(register: Callable[..., None]) -> None:
    register("openai", setup)


@hookimpl
def register_services(register: Callable[..., None], agent: ChatAgent) -> None:
    @contextlib.asynccontextmanager
    async def threads() -> AsyncIterator[None]:
        from agentik_transport_openai.threads import ThreadStore, thread_models

        next_model, sent_model = thread_models()
        db = await agent.store.add_models([next_model, sent_model])
        if db is None:
            log.warning(
                "openai: the store has no database; every request without the "
                "X-Agentik-Conversation-Id header starts a new conversation"
            )
            yield
            return
        store = ThreadStore(db, next_model, sent_model)
        agent.state[STATE] = store
        await settle_unfinished(agent, store)
        try:
            yield
        finally:
            agent.state.pop(STATE, None)

    register("openai-threads", threads)


async def settle_unfinished(agent: ChatAgent, store: Any) -> None:
    """The conversations a stop left taken by a request: settled from how their turn ended, or
    (a turn queued to run after the restart) when it ends."""

    async def settle(sent: Any) -> None:
        conv = await agent.get_conversation(sent.conversation_id)
        end = await conv.turn_end(sent.turn_id) if conv is not None else None
        if end is not None:
            await store.settle(sent, end)

    for sent in await store.unsettled():
        agent.jobs.spawn(f"openai: settle {sent.turn_id}", settle(sent))


@hookimpl
def banner_lines(settings: Settings) -> list[str]:
    model = settings["AGENTIK_OPENAI_MODEL_ID"]
    return [
        f"  {'GET  /v1/models':<48} -> 200 (OpenAI-compatible: model {model})",
        f"  {'GET  /v1/models/{model}':<48} -> 200",
        f"  {'POST /v1/chat/completions':<48} -> SSE or 200 (OpenAI-compatible)",
    ]
