"""The live LLM context of one conversation: built from working memory on first use, reused
turn after turn (a backend's KV cache), rebuilt after an error, a resume or a compaction, and
compacted when a plugin asks (F10). It keeps a running estimate of its size in tokens."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from agentik.core.context import (
    KEEP_TURNS,
    MESSAGE_TOKENS,
    Compaction,
    compaction_cut,
    context_tokens,
    estimate_tokens,
    inputs_tokens,
    item_tokens,
    text_weight,
)
from agentik.core.llm import (
    CONTEXT_LENGTH,
    SILENT_REFUSAL,
    HistoryItem,
    LLMChunk,
    LLMConversation,
    LLMError,
    LLMInput,
    TextDelta,
    ToolCallRequest,
    Usage,
    usage_problem,
)
from agentik.core.llm import Truncated as TruncatedReply
from agentik.core.observe import (
    CHAT,
    COMPACTION,
    CONVERSATION_ID,
    FINISH_REASON,
    FIRST_TOKEN,
    INPUT_TOKENS,
    MODEL,
    OUTPUT_TOKENS,
    Span,
)
from agentik.core.records import new_id, utcnow
from agentik.core.types import Compacted, Message

if TYPE_CHECKING:
    from agentik.core.conversation import ChatConversation
    from agentik.core.progress import Progress
    from agentik.core.store import MemoryRow
    from agentik.core.tools import ToolSpec

log = logging.getLogger(__name__)

#: added to the system prompt while working memory holds a reply the user interrupted (marked
#: ``extra["interrupted"]``): a mark at the end of the reply itself, small models repeated
INTERRUPTED_NOTE = (
    "Some of your replies in this conversation were interrupted by the user: they end where "
    "they were cut off."
)
NEW_CONVERSATION = "start a new conversation"


def start_anew(e: LLMError) -> LLMError:
    """The error a user sees when the conversation may no longer fit the model's context even
    after a compaction: it says to start a new conversation."""
    if NEW_CONVERSATION in e.message:
        return e
    return LLMError(
        f"{e.message}; the conversation may no longer fit the model's context window: "
        f"{NEW_CONVERSATION}",
        e.code,
    )


class ContextKeeper:
    def __init__(self, conv: ChatConversation) -> None:
        self.conv = conv
        self.llm: LLMConversation | None = None  # None: built from working memory when needed
        self.prompt = ""  # the system prompt the live conversation has
        self.stale = False  # memory was compacted: rebuild before the next turn
        #: running estimate of the live context in tokens (None: none is built)
        self.tokens: int | None = None
        self.builds = 0  # live LLM conversations built (tests and debugging)
        self.compactions = 0  # compactions of working memory since the chat was loaded
        self.holds_interrupted = False  # working memory holds a reply the user interrupted
        #: the running turn's own tools (``turn_tools``), offered beside the agent's
        self.turn_specs: tuple[ToolSpec, ...] = ()
        self._unverified: int | None = None  # the unscaled estimate of a context just built
        self._compacting = asyncio.Lock()

    async def live(self) -> LLMConversation:
        if self.llm is None:
            conv, agent = self.conv, self.conv.agent
            rows = await conv.store.list_memory(conv.id)
            items = [r.item for r in rows]
            self.holds_interrupted = any(i.extra.get("interrupted") for i in items)
            prompt, specs = self.model_prompt(), [*agent.tools.specs(), *self.turn_specs]
            self.llm = agent.llm.create_conversation(prompt, items, specs)
            self.prompt = prompt
            self._unverified = context_tokens(prompt, items, specs)  # the only full scan
            self.tokens = agent.token_scale(self._unverified)
            self.stale = False
            self.builds += 1
        return self.llm

    @property
    def turn_tool_names(self) -> frozenset[str]:
        return frozenset(s.name for s in self.turn_specs)

    async def offer(self, specs: tuple[ToolSpec, ...]) -> None:
        """Offer the model these tools of the turn's own beside the agent's; the live
        conversation, made with other tools, is built again (backends take tools when a
        conversation is made)."""
        if specs != self.turn_specs:
            self.turn_specs = specs
            await self.reset()

    async def reset(self) -> None:
        """Drop the live conversation (its context may be inconsistent, or memory changed)."""
        llm, self.llm = self.llm, None
        self.tokens = self._unverified = None
        if llm is not None:
            try:
                await llm.aclose()
            except Exception:
                log.warning(
                    "closing the LLM conversation of %s failed", self.conv.id, exc_info=True
                )

    async def prepare(self) -> None:
        """Before a turn: rebuild from memory compacted since the last one, give the live
        conversation the system prompt as its sections render now (a reflection, a persona
        edit, a skill saved since it was built), and build."""
        if self.stale:
            await self.reset()
        elif self.llm is not None:
            await self._update_prompt(self.llm)
        await self.live()

    def model_prompt(self) -> str:
        """The system prompt the model gets: the sections', and :data:`INTERRUPTED_NOTE` while
        working memory holds a reply the user interrupted."""
        prompt = self.conv.agent.system_prompt()
        if not self.holds_interrupted:
            return prompt
        return f"{prompt}\n\n{INTERRUPTED_NOTE}" if prompt else INTERRUPTED_NOTE

    async def _update_prompt(self, llm: LLMConversation) -> None:
        """Through the backend when it can swap the prompt, else by a rebuild."""
        prompt = self.model_prompt()
        if prompt == self.prompt:
            return
        if not await llm.set_system_prompt(prompt):
            await self.reset()  # live() builds it again with the new prompt
            return
        if self.tokens is not None:
            growth = estimate_tokens(prompt) - estimate_tokens(self.prompt)
            self.tokens += self.conv.agent.token_scale(growth)
        self.prompt = prompt

    async def stream(
        self, turn: Progress, inputs: Sequence[LLMInput], first: bool, tools: bool = True
    ) -> AsyncIterator[LLMChunk]:
        """One send of ``turn`` (``first``: its first; ``tools=False``: the model is offered
        none): a compaction first when a plugin asks for one, then the stream; when the
        endpoint refuses the context as too long (or, with a known window and a context near
        it, answers nothing), one forced compaction and one retry. Keeps :attr:`tokens`
        running, and learns the server's tokens per estimated token when it counts a context
        that was all estimated."""
        # after a compaction in a tool loop the rebuilt conversation already holds this step's
        # tool results (they are in working memory): it is sent with no new input
        if await self._compact_before_send(inputs, forced=False) and not first:
            inputs = []
        retried = False
        scale = self.conv.agent.token_scale
        while True:
            llm = await self.live()
            new = inputs_tokens(inputs)
            if turn.sent_estimate is None:
                turn.sent_estimate = (self.tokens or 0) + scale(new)
            unverified = None if self._unverified is None else self._unverified + new
            weight, usage, streamed, finish = 0, None, False, "stop"
            reply = llm.stream(inputs) if tools else llm.stream_without_tools(inputs)
            observers = self.conv.agent.observers
            span = self._chat_span() if observers else None
            try:
                async for chunk in reply:
                    if span is not None and not streamed:
                        span.event(FIRST_TOKEN)
                    streamed = True
                    if isinstance(chunk, TextDelta):
                        text = chunk.text  # per token: text_weight's ASCII case inlined
                        weight += len(text) if text.isascii() else text_weight(text)
                    elif isinstance(chunk, ToolCallRequest):
                        weight += len(chunk.name) + text_weight(chunk.args_json)
                        finish = "tool_calls"
                    elif isinstance(chunk, TruncatedReply):
                        finish = "length"
                    elif isinstance(chunk, Usage):
                        if (problem := usage_problem(chunk)) is not None:
                            self.bad_usage(problem)
                            continue  # left out: the step's counts are unknown
                        usage = chunk
                    yield chunk
            except BaseException as e:
                if span is not None:
                    span.end(getattr(e, "code", None) or type(e).__name__)
                if not isinstance(e, LLMError):
                    raise
                # refused again after the compaction: the last turns alone are too long
                again = retried and e.code in (CONTEXT_LENGTH, SILENT_REFUSAL)
                if streamed or not (again or self._may_be_full(e, new)):
                    raise
                if retried or not await self._compact_before_send(inputs, forced=True):
                    raise start_anew(e) from e
                retried = True
                inputs = inputs if first else []
                continue
            break
        if span is not None:
            span.end(None, **_usage_attributes(usage), **{FINISH_REASON: (finish,)})
        self._unverified = None
        if usage is not None and usage.input_tokens is not None and not usage.estimated:
            if unverified is not None:  # the whole context was estimated: learn from it
                scale.observe(unverified, usage.input_tokens)
            self.tokens = usage.input_tokens + (usage.output_tokens or 0)
        elif self.tokens is not None:  # the engine's estimate, not the backend's guess
            self.tokens += scale(new + weight // 4 + MESSAGE_TOKENS)

    def _chat_span(self) -> Span:
        llm = self.conv.agent.llm
        model = llm.model_name or llm.description or "unknown"
        attributes = {CONVERSATION_ID: self.conv.id, MODEL: model}
        return self.conv.agent.observers.start(CHAT, f"{CHAT} {model}", attributes)

    def _may_be_full(self, e: LLMError, new: int) -> bool:
        """Whether a failed send can be the context overflowing: the server said so, or it
        answered nothing while the context was at least half of a known window."""
        if e.code == CONTEXT_LENGTH:
            return True
        window = self.conv.agent.llm.context_window
        if e.code != SILENT_REFUSAL or not window or self.tokens is None:
            return False
        return self.tokens + self.conv.agent.token_scale(new) >= window // 2

    def bad_usage(self, problem: str) -> None:
        llm = self.conv.agent.llm
        log.warning(
            "LLM backend %s reported token counts that break the Usage contract: %s; the turn's "
            "counts are recorded as unknown (docs/writing_plugins.md, Tokens)",
            llm.description or type(llm).__name__,
            problem,
        )

    async def _compact_before_send(self, inputs: Sequence[LLMInput], forced: bool) -> bool:
        """Ask the ``compact_context`` hook whether to compact before this send (or, ``forced``,
        after the endpoint refused it) and run what it returns. True when working memory was
        compacted and the live conversation rebuilt. A failure is logged; the turn goes on."""
        hooks = self.conv.agent.hooks
        if hooks is None or self.tokens is None:
            return False
        tokens = self.tokens + self.conv.agent.token_scale(inputs_tokens(inputs))
        done = self.compactions
        try:
            work = hooks.compact_context(
                conversation=self.conv, context_tokens=tokens, forced=forced
            )
            if work is None:
                return False
            await work
        except Exception:
            log.warning(
                "context compaction of %s failed; the turn goes on", self.conv.id, exc_info=True
            )
            return False
        if self.compactions == done:
            return False
        await self.reset()
        await self.live()
        return True

    async def compact(
        self,
        summarize: Callable[[list[HistoryItem]], Awaitable[str | None]],
        keep_turns: int = KEEP_TURNS,
        min_tokens: int = 0,
    ) -> Compaction | None:
        """See :meth:`ChatConversation.compact`."""
        conv, agent = self.conv, self.conv.agent
        async with self._compacting:
            rows = await conv.store.list_memory(conv.id)
            cut = compaction_cut(rows, keep_turns, conv.running_turn)
            if cut is None:
                return None
            fresh = [r.item for r in rows[:cut] if r.item.role != "summary"]  # no gain in those
            if min_tokens and agent.token_scale(sum(map(item_tokens, fresh))) < min_tokens:
                return None
            if not agent.observers:
                return await self._summarize(rows, cut, summarize)
            # a span only for a compaction that calls the summary: the asks that find nothing
            # to compact (every send) are not work
            attributes = {CONVERSATION_ID: conv.id}
            with agent.observers.start(COMPACTION, COMPACTION, attributes) as span:
                done = await self._summarize(rows, cut, summarize)
                if done is None:
                    span.end("no_summary")
                else:
                    span.set(
                        **{
                            "agentik.compaction.dropped": done.dropped,
                            "agentik.compaction.tokens_before": done.tokens_before,
                            "agentik.compaction.tokens_after": done.tokens_after,
                        }
                    )
                return done

    async def _summarize(
        self,
        rows: list[MemoryRow],
        cut: int,
        summarize: Callable[[list[HistoryItem]], Awaitable[str | None]],
    ) -> Compaction | None:
        """Replace ``rows[:cut]`` by their summary (None: the summary failed, nothing changed)."""
        conv, agent = self.conv, self.conv.agent
        scale = agent.token_scale
        old = [r.item for r in rows[:cut]]
        try:
            text = await summarize(old)
        except Exception:
            log.warning("the summary for compacting %s failed", conv.id, exc_info=True)
            return None
        if not text or not text.strip():
            return None
        prompt, specs = agent.system_prompt(), agent.tools.specs()
        kept = [r.item for r in rows[cut:]]
        summary = HistoryItem("summary", text.strip())
        before = self.tokens
        if before is None or self.stale:
            before = scale(context_tokens(prompt, [r.item for r in rows], specs))
        after = scale(context_tokens(prompt, [summary, *kept], specs))
        record = Message(new_id("sum"), conv.id, "summary", utcnow(), {"text": summary.text})
        drop_before = rows[cut].order_idx if cut < len(rows) else rows[-1].order_idx + 1
        await conv.store.compact_memory(conv.id, drop_before, summary, record)
        self.compactions += 1
        self.stale = True
        conv.emit(Compacted(record.id, before, after))
        return Compaction(record.id, summary.text, len(old), len(kept), before, after)


def _usage_attributes(usage: Usage | None) -> dict[str, int]:
    if usage is None:
        return {}
    counts = {INPUT_TOKENS: usage.input_tokens, OUTPUT_TOKENS: usage.output_tokens}
    return {k: v for k, v in counts.items() if v is not None}
