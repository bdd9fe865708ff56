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
)
from agentik.core.events import EventLog, StreamItem, flatten
from agentik.core.llm import (
    CONTEXT_LENGTH,
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
    usage_problem,
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
    UserMessage,
    Via,
    content_from_json,
    content_text,
    content_to_json,
)

if TYPE_CHECKING:
    from agentik.core.agent import ChatAgent

log = logging.getLogger(__name__)

RESTART_ERROR = "the turn was cut off by a server restart"
STORAGE_ERROR = "the turn's end could not be recorded: the database failed"
#: what the model sees after the partial reply of an interrupted turn (never ``user, user``)
INTERRUPTED_MARK = "[interrupted by the user]"
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


class ConversationClosed(Exception):
    """The conversation was deleted or closed; it takes no more messages."""


class _Turn:
    """What one running turn has done so far (for the interrupt and error paths)."""

    __slots__ = (
        "called_tools", "compacted", "ended", "estimated", "llm_text", "memory", "open_calls",
        "step_start", "steps", "text", "truncated", "user",
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
        self.compacted = False  # working memory was compacted during the turn (context shrank)


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
        self._events = EventLog(agent.event_buffer, agent.event_ids)
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
        self._prompt = ""  # the system prompt the live LLM conversation has
        self._running: str | None = None  # the user message id of the running turn
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
        via: Via | None = None,
    ) -> Message:
        """Record the user message (durably), queue its turn and return the record.

        With an ``idempotency_key`` this conversation already took, nothing is stored or run
        again: the first message's record is returned (a client retrying a send whose answer it
        never got). ``via``: the transport that took it and the sender it names (a transport
        passes it; kept on the record and shown to other viewers in ``UserMessage``)."""
        if self._evicted:
            live = await self._current()
            return await live.send(content, context, idempotency_key=idempotency_key, via=via)
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
        if via is not None:
            payload["via"] = via.to_json()
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
        accepted = UserMessage.of(msg)  # every viewer sees what starts the turns that follow
        self._events.publish(accepted)
        self.agent.announce(accepted)
        self.agent.publish("ConversationUpdated", self.id)
        return msg

    def requeue(self, messages: Sequence[Message]) -> None:
        """Queue the turns of stored user messages (after a restart: those never started)."""
        self._queue.extend(messages)
        if self.agent.stopping:  # stored, and run after the next start
            return
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain(), name=f"turns-{self.id}")

    async def wait_idle(self) -> None:
        """Wait until every queued turn has run (for scripts, tests and benchmarks)."""
        while self._worker is not None and not self._worker.done():
            await asyncio.wait([self._worker])

    async def turn_state(self, turn_id: str) -> tuple[str, str | None]:
        """Where the turn of the user message ``turn_id`` stands: ``queued``, ``running``,
        ``done``, ``interrupted``, ``failed`` or ``cancelled``, with the error code of a failed
        or cancelled one (``restart``: a crash cut it). A client that resends a message learns
        from it whether anything will still answer."""
        if self._evicted:
            return await (await self._current()).turn_state(turn_id)
        state = self.agent.unrecorded_state(turn_id)  # its end waits for the database
        if state is not None:
            return state
        if turn_id == self._running:
            return "running", None
        if any(m.id == turn_id for m in self._queue):
            return "queued", None
        end = await self._store.turn_end(turn_id)
        if end is None:
            return "queued", None
        if end.kind == "assistant":
            return ("interrupted" if end.payload.get("interrupted") else "done"), None
        code = end.payload.get("code")
        return ("cancelled" if code == "cancelled" else "failed"), code

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
        self, turn_id: str, after: int | None = None, linger: float = 0.0
    ) -> AsyncGenerator[list[StreamItem], None]:
        """:meth:`turn_events` in lists: what was published while the reader was busy comes
        at once (one socket write, and a transport may join text deltas); with ``linger``
        (seconds) the reader waits that long after news to gather more (fewer, later lists)."""
        batches = self.event_batches(after, linger)
        try:
            async for batch in batches:
                mine = [i for i in batch if i.turn_id == turn_id or isinstance(i.event, Gap)]
                if mine:
                    yield mine
                if any(isinstance(i.event, End) and i.turn_id == turn_id for i in mine):
                    return
        finally:
            await batches.aclose()

    async def turn_end(self, turn_id: str) -> Message | None:
        """The record that ended the turn ``turn_id`` (its ``assistant`` or ``error`` record),
        once it has ended (at once when it has); None when the conversation's event log closed
        first (shutdown, deletion). For a transport that answers a request with the turn's
        outcome, from the audit log: what a listener that fell behind missed is in it."""
        after = self.last_event_id  # before the read: an End published meanwhile is not missed
        end = await self._store.turn_end(turn_id)
        if end is None:
            items = self.turn_events(turn_id, after)
            try:
                async for item in items:
                    if isinstance(item.event, End):
                        break
            finally:
                await items.aclose()
            end = await self._store.turn_end(turn_id)
        return end

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
        self,
        after: str | None = None,
        offset: int = 0,
        limit: int = 50,
        *,
        max_bytes: int | None = None,
    ) -> list[Message]:
        """A page of the history (``max_bytes``: see :meth:`Store.list_messages`)."""
        return await self._store.list_messages(self.id, after, offset, limit, max_bytes=max_bytes)

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
        while self._queue and not self._closed and not self.agent.stopping:
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
        asyncio.get_running_loop().call_soon(self.agent.evict_idle)

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
            prompt, items, specs = (
                self.agent.system_prompt(),
                [r.item for r in rows],
                self.agent.tools.specs(),
            )
            self._llm = self.agent.llm.create_conversation(prompt, items, specs)
            self._prompt = prompt
            self.context_tokens = context_tokens(prompt, items, specs)  # the only full scan
            self._llm_stale = False
            self.llm_builds += 1
        return self._llm

    async def _update_prompt(self, llm: LLMConversation) -> None:
        """Before a turn: the system prompt as its sections render now (a reflection, a persona
        edit, a skill saved since the live conversation was built) goes to the live
        conversation, through the backend when it can swap it, else by a rebuild."""
        prompt = self.agent.system_prompt()
        if prompt == self._prompt:
            return
        if not await llm.set_system_prompt(prompt):
            await self._reset_llm()  # _live_llm builds it again with the new prompt
            return
        if self.context_tokens is not None:
            self.context_tokens += estimate_tokens(prompt) - estimate_tokens(self._prompt)
        self._prompt = prompt

    async def _reset_llm(self) -> None:
        llm, self._llm = self._llm, None
        self.context_tokens = None
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
        self.agent.publish("TurnStarted", self.id)
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
        except Exception as e:
            # even the end could not be recorded (a full disk): the agent writes the turn's
            # Error record once the database takes writes again (else the next start closes
            # it); listeners still get their Error and End now
            log.error("recording the end of turn %s of %s failed: %s", user.id, self.id, e)
            record = error_record(self.id, user.id, STORAGE_ERROR, "storage", "".join(turn.text))
            self.agent.record_end_later(self._store, record)
        finally:
            if not turn.ended:
                self._emit(Error("the turn could not be recorded", "internal"))
                self._end(turn)
            self.agent.publish("TurnEnded", self.id)

    def _end(self, turn: _Turn) -> None:
        turn.ended = True
        self._emit(End(turn.user.id))

    async def _turn_body(self, turn: _Turn) -> None:
        text = turn.llm_text = self._llm_text(turn.user)
        if self._llm_stale:  # compacted between turns: rebuild from the compacted memory
            await self._reset_llm()
        elif self._llm is not None:
            await self._update_prompt(self._llm)
        await self._live_llm()
        images = self._images(turn.user)
        turn.memory.append(HistoryItem("user", text, extra=self._images_extra(images)))
        extra = await self.agent.before_turn(self, text)
        inputs: Sequence[LLMInput] = [UserInput(f"{extra}\n\n{text}" if extra else text, images)]
        first_input: int | None = None
        last_total: int | None = None
        usage_known = True
        while True:
            step_text: list[str] = []
            calls: list[ToolCallRequest] = []
            started = reasoning = False
            step_usage: Usage | None = None
            async for chunk in self._step(turn, inputs):
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
                    turn.estimated |= chunk.estimated
                elif isinstance(chunk, TruncatedReply):
                    turn.truncated = True
            if step_usage is None or step_usage.input_tokens is None:
                usage_known = False
            elif usage_known:
                if first_input is None:
                    first_input = step_usage.input_tokens
                last_total = step_usage.input_tokens + (step_usage.output_tokens or 0)
            if not calls:
                break
            if step_text:
                await self._write(memory=[HistoryItem("assistant", "".join(step_text))], turn=turn)
            inputs = await self._run_tools(turn, calls)
        growth = (
            last_total - first_input
            if usage_known and last_total is not None and first_input is not None
            else None
        )
        if growth is not None and growth < 0:  # the context shrank: counts of another meaning
            if not turn.compacted:
                self._bad_usage(
                    f"the context shrank within the turn ({first_input} → {last_total})"
                )
            growth = None
        tokens = TokenUsage(
            first_input if usage_known else None, growth, usage_known and turn.estimated
        )
        await self._finish(turn, step_text, tokens)

    async def _step(self, turn: _Turn, inputs: Sequence[LLMInput]) -> AsyncIterator[LLMChunk]:
        """One send of a turn: a compaction first when a plugin asks for one, then the stream;
        when the endpoint refuses the context as too long, one forced compaction and one retry.
        Keeps :attr:`context_tokens` running."""
        first = turn.steps == 0
        turn.steps += 1
        # after a compaction in a tool loop the rebuilt conversation already holds this step's
        # tool results (they are in working memory): it is sent with no new input
        if await self._compact_before_send(inputs, forced=False):
            turn.compacted = True
            if not first:
                inputs = []
        retried = False
        while True:
            llm = await self._live_llm()
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
                            self._bad_usage(problem)
                            continue  # left out: the step's counts are unknown
                        usage = chunk
                    yield chunk
            except LLMError as e:
                if e.code != CONTEXT_LENGTH or streamed or retried:
                    raise
                retried = True
                if not await self._compact_before_send(inputs, forced=True):
                    raise
                turn.compacted = True
                inputs = inputs if first else []
                continue
            break
        if usage is not None and usage.input_tokens is not None:  # the backend's own count
            self.context_tokens = usage.input_tokens + (usage.output_tokens or 0)
        elif self.context_tokens is not None:
            self.context_tokens += inputs_tokens(inputs) + chars // 4 + MESSAGE_TOKENS

    def _bad_usage(self, problem: str) -> None:
        llm = self.agent.llm
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
        hooks = self.agent.hooks
        if hooks is None or self.context_tokens is None:
            return False
        tokens = self.context_tokens + inputs_tokens(inputs)
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
    ) -> Compaction | None:
        """Replace the old turns of working memory by one summary (F10's atomic operation).

        The last ``keep_turns`` whole turns (and the running turn) stay as they are; the entries
        before them, an earlier summary included, go to ``summarize``, which returns the summary
        text. Then, in one transaction, they are replaced by one ``summary`` entry and a
        ``summary`` record is added to the audit log; a :class:`Compacted` event follows and the
        live LLM conversation is rebuilt before the next send. None, and nothing changed, when
        there is nothing to summarise or ``summarize`` returned no text or raised (logged).
        Safe to call between turns and while one runs: compactions of a chat run one at a time.
        """
        async with self._compacting:
            rows = await self._store.list_memory(self.id)
            cut = compaction_cut(rows, keep_turns, self._running)
            if cut is None:
                return None
            old = [r.item for r in rows[:cut]]
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
                before = context_tokens(prompt, [r.item for r in rows], specs)
            after = context_tokens(prompt, [summary, *kept], specs)
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
        memory = [HistoryItem("assistant", "".join(last_step))] if last_step else []
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
        # the model gets what it had said, marked, so its context never holds user, user
        partial = "".join(turn.text[turn.step_start :])
        said = [f"{partial}\n\n{INTERRUPTED_MARK}" if partial else INTERRUPTED_MARK]
        if not partial and (turn.called_tools or not turn.memory):
            said = []  # it ends with tool results, or the user's text never reached memory
        await self._finish(turn, said, TokenUsage(None, None), interrupted=True)

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
