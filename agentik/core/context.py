"""The size of a live LLM context and where working memory may be cut (context compaction, F10).

Token estimates are ``chars / 4`` plus 4 per message (its role and framing), the rule of thumb
for English text with OpenAI-style tokenisers. The turn engine keeps a running count per
conversation (see ``ChatConversation.context_tokens``): it scans working memory only when it
builds the live LLM conversation, adds each step's new input and reply, and replaces the count
with the backend's own (``Usage``: the prompt plus the reply) whenever a step reports one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agentik.core.llm import HistoryItem, LLMInput
from agentik.core.store import MemoryRow
from agentik.core.tools import ToolSpec

#: what a message costs beyond its text (role, separators), in tokens
MESSAGE_TOKENS = 4
#: the whole turns compaction keeps as they are (the issue and the seed: the last 4)
KEEP_TURNS = 4


def estimate_tokens(text: str) -> int:
    return len(text) // 4


def item_tokens(item: HistoryItem) -> int:
    size = len(item.text) + len(item.args_json or "") + len(item.tool_name or "")
    return size // 4 + MESSAGE_TOKENS


def inputs_tokens(inputs: Sequence[LLMInput]) -> int:
    return sum(len(i.text) // 4 + MESSAGE_TOKENS for i in inputs)


def tools_tokens(specs: Sequence[ToolSpec]) -> int:
    if not specs:
        return 0
    schemas = [{"name": s.name, "description": s.description, "parameters": s.parameters}
               for s in specs]  # fmt: skip
    return estimate_tokens(json.dumps(schemas))


def context_tokens(
    system_prompt: str, items: Iterable[HistoryItem], specs: Sequence[ToolSpec]
) -> int:
    """The estimate of a whole context: system prompt + working memory + tool schemas."""
    return (
        estimate_tokens(system_prompt)
        + MESSAGE_TOKENS
        + sum(item_tokens(i) for i in items)
        + tools_tokens(specs)
    )


def compaction_cut(rows: Sequence[MemoryRow], keep_turns: int, running: str | None) -> int | None:
    """The index into ``rows`` where the kept part starts, or None when there is nothing to
    summarise.

    The kept part is the last ``keep_turns`` whole turns plus every entry of the ``running``
    turn (the user message id of the turn now running). A cut is always at the user entry that
    starts a turn, so a tool call is never separated from its result. Nothing to summarise:
    fewer turns than that, or only an earlier summary before them.
    """
    starts = [
        i for i, r in enumerate(rows) if r.item.role == "user" and r.turn_id != running
    ]  # the user entries that start finished turns
    if len(starts) <= keep_turns:
        return None
    cut = starts[-keep_turns] if keep_turns > 0 else _after_finished(rows, running)
    if all(r.item.role == "summary" for r in rows[:cut]):
        return None
    return cut


def _after_finished(rows: Sequence[MemoryRow], running: str | None) -> int:
    for i, r in enumerate(rows):
        if running is not None and r.turn_id == running:
            return i
    return len(rows)


@dataclass(frozen=True, slots=True)
class Compaction:
    """What one compaction did."""

    summary_id: str  #: the id of its ``summary`` audit record
    summary: str
    dropped: int  #: working-memory entries replaced by the summary
    kept: int  #: entries kept as they were
    tokens_before: int
    tokens_after: int

    def to_json(self) -> dict[str, object]:
        return {
            "summaryId": self.summary_id,
            "summary": self.summary,
            "dropped": self.dropped,
            "kept": self.kept,
            "tokensBefore": self.tokens_before,
            "tokensAfter": self.tokens_after,
        }
