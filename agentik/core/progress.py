"""What one turn has done so far (its steps' text, its open tool calls, its token counts) and
how it writes: the working-memory entries it defers go with its next write, so a plain turn
costs one transaction."""

from __future__ import annotations

from collections.abc import Sequence

from agentik.core.context import estimate_tokens
from agentik.core.llm import HistoryItem, ToolCallRequest, Usage
from agentik.core.store import Store
from agentik.core.turns import TurnRecord, TurnState, TurnUpdate, Wait, check_move
from agentik.core.types import (
    ImagePart,
    Message,
    MessageContext,
    TokenUsage,
    content_from_json,
    content_text,
)


class Progress:
    """What one turn has done so far: for its next step, and the interrupt and error paths."""

    __slots__ = (
        "called_tools", "calls", "compactions", "cut", "ended", "estimated", "first_input", "id",
        "last_total", "llm_text", "memory", "record", "sends", "sent_estimate", "state",
        "step_start", "steps", "text", "truncated", "usage_known", "waits",
    )  # fmt: skip

    def __init__(self, record: TurnRecord, cut: bool = False) -> None:
        self.record = record
        self.id = record.id  # read per streamed event (the running turn's id): a plain slot
        # taken up after a crash: its first call without a result may have started
        self.cut = cut
        self.state = record.state
        self.steps = record.step  # model replies recorded
        self.sends = 0  # sends to the model by this run of the turn
        self.llm_text = llm_text(record.user)  # the user's text as the model sees it
        self.ended = False  # its End event was emitted
        # working-memory entries not written yet: they go with the turn's next write, so a
        # plain turn costs one transaction (a crash or failure drops the turn's rows anyway)
        self.memory: list[HistoryItem] = []
        self.text: list[str] = []
        self.step_start = 0  # index in text of the step whose text is not in working memory
        self.calls: list[tuple[ToolCallRequest, str]] = []  # recorded, no result: (call, record)
        self.waits: tuple[Wait, ...] = record.waits
        self.called_tools = False
        self.truncated = False  # the last step's reply stopped at the output-token cap
        self.estimated = False  # a step's token counts were estimated by the backend
        # token counts (F12): the first step's input and the last step's input + output, while
        # every step reported them; the estimate of the context the first step sent
        self.first_input: int | None = None
        self.last_total: int | None = None
        self.usage_known = True
        self.sent_estimate: int | None = None
        self.compactions = 0  # of working memory while the turn ran (set by the runner)

    def move(self, state: TurnState, waits: tuple[Wait, ...] = ()) -> TurnUpdate:
        """The checked move, for :meth:`write` (the turn is in its new state once that wrote
        it: after a failed write it can still fail)."""
        check_move(self.state, state)
        return TurnUpdate(state, self.steps, waits)

    async def write(
        self,
        store: Store,
        messages: Sequence[Message] = (),
        memory: Sequence[HistoryItem] = (),
        update: TurnUpdate | None = None,
    ) -> None:
        """Records and working-memory entries of this turn (and its move) in one transaction."""
        if self.memory:
            memory, self.memory = [*self.memory, *memory], []
        # not shielded here: a Store completes a write it started even if the turn is
        # interrupted (see Store.append); a shield per write was a third of a tool hop (B13)
        cid = self.record.conversation_id
        await store.append(cid, messages, memory, turn_id=self.id, turn=update)
        if update is not None:
            self.state, self.waits = update.state, update.waits

    def count(self, usage: Usage | None) -> None:
        """Add one finished step's counts."""
        if usage is None or usage.input_tokens is None:
            self.usage_known = False
        elif self.usage_known:
            self.estimated |= usage.estimated
            if self.first_input is None:
                self.first_input = usage.input_tokens
            self.last_total = usage.input_tokens + (usage.output_tokens or 0)

    def tokens_so_far(self) -> TokenUsage:
        """What is known of an interrupted turn's counts: its finished steps' plus an estimate
        of the cut step's text, else estimates of what it sent and got (the server processed
        the prompt all the same); estimated unless every part was counted."""
        cut = estimate_tokens("".join(self.text[self.step_start :]))
        if self.usage_known and self.first_input is not None and self.last_total is not None:
            output = self.last_total - self.first_input + cut
            return TokenUsage(self.first_input, output, self.estimated or cut > 0)
        if self.sent_estimate is None:
            return TokenUsage(None, None)
        return TokenUsage(self.sent_estimate, estimate_tokens("".join(self.text)), True)

    def tokens(self, compacted: bool) -> tuple[TokenUsage, str | None]:
        """The turn's counts (F12), and what breaks the Usage contract in them, if anything:
        a context that shrank within a turn that was not compacted."""
        known = self.usage_known and self.first_input is not None and self.last_total is not None
        if not known:
            return TokenUsage(None, None, False), None
        assert self.first_input is not None and self.last_total is not None
        growth: int | None = self.last_total - self.first_input
        problem = None
        if growth is not None and growth < 0:  # the context shrank: counts of another meaning
            if not compacted:
                problem = (
                    f"the context shrank within the turn ({self.first_input} → {self.last_total})"
                )
            growth = None
        return TokenUsage(self.first_input, growth, self.estimated), problem


def llm_text(user: Message) -> str:
    ctx = user.payload.get("context")
    prefix = MessageContext.from_json(ctx).llm_prefix() if ctx else ""
    return prefix + content_text(content_from_json(user.payload["content"]))


def user_images(user: Message) -> tuple[ImagePart, ...]:
    """The user message's image parts (send let them in only for a model that takes them)."""
    raw = user.payload["content"]
    if all(p.get("type") == "text" for p in raw):  # the usual case: no parsing
        return ()
    return tuple(p for p in content_from_json(raw) if isinstance(p, ImagePart))
