"""Conversation titles: after a conversation's first reply, one short one-shot call names it,
unless it has a title already (``AGENTIK_AUTO_TITLE``, default on). It runs in the background
(``after_turn``): a turn never waits for it; off, nothing of it runs. A conversation still
untitled when it is next loaded (an older one, or one whose call failed) is named after its
next reply.

Hooks only; the call and its answer are in ``titler.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from agentik.core.settings import Setting, Settings, parse_bool
from agentik.hookspecs import hookimpl

if TYPE_CHECKING:
    from agentik.core.agent import ChatAgent
    from agentik.core.conversation import ChatConversation

STATE = "agentik_titles"  # agent.state key: present only when titles are on


@hookimpl
def register_settings(register: Callable[[Setting], None]) -> None:
    register(
        Setting(
            "AGENTIK_AUTO_TITLE",
            True,
            parse_bool,
            "After a conversation's first reply, name it with one short model call in the "
            "background, unless it has a title; 0 turns it off.",
        )
    )


@hookimpl
def register_services(register: Callable[..., None], agent: ChatAgent, settings: Settings) -> None:
    if not settings["AGENTIK_AUTO_TITLE"]:
        return

    @contextlib.asynccontextmanager
    async def titles() -> AsyncIterator[None]:
        agent.state[STATE] = True
        try:
            yield
        finally:
            agent.state.pop(STATE, None)

    register("titles", titles)


@hookimpl
def after_turn(conversation: ChatConversation, user_text: str, assistant_text: str) -> None:
    if conversation.title is not None or STATE not in conversation.agent.state:
        return
    # once per conversation (while it is loaded): its first reply here, not each one; never
    # a temporary one (not listed: its title would not be seen)
    if conversation.is_temporal or conversation.state.get(STATE):
        return
    conversation.state[STATE] = True
    from agentik_titles.titler import title_first_reply

    # a background model call: it waits for the user to pause (agentik.core.background)
    conversation.agent.background.submit(
        "title",
        conversation.id,
        lambda: title_first_reply(conversation, user_text, assistant_text),
    )


@hookimpl
def banner_lines(settings: Settings) -> list[str]:
    if not settings["AGENTIK_AUTO_TITLE"]:
        return ["titles: off (AGENTIK_AUTO_TITLE=0)"]
    return ["titles: on (after the first reply of an untitled conversation)"]
