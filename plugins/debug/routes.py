"""The debug routes: actions the feature plugins offer, and token accounting."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from agentik.core.agent import ChatAgent, ChatConversation
from agentik.core.app import error_response
from agentik.core.settings import Settings

#: the variable that turns on each action the issue names, for when no installed plugin
#: offers it (a plugin that registers the action says it itself)
KNOWN = {
    "reflect": "AGENTIK_REFLECTION_INTERVAL",
    "skill-mine": "AGENTIK_SKILL_MINING_INTERVAL",
    "compact": "OPENAI_CONTEXT_WINDOW or AGENTIK_GOOGLE_CONTEXT_WINDOW",
    "curate": "AGENTIK_MEMORY_BACKEND",
}


@dataclass(frozen=True)
class Action:
    run: Callable[..., Awaitable[dict[str, Any]]] | None
    conversation: bool = True
    off: str | None = None


def actions(agent: ChatAgent, settings: Settings) -> dict[str, Action]:
    found: dict[str, Action] = {}

    def register(
        name: str,
        run: Callable[..., Awaitable[dict[str, Any]]] | None,
        *,
        conversation: bool = True,
        off: str | None = None,
    ) -> None:
        found.setdefault(name, Action(run, conversation, off))

    if agent.hooks is not None:
        agent.hooks.register_debug_actions(register=register, agent=agent, settings=settings)
    return found


async def conversation_of(request: web.Request, agent: ChatAgent) -> ChatConversation:
    cid = request.query.get("conversationId")
    if not cid:
        raise web.HTTPBadRequest(text="conversationId is required")
    conv = await agent.get_conversation(cid)
    if conv is None:
        raise web.HTTPNotFound(text=f"no conversation {cid!r}")
    return conv


def feature_off(name: str, variable: str) -> web.Response:
    return error_response(
        409, "feature_off", f"{name}: the feature is off or not installed; it needs {variable}"
    )


def add_routes(app: web.Application, agent: ChatAgent, settings: Settings) -> None:
    async def run_action(request: web.Request) -> web.Response:
        name = request.match_info["action"]
        action = actions(agent, settings).get(name)
        if action is None:
            if name in KNOWN:
                return feature_off(name, KNOWN[name])
            raise web.HTTPNotFound(text=f"no debug action {name!r}")
        if action.run is None:
            return feature_off(name, action.off or KNOWN.get(name, "its plugin's settings"))
        if action.conversation:
            result = await action.run(await conversation_of(request, agent))
        else:
            result = await action.run()
        return web.json_response(result)

    async def tokens(request: web.Request) -> web.Response:
        conv = await conversation_of(request, agent)
        stats = await conv.token_stats()
        return web.json_response(
            {
                "conversationId": conv.id,
                **stats.to_json(),
                "contextTokens": stats.context,
                "liveContextTokens": conv.context_tokens,
                "contextWindow": agent.llm.context_window,
                "compactions": conv.compactions,
            }
        )

    app.router.add_get("/debug/tokens", tokens)
    app.router.add_post("/debug/{action}", run_action)
