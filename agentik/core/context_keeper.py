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
)
from agentik.core.llm import (
    CONTEXT_LENGTH,
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
from agentik.core.records import new_id, utcnow
from agentik.core.types import Compacted, Message

if TYPE_CHECKING:
    from agentik.core.conversation import ChatConversation

log = logging.getLogger(__name__)


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
        self._compacting = asyncio.Lock()

    async def live(self) -> LLMConversation:
        if self.llm is None:
            conv, agent = self.conv, self.conv.agent
            rows = await conv.store.list_memory(conv.id)
            prompt, items, specs = (
                agent.system_prompt(),
                [r.item for r in rows],
                agent.tools.specs(),
            )
            self.llm = agent.llm.create_conversation(prompt, items, specs)
            self.prompt = prompt
            self.tokens = context_tokens(prompt, items, specs)  # the only full scan
            self.stale = False
            self.builds += 1
        return self.llm

    async def reset(self) -> None:
        """Drop the live conversation (its context may be inconsistent, or memory changed)."""
        llm, self.llm = self.llm, None
        self.tokens = None
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

    async def _update_prompt(self, llm: LLMConversation) -> None:
        """Through the backend when it can swap the prompt, else by a rebuild."""
        prompt = self.conv.agent.system_prompt()
        if prompt == self.prompt:
            return
        if not await llm.set_system_prompt(prompt):
            await self.reset()  # live() builds it again with the new prompt
            return
        if self.tokens is not None:
            self.tokens += estimate_tokens(prompt) - estimate_tokens(self.prompt)
        self.prompt = prompt

    async def stream(self, inputs: Sequence[LLMInput], first: bool) -> AsyncIterator[LLMChunk]:
        """One send of a turn (``first``: its first): a compaction first when a plugin asks
        for one, then the stream; when the endpoint refuses the context as too long, one
        forced compaction and one retry. Keeps :attr:`tokens` running."""
        # after a compaction in a tool loop the rebuilt conversation already holds this step's
        # tool results (they are in working memory): it is sent with no new input
        if await self._compact_before_send(inputs, forced=False) and not first:
            inputs = []
        retried = False
        while True:
            llm = await self.live()
            chars, usage, streamed = 0, None, False
            try:
                async for chunk in llm.stream(inputs):
                    streamed = True
                    if isinstance(chunk, TextDelta):
                        chars += len(chunk.text)
                    elif isinstance(chunk, ToolCallRequest):
                        chars += len(chunk.name) + len(chunk.args_json)
                    elif isinstance(chunk, Usage):
                        if (problem := usage_problem(chunk)) is not None:
                            self.bad_usage(problem)
                            continue  # left out: the step's counts are unknown
                        usage = chunk
                    yield chunk
            except LLMError as e:
                if e.code != CONTEXT_LENGTH or streamed or retried:
                    raise
                retried = True
                if not await self._compact_before_send(inputs, forced=True):
                    raise
                inputs = inputs if first else []
                continue
            break
        if usage is not None and usage.input_tokens is not None:  # the backend's own count
            self.tokens = usage.input_tokens + (usage.output_tokens or 0)
        elif self.tokens is not None:
            self.tokens += inputs_tokens(inputs) + chars // 4 + MESSAGE_TOKENS

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
        tokens = self.tokens + inputs_tokens(inputs)
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
    ) -> Compaction | None:
        """See :meth:`ChatConversation.compact`."""
        conv, agent = self.conv, self.conv.agent
        async with self._compacting:
            rows = await conv.store.list_memory(conv.id)
            cut = compaction_cut(rows, keep_turns, conv.running_turn)
            if cut is None:
                return None
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
                before = context_tokens(prompt, [r.item for r in rows], specs)
            after = context_tokens(prompt, [summary, *kept], specs)
            record = Message(new_id("sum"), conv.id, "summary", utcnow(), {"text": summary.text})
            drop_before = rows[cut].order_idx if cut < len(rows) else rows[-1].order_idx + 1
            await conv.store.compact_memory(conv.id, drop_before, summary, record)
            self.compactions += 1
            self.stale = True
            conv.emit(Compacted(record.id, before, after))
            return Compaction(record.id, summary.text, len(old), len(kept), before, after)
