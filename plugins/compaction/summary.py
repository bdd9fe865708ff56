"""The compaction policy of one agent: the threshold, the summary call, the warnings."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agentik.core.llm import HistoryItem
from agentik.core.oneshot import ask, item_entries

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
#: the output cap of a summary (five headings of short bullet points)
MAX_TOKENS = 600
#: old turns (an earlier summary aside) holding less than this share of the window are not
#: worth a summary call: when the last turns alone are over the threshold, compaction ran
#: before every turn to fold one more turn into the summary, for a gain of 30-130 tokens
MIN_GAIN = 0.25
#: conv.state key: the warning that compaction cannot help was given for this conversation
WARNED = "agentik_compaction.warned"


def summary_prompt(items: list[HistoryItem]) -> tuple[Callable[[str], str], list[str]]:
    """The prompt for ``items`` as a function of the transcript's text, and the transcript's
    entries: the earlier summary (entries of role ``summary``) apart, the others."""
    earlier = "\n\n".join(i.text for i in items if i.role == "summary") or "(none)"
    entries = item_entries([i for i in items if i.role != "summary"], MAX_ENTRY_CHARS)
    return (lambda t: PROMPT.format(summary=earlier, transcript=t or "(none)")), entries


class Compactor:
    def __init__(self, agent: ChatAgent, threshold: float) -> None:
        self.agent = agent
        self.threshold = threshold

    @property
    def limit(self) -> int | None:
        """The context size in tokens at which to compact; None: no known window (off)."""
        window = self.agent.llm.context_window
        return int(window * self.threshold) if window else None

    async def compact(
        self, conv: ChatConversation, tokens: int, forced: bool = False
    ) -> Compaction | None:
        """Compact ``conv`` whose next send would hold ``tokens``, unless the old turns are too
        short for a summary to gain much (``forced``, after the server refused the context: any
        gain); warn, once per conversation, when that leaves it at or over the limit (no
        second try: the turn goes on)."""

        async def summarize(items: list[HistoryItem]) -> str | None:
            return await self.summarize(conv, items)

        window = self.agent.llm.context_window or 0
        result = await conv.compact(summarize, min_tokens=0 if forced else int(window * MIN_GAIN))
        after = tokens if result is None else tokens - result.tokens_before + result.tokens_after
        limit = self.limit
        if limit is not None and after >= limit and not conv.state.get(WARNED):
            conv.state[WARNED] = True
            log.warning(
                "compaction of %s: the context is still %d tokens, at or over %d (%.0f%% of %d); "
                "the last turns are too long to compact (compacting what is before them gains "
                "too little, so it is skipped until it gains more): raise the context window, "
                "lower AGENTIK_COMPRESSION_THRESHOLD, or start a new conversation. Said once "
                "per conversation",
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
        prompt, transcript = summary_prompt(items)
        call = ask(
            self.agent,
            prompt,
            feature="compaction",
            max_tokens=MAX_TOKENS,
            transcript=transcript,
            system_prompt=SYSTEM_PROMPT,
            conversation_id=conv.id,
        )
        answer, _ = await asyncio.gather(
            call, self.agent.before_compaction(conv, items), return_exceptions=True
        )
        if isinstance(answer, BaseException):
            log.warning(
                "compaction of %s: the summary call failed, working memory is unchanged: %s",
                conv.id,
                getattr(answer, "message", None) or f"{type(answer).__name__}: {answer}",
            )
            return None
        if not answer.text.strip():
            log.warning("compaction of %s: the summary came back empty; not compacted", conv.id)
            return None
        return answer.text

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
