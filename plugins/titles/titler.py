"""The title of a conversation, from its first exchange, in one short one-shot call."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from agentik.core.oneshot import ask_json

if TYPE_CHECKING:
    from agentik.core.conversation import ChatConversation

log = logging.getLogger(__name__)

PROMPT = """Give this conversation a short title: 2 to 6 words, in the language of the \
conversation, naming its topic (no quotes, no final period).

Answer with JSON of exactly this shape: {{"title": "..."}}

User: {user}
Assistant: {assistant}
"""
QUOTE_CHARS = "\"'\u201c\u201d\u2018\u2019\u00ab\u00bb`*"  # quotes a model puts around a title
MAX_CHARS = 80
EXCHANGE_CHARS = 1500  # of each side of the exchange quoted in the prompt
MAX_TOKENS = 60  # a title in JSON: a few words


def validate(value: Any) -> str:
    """``{"title": "..."}``: the title, tidied (one line, no quotes, at most 80 characters)."""
    if not isinstance(value, dict) or not isinstance(value.get("title"), str):
        raise ValueError('expected {"title": "..."}')
    title = " ".join(value["title"].split()).strip(QUOTE_CHARS).rstrip(".").strip()
    if not title:
        raise ValueError("the title is empty")
    return title if len(title) <= MAX_CHARS else title[: MAX_CHARS - 1].rstrip() + "…"


async def title_first_reply(conv: ChatConversation, user_text: str, assistant_text: str) -> None:
    """Name ``conv`` from this exchange, unless it has a title by the time the model answered
    (a user's title set meanwhile wins)."""
    prompt = PROMPT.format(
        user=user_text[:EXCHANGE_CHARS], assistant=assistant_text[:EXCHANGE_CHARS]
    )
    title = await ask_json(
        conv.agent,
        prompt,
        validate,
        feature="title",
        purpose="auto title",
        max_tokens=MAX_TOKENS,
        conversation_id=conv.id,
    )
    if title is None:
        return
    live = await conv.agent.get_conversation(conv.id)  # it may have been reloaded meanwhile
    if live is None or live.title is not None:
        return
    await live.rename(title)
    log.info("titled %s: %s", conv.id, title)
