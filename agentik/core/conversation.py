"""One conversation and its turn engine: the FIFO of turns, the tool loop, interrupts, the
error path (F2) and token accounting (F12)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

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
from agentik.core.events import EventLog, StreamItem, flatten
from agentik.core.llm import (
    CONTEXT_LENGTH,
    SILENT_REFUSAL,
    HistoryItem,
    LLMChunk,
    LLMConversation,
    LLMError,
    LLMInput,
    ReasoningDelta,
    TextDelta,
    ToolCallRequest,
    ToolResultInput,
    Usage,
    UserInput,
)
from agentik.core.llm import Truncated as TruncatedReply
from agentik.core.store import Store, TokenStats, utcnow
from agentik.core.types import (
    MAX_IMAGE_BYTES,
    AppendText,
    Compacted,
    ContentPart,
    ConversationInfo,
    End,
    Error,
    Event,
    Gap,
    ImagePart,
    Interrupted,
    InvalidInput,
    Message,
    MessageContext,
    StartReasoning,
    StartResponse,
    TokenUsage,
    ToolCall,
    ToolResult,
    Truncated,
    content_from_json,
    content_text,
    content_to_json,
)

if TYPE_CHECKING:
    from agentik.core.agent import ChatAgent

log = logging.getLogger(__name__)

RESTART_ERROR = "the turn was cut off by a server restart"
#: added to the system prompt while working memory holds a reply the user interrupted (marked
#: ``extra["interrupted"]``): a mark at the end of the reply itself, small models repeated
INTERRUPTED_NOTE = (
    "Some of your replies in this conversation were interrupted by the user: they end where "
    "they were cut off."
)
#: the Error of a turn whose model still called a tool when it was offered none
TOOL_LOOP = "tool_loop"
NEW_CONVERSATION = "start a new conversation"
#: ``(order, name, render)``: ``render(agent)`` or ``render()`` gives the section's text
PromptSection = tuple[int, str, Callable[..., str | None]]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def error_record(
    conversation_id: str, user_id: str, message: str, code: str | None, partial_text: str = ""
) -> Message:
    payload: dict[str, Any] = {"message": message, "code": code, "userMessageId": user_id}
    if partial_text:  # what the user saw of the reply before it failed
        payload["partialText"] = partial_text
    return Message(new_id("err"), conversation_id, "error", utcnow(), payload)


async def unwrap_events(items: AsyncGenerator[StreamItem, None]) -> AsyncGenerator[Event, None]:
    try:
        async for item in items:
            yield item.event
    finally:
        await items.aclose()


def _start_anew(e: LLMError) -> LLMError:
    """The error a user sees when the conversation may no longer fit the model's context even
    after a compaction: it says to start a new conversation."""
    if NEW_CONVERSATION in e.message:
        return e
    return LLMError(
        f"{e.message}; the conversation may no longer fit the model's context window: "
        f"{NEW_CONVERSATION}",
        e.code,
    )


class ConversationClosed(Exception):
    """The conversation was deleted or closed; it takes no more messages."""


class _Turn:
    """What one running turn has done so far (for the interrupt and error paths)."""

    __slots__ = (
        "called_tools", "ended", "estimated", "first_input", "last_total", "llm_text", "memory",
        "open_calls", "sent_estimate", "step_start", "steps", "text", "truncated", "usage_known",
        "user",
    )  # fmt: skip

    def __init__(self, user: Message) -> None:
        self.user = user
        self.steps = 0  # sends to the model so far
        self.llm_text = ""  # the user's text as the model sees it (context prefix included)
        self.ended = False  # its End event was emitted
        # working-memory entries not written yet: they go with the turn's next write, so a
        # plain turn costs one transaction (a crash or failure drops the turn's rows anyway)
        self.memory: list[HistoryItem] = []
        self.text: list[str] = []
        self.open_calls: dict[str, tuple[str, str]] = {}  # call id -> (tool name, record id)
        self.step_start = 0  # index in text of the step whose text is not in working memory
        self.called_tools = False
        self.truncated = False  # the last step's reply stopped at the output-token cap
        self.estimated = False  # a step's token counts were estimated by the backend
        # token counts (F12): the first step's input and the last step's input + output, while
        # every step reported them; the estimate of the context the first step sent
        self.first_input: int | None = None
        self.last_total: int | None = None
        self.usage_known = True
        self.sent_estimate: int | None = None

    def count(self, usage: Usage | None) -> None:
        """Add one finished step's counts."""
        if usage is None or usage.input_tokens is None:
            self.usage_known = False
        elif self.usage_known:
            self.estimated |= usage.estimated
            if self.first_input is None:
                self.first_input = usage.input_tokens
            self.last_total = usage.input_tokens + (usage.output_tokens or 0)

    def tokens(self) -> TokenUsage:
        if not self.usage_known or self.first_input is None or self.last_total is None:
            return TokenUsage(None, None)
        return TokenUsage(self.first_input, self.last_total - self.first_input, self.estimated)

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


class ChatConversation:
    supports_image_output = False

    def __init__(self, agent: ChatAgent, info: ConversationInfo) -> None:
        self.agent = agent
        self.id = info.id
        self.title = info.title
        self.is_temporal = info.is_temporal
        self.created_at = info.created_at
        self.updated_at = info.updated_at
        self._store: Store = agent.temp_store if info.is_temporal else agent.store
        self._events = EventLog(agent.event_buffer)
        self._queue: deque[Message] = deque()
        self._worker: asyncio.Task[None] | None = None
        self._turn_task: asyncio.Task[None] | None = None
        self._interrupting = False
        self._finishing = False  # the turn is recording its end: an interrupt would split it
        self._llm: LLMConversation | None = None
        self._closed = False
        self._sending = 0  # sends between their first line and their queued turn
        self._evicted = False  # dropped from the agent's memory while idle; see _current()
        #: how many live LLM conversations were built for this chat (tests and debugging)
        self.llm_builds = 0
        #: running estimate of the live LLM context in tokens (None: none is built); see
        #: agentik.core.context
        self.context_tokens: int | None = None
        #: compactions of this chat's working memory since it was loaded
        self.compactions = 0
        self._compacting = asyncio.Lock()
        self._llm_stale = False  # memory was compacted: rebuild the live LLM at the next turn
        self._running: str | None = None  # the user message id of the running turn
        self._unverified: int | None = None  # the unscaled estimate of a context just built
        self._holds_interrupted = False  # working memory holds a reply the user interrupted
        self._turns: int | None = None  # user messages stored, once counted (count_turns)
        self._unconfirmed: set[str] = set()  # keyed sends whose write raised (see _accept)
        #: plugins' per-conversation state, by plugin name (counters, caches). It lives as long
        #: as this object: an idle conversation dropped from memory and reloaded starts empty,
        #: so keep what must last in the store.
        self.state: dict[str, Any] = {}

    # --- the protocol -----------------------------------------------------------------------

    @property
    def supports_image_input(self) -> bool:
        caps = self.agent.llm.capabilities or {}
        return bool(caps.get("image_input"))

    @property
    def busy(self) -> bool:
        return self._worker is not None and not self._worker.done()

    @property
    def idle(self) -> bool:
        """No send, turn or reader in progress: safe to drop from memory."""
        return not self.busy and not self._sending and self._events.readers == 0

    def info(self) -> ConversationInfo:
        return ConversationInfo(
            self.id, self.title, self.is_temporal, self.created_at, self.updated_at
        )

    async def send(
        self,
        content: Sequence[ContentPart],
        context: MessageContext | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> Message:
        """Record the user message (durably), queue its turn and return the record.

        With an ``idempotency_key`` this conversation already took, nothing is stored or run
        again: the first message's record is returned (a client retrying a send whose answer it
        never got)."""
        if self._evicted:
            live = await self._current()
            return await live.send(content, context, idempotency_key=idempotency_key)
        if self._closed:
            raise ConversationClosed(f"conversation {self.id} is closed")
        if not content:
            raise InvalidInput("content must not be empty")
        images = [p for p in content if isinstance(p, ImagePart)]
        if images and not self.supports_image_input:
            raise InvalidInput("this agent's model does not accept image input")
        caps = self.agent.llm.capabilities or {}
        if any(p.url is not None for p in images) and not caps.get("image_url_input", True):
            raise InvalidInput("this agent's model takes images as data, not as a url")
        if any(p.data is not None and len(p.data) * 3 // 4 > MAX_IMAGE_BYTES for p in images):
            raise InvalidInput(f"an image may be at most {MAX_IMAGE_BYTES // 2**20} MB")
        payload: dict[str, Any] = {"content": content_to_json(list(content))}
        if context is not None:
            payload["context"] = context.to_json()
        msg = Message(new_id("msg"), self.id, "user", utcnow(), payload)
        # shielded: once the write started, the turn is queued even if the caller goes away
        # (a client that disconnects before its 202)
        self._sending += 1  # from now on the conversation is not idle
        return await asyncio.shield(self._accept(msg, idempotency_key))

    async def _accept(self, msg: Message, idempotency_key: str | None = None) -> Message:
        # a count made while this write waits for its fsync already includes it
        counted = self._turns is not None
        try:
            stored = await self._store.add_user_message(msg, idempotency_key=idempotency_key)
        except Exception as e:
            if self._closed:  # deleted while the write waited
                raise ConversationClosed(f"conversation {self.id} was deleted") from e
            if idempotency_key is not None:
                # the commit may have happened all the same (the fsync after it failed): the
                # client's retry with this key finds the message, and runs it then
                self._unconfirmed.add(msg.id)
            raise
        finally:
            self._sending -= 1
        if stored is not msg:
            if stored.id not in self._unconfirmed:
                return stored  # a retry: the first send queued its turn
            self._unconfirmed.discard(stored.id)  # stored, but its sender got an error
            msg = stored
        if counted:
            self._turns = (self._turns or 0) + 1
        self.updated_at = msg.created_at
        self.agent.touch(self.id)
        self.requeue([msg])
        self.agent.publish("ConversationUpdated", self.id)
        return msg

    def requeue(self, messages: Sequence[Message]) -> None:
        """Queue the turns of stored user messages (after a restart: those never started)."""
        self._queue.extend(messages)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain(), name=f"turns-{self.id}")

    async def wait_idle(self) -> None:
        """Wait until every queued turn has run (for scripts, tests and benchmarks)."""
        while self._worker is not None and not self._worker.done():
            await asyncio.wait([self._worker])

    async def cancel_queued(self, message_id: str) -> bool:
        """Take a message whose turn has not started out of the queue and close it with a
        ``cancelled`` Error record: it never runs, not after a restart either. False when it
        is not waiting (running, over, or not this conversation's); :meth:`interrupt` stops a
        running turn. Listeners get no events for it: it never began."""
        for msg in self._queue:
            if msg.id == message_id:
                self._queue.remove(msg)  # now, before any await: the worker cannot take it
                record = error_record(self.id, msg.id, "cancelled before it started", "cancelled")
                await self._store.fail_turn(self.id, msg.id, record)
                return True
        return False

    def interrupt(self) -> bool:
        """Stop the running turn (queued sends still run). False when nothing was running."""
        if self._evicted:
            live = self.agent._live.get(self.id)
            return live.interrupt() if live is not None and live is not self else False
        task = self._turn_task
        if task is None or task.done() or self._finishing:
            return False
        self._interrupting = True
        task.cancel()
        return True

    async def ainterrupt(self) -> bool:
        """:meth:`interrupt` for code written against the agent protocol
        (:class:`agentik.core.protocol.Conversation`), where it may be a request to a server."""
        return self.interrupt()

    def events(self, after: int | None = None) -> AsyncGenerator[Event, None]:
        """The live events themselves (``StartResponse``, ``AppendText``…, ``End``) after the
        sequence id ``after``; None: from this call on, not from the first read, so a reader
        made before a send misses nothing of its turn::

            events = conv.events()
            await conv.send([TextPart("hello")])
            async for event in events:
                if event.type == "End":
                    break
        """
        return unwrap_events(self.event_items(after))

    def event_items(self, after: int | None = None) -> AsyncGenerator[StreamItem, None]:
        """:meth:`events` with their sequence ids (``StreamItem(seq, event)``), for transports
        that let a client resume after the last id it saw."""
        if after is None and not self._evicted:
            after = self._events.last_seq
        return flatten(self.event_batches(after))

    @property
    def last_event_id(self) -> int:
        """The sequence id of the newest event: read it before a ``send`` and pass it to
        :meth:`turn_events` so nothing of that turn is missed."""
        return self._events.last_seq

    def turn_events(
        self, turn_id: str, after: int | None = None
    ) -> AsyncGenerator[StreamItem, None]:
        """The items of one turn (``turn_id``: the id of the user message ``send`` returned),
        published after ``after``, through its ``End``; a transport that answers one send with
        one stream uses it, even when other sends queue on the conversation::

            after = conv.last_event_id
            message = await conv.send([TextPart("hello")])
            async for item in conv.turn_events(message.id, after):
                ...

        A :class:`~agentik.core.types.Gap` (the reader fell behind the replay buffer) is
        yielded too. The stream also stops when the conversation's log closes (shutdown,
        deletion) before the turn ended; a turn that ended before ``after`` yields nothing
        until then, so check the history first when the turn may be over."""
        return flatten(self.turn_batches(turn_id, after))

    async def turn_batches(
        self, turn_id: str, after: int | None = None
    ) -> AsyncGenerator[list[StreamItem], None]:
        """:meth:`turn_events` in lists: what was published while the reader was busy comes
        at once (one socket write, and a transport may join text deltas)."""
        batches = self.event_batches(after)
        try:
            async for batch in batches:
                mine = [i for i in batch if i.turn_id == turn_id or isinstance(i.event, Gap)]
                if mine:
                    yield mine
                if any(isinstance(i.event, End) and i.turn_id == turn_id for i in mine):
                    return
        finally:
            await batches.aclose()

    async def event_batches(
        self, after: int | None = None, linger: float = 0.0
    ) -> AsyncGenerator[list[StreamItem], None]:
        """:meth:`events` in lists: all that was published while the reader was busy (see
        :meth:`EventLog.batches`); transports write a list in one go."""
        # resolved at the first read, not when called: the object may be evicted in between
        live = await self._current() if self._evicted else self
        batches = live._events.batches(after, linger)
        try:
            async for batch in batches:
                yield batch
        finally:
            await batches.aclose()

    async def get_messages(
        self, after: str | None = None, offset: int = 0, limit: int = 50
    ) -> list[Message]:
        return await self._store.list_messages(self.id, after, offset, limit)

    async def rename(self, title: str | None) -> None:
        if self._evicted:
            return await (await self._current()).rename(title)
        now = utcnow()
        await self._store.update_conversation(self.id, updated_at=now, title=title, set_title=True)
        self.title, self.updated_at = title, now
        self.agent.publish("ConversationUpdated", self.id)

    async def close(self) -> None:
        """Stop the running turn and release the live LLM conversation. Messages still queued
        stay in the database: the next start runs them (``ChatAgent.resume``)."""
        self._closed = True
        self._queue.clear()
        self.interrupt()
        if self._worker is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        await self._reset_llm()
        self._events.close()

    async def _current(self) -> ChatConversation:
        """The agent's live object for this conversation (this one may have been evicted)."""
        live = await self.agent.get_conversation(self.id)
        if live is None:
            raise ConversationClosed(f"conversation {self.id} was deleted")
        return live

    def _evict(self) -> None:
        self._evicted = True
        self._events.close()
        if self._llm is not None:
            self.agent.jobs.spawn(f"release-llm:{self.id}", self._reset_llm())
        if self.is_temporal:  # nothing else keeps it: an idle temporary conversation ends here
            self.agent.jobs.spawn(f"forget:{self.id}", self.agent.forget_temporary(self.id))

    # --- the turn engine --------------------------------------------------------------------

    async def _drain(self) -> None:
        while self._queue and not self._closed:
            msg = self._queue.popleft()
            self._interrupting = self._finishing = False
            self._running = msg.id
            self._turn_task = asyncio.create_task(self._run_turn(msg), name=f"turn-{msg.id}")
            await asyncio.wait([self._turn_task])
            if not self._turn_task.cancelled() and self._turn_task.exception():
                log.error(
                    "turn %s of %s crashed", msg.id, self.id, exc_info=self._turn_task.exception()
                )
        self._turn_task = self._running = None
        # once this worker is done, this conversation is idle and may be dropped too
        asyncio.get_running_loop().call_soon(self.agent.conversation_idle)

    def _emit(self, event: Event) -> None:
        self._events.publish(event, self._running)

    async def _write(
        self,
        messages: Sequence[Message] = (),
        memory: Sequence[HistoryItem] = (),
        turn: _Turn | None = None,
    ) -> None:
        if turn is not None and turn.memory:
            memory, turn.memory = [*turn.memory, *memory], []
        # not shielded here: a Store completes a write it started even if the turn is
        # interrupted (see Store.append); a shield per write was a third of a tool hop (B13)
        await self._store.append(self.id, messages, memory, turn_id=turn.user.id if turn else None)

    async def _live_llm(self) -> LLMConversation:
        if self._llm is None:
            rows = await self._store.list_memory(self.id)
            items = [r.item for r in rows]
            self._holds_interrupted = any(i.extra.get("interrupted") for i in items)
            prompt, specs = self._model_prompt(), self.agent.tools.specs()
            self._llm = self.agent.llm.create_conversation(prompt, items, specs)
            self._unverified = context_tokens(prompt, items, specs)  # the only full scan
            self.context_tokens = self.agent.token_scale(self._unverified)
            self._llm_stale = False
            self.llm_builds += 1
        return self._llm

    def _model_prompt(self) -> str:
        """The system prompt the model gets: the sections', and :data:`INTERRUPTED_NOTE` while
        working memory holds a reply the user interrupted."""
        prompt = self.agent.system_prompt()
        if not self._holds_interrupted:
            return prompt
        return f"{prompt}\n\n{INTERRUPTED_NOTE}" if prompt else INTERRUPTED_NOTE

    async def _reset_llm(self) -> None:
        llm, self._llm = self._llm, None
        self.context_tokens = self._unverified = None
        if llm is not None:
            try:
                await llm.aclose()
            except Exception:
                log.warning("closing the LLM conversation of %s failed", self.id, exc_info=True)

    def _llm_text(self, user: Message) -> str:
        ctx = user.payload.get("context")
        prefix = MessageContext.from_json(ctx).llm_prefix() if ctx else ""
        return prefix + content_text(content_from_json(user.payload["content"]))

    @staticmethod
    def _images(user: Message) -> tuple[ImagePart, ...]:
        """The user message's image parts (send let them in only for a model that takes them)."""
        raw = user.payload["content"]
        if all(p.get("type") == "text" for p in raw):  # the usual case: no parsing
            return ()
        return tuple(p for p in content_from_json(raw) if isinstance(p, ImagePart))

    @staticmethod
    def _images_extra(images: tuple[ImagePart, ...]) -> dict[str, Any]:
        return {"images": [p.to_json() for p in images]} if images else {}

    async def _run_turn(self, user: Message) -> None:
        turn = _Turn(user)
        self.agent.turn_started(self.id)
        try:
            try:
                await self._turn_body(turn)
            except asyncio.CancelledError:
                await self._finish_interrupted(turn)
            except LLMError as e:
                await self._fail(turn, e.message, e.code)
            except Exception as e:
                log.exception("turn %s of %s failed", user.id, self.id)
                await self._fail(turn, f"internal error: {type(e).__name__}: {e}", "internal")
        except Exception:
            # even the end could not be recorded (the database is gone): it is closed at the
            # next start (never run again: the stop is not clean); listeners still get their
            # Error and End
            self.agent.unrecorded_ends += 1
            log.exception("recording the end of turn %s of %s failed", user.id, self.id)
        finally:
            if not turn.ended:
                self._emit(Error("the turn could not be recorded", "internal"))
                self._end(turn)
            self.agent.publish("TurnEnded", self.id)

    def _end(self, turn: _Turn) -> None:
        turn.ended = True
        self._emit(End())

    async def _turn_body(self, turn: _Turn) -> None:
        text = turn.llm_text = self._llm_text(turn.user)
        if self._llm_stale:  # compacted between turns: rebuild from the compacted memory
            await self._reset_llm()
        await self._live_llm()
        images = self._images(turn.user)
        turn.memory.append(HistoryItem("user", text, extra=self._images_extra(images)))
        extra = await self.agent.before_turn(self, text)
        inputs: Sequence[LLMInput] = [UserInput(f"{extra}\n\n{text}" if extra else text, images)]
        rounds = 0  # steps whose tool calls ran
        while True:
            step_text: list[str] = []
            calls: list[ToolCallRequest] = []
            started = reasoning = False
            step_usage: Usage | None = None
            tools = rounds < self.agent.max_tool_rounds  # then one last step without tools
            async for chunk in self._step(turn, inputs, tools):
                if isinstance(chunk, TextDelta):
                    if not started:
                        started = True
                        self._emit(StartResponse())
                    step_text.append(chunk.text)
                    turn.text.append(chunk.text)
                    self._emit(AppendText(chunk.text))
                elif isinstance(chunk, ReasoningDelta):
                    if not reasoning:
                        reasoning = True
                        self._emit(StartReasoning())
                    self._emit(AppendText(chunk.text, reasoning=True))
                elif isinstance(chunk, ToolCallRequest):
                    calls.append(chunk)
                elif isinstance(chunk, Usage):
                    step_usage = chunk
                elif isinstance(chunk, TruncatedReply):
                    turn.truncated = True
            turn.count(step_usage)
            if not calls:
                break
            if not tools:
                raise LLMError(
                    f"the model kept calling tools: after {rounds} rounds it was asked to answer "
                    "without them and called another (AGENTIK_MAX_TOOL_ROUNDS)",
                    TOOL_LOOP,
                )
            rounds += 1
            if step_text:
                await self._write(memory=[HistoryItem("assistant", "".join(step_text))], turn=turn)
            inputs = await self._run_tools(turn, calls)
        await self._finish(turn, step_text, turn.tokens())

    async def _step(
        self, turn: _Turn, inputs: Sequence[LLMInput], tools: bool = True
    ) -> AsyncIterator[LLMChunk]:
        """One send of a turn (``tools=False``: the model is offered none): a compaction first
        when a plugin asks for one, then the stream; when the endpoint refuses the context as
        too long (or, with a known window and a context near it, answers nothing), one forced
        compaction and one retry. Keeps :attr:`context_tokens` running."""
        first = turn.steps == 0
        turn.steps += 1
        # after a compaction in a tool loop the rebuilt conversation already holds this step's
        # tool results (they are in working memory): it is sent with no new input
        if await self._compact_before_send(inputs, forced=False) and not first:
            inputs = []
        retried = False
        scale = self.agent.token_scale
        while True:
            llm = await self._live_llm()
            new = inputs_tokens(inputs)
            if turn.sent_estimate is None:
                turn.sent_estimate = (self.context_tokens or 0) + scale(new)
            unverified = None if self._unverified is None else self._unverified + new
            weight, usage, streamed = 0, None, False
            reply = llm.stream(inputs) if tools else llm.stream_without_tools(inputs)
            try:
                async for chunk in reply:
                    streamed = True
                    if isinstance(chunk, TextDelta):
                        weight += text_weight(chunk.text)
                    elif isinstance(chunk, ToolCallRequest):
                        weight += len(chunk.name) + text_weight(chunk.args_json)
                    elif isinstance(chunk, Usage):
                        usage = chunk
                    yield chunk
            except LLMError as e:
                # refused again after the compaction: the last turns alone are too long
                again = retried and e.code in (CONTEXT_LENGTH, SILENT_REFUSAL)
                if streamed or not (again or self._context_may_be_full(e, new)):
                    raise
                if retried or not await self._compact_before_send(inputs, forced=True):
                    raise _start_anew(e) from e
                retried = True
                inputs = inputs if first else []
                continue
            break
        self._unverified = None
        if usage is not None and usage.input_tokens is not None and not usage.estimated:
            if unverified is not None:  # the whole context was estimated: learn from it
                scale.observe(unverified, usage.input_tokens)
            self.context_tokens = usage.input_tokens + (usage.output_tokens or 0)
        elif self.context_tokens is not None:  # the engine's estimate, not the backend's guess
            self.context_tokens += scale(new + weight // 4 + MESSAGE_TOKENS)

    def _context_may_be_full(self, e: LLMError, new: int) -> bool:
        """Whether a failed send can be the context overflowing: the server said so, or it
        answered nothing while the context was at least half of a known window."""
        if e.code == CONTEXT_LENGTH:
            return True
        window = self.agent.llm.context_window
        if e.code != SILENT_REFUSAL or not window or self.context_tokens is None:
            return False
        return self.context_tokens + self.agent.token_scale(new) >= window // 2

    async def _compact_before_send(self, inputs: Sequence[LLMInput], forced: bool) -> bool:
        """Ask the ``compact_context`` hook whether to compact before this send (or, ``forced``,
        after the endpoint refused it) and run what it returns. True when working memory was
        compacted and the live conversation rebuilt. A failure is logged; the turn goes on."""
        hooks = self.agent.hooks
        if hooks is None or self.context_tokens is None:
            return False
        tokens = self.context_tokens + self.agent.token_scale(inputs_tokens(inputs))
        done = self.compactions
        try:
            work = hooks.compact_context(conversation=self, context_tokens=tokens, forced=forced)
            if work is None:
                return False
            await work
        except Exception:
            log.warning("context compaction of %s failed; the turn goes on", self.id, exc_info=True)
            return False
        if self.compactions == done:
            return False
        await self._reset_llm()
        await self._live_llm()
        return True

    async def compact(
        self,
        summarize: Callable[[list[HistoryItem]], Awaitable[str | None]],
        keep_turns: int = KEEP_TURNS,
        min_tokens: int = 0,
    ) -> Compaction | None:
        """Replace the old turns of working memory by one summary (F10's atomic operation).

        The last ``keep_turns`` whole turns (and the running turn) stay as they are; the entries
        before them, an earlier summary included, go to ``summarize``, which returns the summary
        text. Then, in one transaction, they are replaced by one ``summary`` entry and a
        ``summary`` record is added to the audit log; a :class:`Compacted` event follows and the
        live LLM conversation is rebuilt before the next send. None, and nothing changed, when
        there is nothing to summarise, the entries to summarise (an earlier summary aside) hold
        fewer than ``min_tokens`` (too little to gain from a summary call), or ``summarize``
        returned no text or raised (logged). Safe to call between turns and while one runs:
        compactions of a chat run one at a time.
        """
        scale = self.agent.token_scale
        async with self._compacting:
            rows = await self._store.list_memory(self.id)
            cut = compaction_cut(rows, keep_turns, self._running)
            if cut is None:
                return None
            old = [r.item for r in rows[:cut]]
            fresh = [i for i in old if i.role != "summary"]  # an earlier summary is no gain
            if min_tokens and scale(sum(map(item_tokens, fresh))) < min_tokens:
                return None
            try:
                text = await summarize(old)
            except Exception:
                log.warning("the summary for compacting %s failed", self.id, exc_info=True)
                return None
            if not text or not text.strip():
                return None
            prompt, specs = self.agent.system_prompt(), self.agent.tools.specs()
            kept = [r.item for r in rows[cut:]]
            summary = HistoryItem("summary", text.strip())
            before = self.context_tokens
            if before is None or self._llm_stale:
                before = scale(context_tokens(prompt, [r.item for r in rows], specs))
            after = scale(context_tokens(prompt, [summary, *kept], specs))
            record = Message(new_id("sum"), self.id, "summary", utcnow(), {"text": summary.text})
            drop_before = rows[cut].order_idx if cut < len(rows) else rows[-1].order_idx + 1
            await self._store.compact_memory(self.id, drop_before, summary, record)
            self.compactions += 1
            self._llm_stale = True
            self._emit(Compacted(record.id, before, after))
            return Compaction(record.id, summary.text, len(old), len(kept), before, after)

    # --- what plugins read ------------------------------------------------------------------

    async def count_turns(self) -> int:
        """How many turns this conversation has had: its user messages, those still queued
        included. Counted in the store once, then kept up to date by ``send``."""
        if self._turns is None:
            self._turns = await self._store.count_turns(self.id)
        return self._turns

    async def recent_turns(self, turns: int) -> list[Message]:
        """The audit records of the last ``turns`` turns, oldest first."""
        return await self._store.recent_turns(self.id, turns)

    async def token_stats(self) -> TokenStats:
        return await self._store.token_stats(self.id)

    async def _run_tools(self, turn: _Turn, calls: list[ToolCallRequest]) -> list[LLMInput]:
        turn.step_start = len(turn.text)  # the step's text is in working memory now
        turn.called_tools, turn.truncated = True, False  # the turn goes on
        results: list[LLMInput] = []
        for call in calls:
            record_id = new_id("tc")
            turn.open_calls[call.call_id] = (call.name, record_id)
            self._emit(ToolCall(call.call_id, call.name, call.args_json))
            await self._write(
                [
                    Message(
                        record_id,
                        self.id,
                        "tool_call",
                        utcnow(),
                        {"callId": call.call_id, "toolName": call.name, "argsJson": call.args_json},
                    )
                ],
                [
                    HistoryItem(
                        "tool_call",
                        call_id=call.call_id,
                        tool_name=call.name,
                        args_json=call.args_json,
                    )
                ],
                turn,
            )
            text, is_error = await self.agent.tools.invoke(call.name, call.args_json)
            await self._record_result(turn, call.call_id, text, is_error)
            results.append(ToolResultInput(call.call_id, call.name, text))
        return results

    async def _record_result(self, turn: _Turn, call_id: str, text: str, is_error: bool) -> None:
        name, record_id = turn.open_calls.pop(call_id)
        result_id = new_id("tr")
        self._emit(ToolResult(result_id, call_id, text, is_error))
        await self._write(
            [
                Message(
                    result_id,
                    self.id,
                    "tool_result",
                    utcnow(),
                    {
                        "toolCallId": record_id,
                        "callId": call_id,
                        "toolName": name,
                        "text": text,
                        "isError": is_error,
                    },
                )
            ],
            [HistoryItem("tool_result", text, call_id=call_id, tool_name=name)],
            turn,
        )

    async def _finish(
        self, turn: _Turn, last_step: list[str], tokens: TokenUsage, interrupted: bool = False
    ) -> None:
        self._finishing = True
        payload: dict[str, Any] = {"text": "".join(turn.text), "tokens": tokens.to_json()}
        if interrupted:
            payload["interrupted"] = True
        elif turn.truncated:
            payload["truncated"] = True
        mark = {"interrupted": True} if interrupted else {}
        memory = [HistoryItem("assistant", "".join(last_step), extra=mark)] if last_step else []
        await self._write(
            [Message(new_id("as"), self.id, "assistant", utcnow(), payload)], memory, turn
        )
        if interrupted:
            self._emit(Interrupted())
        elif turn.truncated:
            self._emit(Truncated())
        self._end(turn)
        if not interrupted:
            self.agent.after_turn(self, turn.llm_text, payload["text"])

    async def _finish_interrupted(self, turn: _Turn) -> None:
        self._finishing = True
        if not self._interrupting:
            log.info("turn %s of %s cancelled by shutdown", turn.user.id, self.id)
        # the model's stream was cut: its live conversation may be inconsistent
        await self._reset_llm()
        for call_id in list(turn.open_calls):
            await self._record_result(turn, call_id, "Error: interrupted", True)
        # the model gets what it had said as it was (an empty reply keeps its context from
        # holding user, user), marked for the system prompt's note (see INTERRUPTED_NOTE)
        partial = "".join(turn.text[turn.step_start :])
        said = [partial]
        if not partial and (turn.called_tools or not turn.memory):
            said = []  # it ends with tool results, or the user's text never reached memory
        self._holds_interrupted = self._holds_interrupted or bool(said)
        await self._finish(turn, said, turn.tokens_so_far(), interrupted=True)

    async def _fail(self, turn: _Turn, message: str, code: str | None) -> None:
        """F2's error path: Error record, Error + End events, LLM reset, working memory clean."""
        self._finishing = True
        await self._reset_llm()
        partial = "".join(turn.text)  # kept in the audit log only (F2: memory stays clean)
        await self._store.fail_turn(
            self.id, turn.user.id, error_record(self.id, turn.user.id, message, code, partial)
        )
        self._emit(Error(message, code))
        self._end(turn)
