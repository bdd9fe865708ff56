"""The size of a live LLM context and where working memory may be cut (context compaction, F10).

Token estimates are ``chars / 4`` plus 4 per message (its role and framing) for ASCII text,
the rule of thumb for English with OpenAI-style tokenisers; other scripts cost more tokens per
character, so they are counted conservatively (:func:`text_weight`), and :class:`TokenScale`
corrects the estimate by the counts the server reports. The turn engine keeps a running count per
conversation (see ``ChatConversation.context_tokens``): it scans working memory only when it
builds the live LLM conversation, adds each step's new input and reply, and replaces the count
with the backend's own (``Usage``: the prompt plus the reply) whenever a step reports one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agentik.core.llm import HistoryItem, LLMInput
from agentik.core.store import MemoryRow
from agentik.core.tools import ToolSpec

#: what a message costs beyond its text (role, separators), in tokens
MESSAGE_TOKENS = 4
#: the whole turns compaction keeps as they are (the issue and the seed: the last 4)
KEEP_TURNS = 4


def text_weight(text: str) -> int:
    """A text's size in quarter tokens: one per ASCII character (4 characters a token) and,
    for every other character, two more per extra byte of its UTF-8 form: Cyrillic, Greek or
    Arabic 3/4 of a token, CJK 5/4, an emoji 7/4. Small models' tokenisers split such text
    much finer than English; counting low let a Russian chat with emoji overflow a 1,024-token
    window at an estimate of 383 (issue 23)."""
    if text.isascii():  # the usual case, at C speed
        return len(text)
    return len(text) + 2 * (len(text.encode("utf-8", "surrogatepass")) - len(text))


def estimate_tokens(text: str) -> int:
    return text_weight(text) // 4


def item_tokens(item: HistoryItem) -> int:
    size = text_weight(item.text) + text_weight(item.args_json or "") + len(item.tool_name or "")
    return size // 4 + MESSAGE_TOKENS


def inputs_tokens(inputs: Sequence[LLMInput]) -> int:
    return sum(estimate_tokens(i.text) + MESSAGE_TOKENS for i in inputs)


class TokenScale:
    """How the estimates compare with one model's own counts: a factor learnt from the
    ``usage`` the server reports (one-shot calls, steps sent right after the live conversation
    was built from working memory), applied to every estimate of that model's context.

    It moves a quarter of the way to each new ratio, and stays between :attr:`LOW` and
    :attr:`HIGH` (one odd reply cannot make compaction run at every turn or never)."""

    LOW, HIGH = 0.5, 4.0
    MIN_SAMPLE = 32  #: estimates smaller than this say too little about the tokeniser

    def __init__(self) -> None:
        self.factor = 1.0
        self.samples = 0

    def observe(self, estimated: int, counted: int) -> None:
        """The server counted ``counted`` tokens where the (unscaled) estimate was ``estimated``."""
        if estimated < self.MIN_SAMPLE or counted <= 0:
            return
        ratio = min(max(counted / estimated, self.LOW), self.HIGH)
        self.factor = ratio if self.samples == 0 else 0.75 * self.factor + 0.25 * ratio
        self.samples += 1

    def __call__(self, estimate: int) -> int:
        """``estimate`` scaled to what the model would count."""
        return estimate if self.factor == 1.0 else math.ceil(estimate * self.factor)


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
