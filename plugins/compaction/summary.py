"""The compaction policy of one agent: the threshold, the summary call, the warnings."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from agentik.core.llm import HistoryItem
from agentik.core.oneshot import render_items

if TYPE_CHECKING:
    from agentik.core.agent import ChatAgent
    from agentik.core.context import Compaction
    from agentik.core.conversation import ChatConversation

log = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You condense conversations into a short working summary for the assistant that continues "
    "them. Keep facts, names, numbers and decisions; drop chit-chat."
)
PROMPT = """Summarise the conversation below so that the assistant can continue it without the \
original turns. Merge the earlier summary, if there is one, and the turns into ONE summary. \
Use exactly these five headings, each followed by short bullet points ("none" when empty):

Goal: what the user wants overall
Active: what is being worked on right now
Resolved: what was answered or done (with the facts, names, numbers and decisions)
Blocked: what is waiting, and on what
Remaining: what is left to do

Earlier summary:
{summary}

Turns to fold in:
{transcript}
"""
MAX_ENTRY_CHARS = 2000


def summary_prompt(items: list[HistoryItem]) -> str:
    """The prompt for ``items``: the earlier summary (entries of role ``summary``) apart, the
    other entries as a transcript."""
    earlier = "\n\n".join(i.text for i in items if i.role == "summary") or "(none)"
    transcript = render_items([i for i in items if i.role != "summary"], MAX_ENTRY_CHARS)
    return PROMPT.format(summary=earlier, transcript=transcript or "(none)")


class Compactor:
    def __init__(self, agent: ChatAgent, threshold: float) -> None:
        self.agent = agent
        self.threshold = threshold

    @property
    def limit(self) -> int | None:
        """The context size in tokens at which to compact; None: no known window (off)."""
        window = self.agent.llm.context_window
        return int(window * self.threshold) if window else None

    async def compact(self, conv: ChatConversation, tokens: int) -> Compaction | None:
        """Compact ``conv`` whose next send would hold ``tokens``; warn when that is still at or
        over the limit afterwards (no second try: the turn goes on)."""

        async def summarize(items: list[HistoryItem]) -> str | None:
            return await self.summarize(conv, items)

        result = await conv.compact(summarize)
        after = tokens if result is None else tokens - result.tokens_before + result.tokens_after
        limit = self.limit
        if limit is not None and after >= limit:
            log.warning(
                "compaction of %s: the context is still %d tokens, at or over %d (%.0f%% of %d); "
                "the last turns are too long to compact: raise the context window or lower "
                "AGENTIK_COMPRESSION_THRESHOLD",
                conv.id,
                after,
                limit,
                self.threshold * 100,
                self.agent.llm.context_window,
            )
        return result

    async def summarize(self, conv: ChatConversation, items: list[HistoryItem]) -> str | None:
        """The one-shot summary call and, at the same time, the ``before_compaction`` hooks
        (the memory feature reviews the old turns). None when the call failed (logged)."""
        answer, _ = await asyncio.gather(
            self.agent.llm.complete(summary_prompt(items), system_prompt=SYSTEM_PROMPT),
            self.agent.before_compaction(conv, items),
            return_exceptions=True,
        )
        if isinstance(answer, BaseException):
            log.warning(
                "compaction of %s: the summary call failed, working memory is unchanged: %s",
                conv.id,
                getattr(answer, "message", None) or f"{type(answer).__name__}: {answer}",
            )
            return None
        if not answer.strip():
            log.warning("compaction of %s: the summary came back empty; not compacted", conv.id)
            return None
        return answer

    async def debug(self, conv: ChatConversation) -> dict[str, Any]:
        """``POST /debug/compact``: compact now, whatever the threshold says."""
        asked = False

        async def summarize(items: list[HistoryItem]) -> str | None:
            nonlocal asked
            asked = True
            return await self.summarize(conv, items)

        result = await conv.compact(summarize)
        if result is None:
            reason = "the summary call failed" if asked else "nothing to summarise"
            return {"conversationId": conv.id, "compacted": False, "reason": reason}
        return {"conversationId": conv.id, "compacted": True, **result.to_json()}
