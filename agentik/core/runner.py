"""The turn runner: one turn as a series of durable steps (F1, F2, F6, F12, F19).

A step is one reply of the model; when it calls tools, the step's text and all its calls are
recorded in one write (with the turn's state), then each result as it comes. What is recorded
is what a turn resumes from: after a crash (:meth:`TurnRunner.run` of a ``running`` turn) and
after a wait (a tool call held by a ``tool_call_gate`` until ``resume_turn`` answers it). A
resumed turn rebuilds its live context from working memory, which holds its recorded steps.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from agentik.core.llm import (
    HistoryItem,
    LLMError,
    LLMInput,
    ReasoningDelta,
    TextDelta,
    ToolCallRequest,
    Usage,
    UserInput,
)
from agentik.core.llm import Truncated as TruncatedReply
from agentik.core.observe import (
    CONVERSATION_ID,
    ERROR_CODE,
    INPUT_TEXT,
    OUTCOME,
    OUTPUT_TEXT,
    TRANSPORT,
    TURN,
    TURN_ID,
    Span,
    TurnScope,
    turn_scope,
)
from agentik.core.progress import Progress, user_images
from agentik.core.records import error_record, new_id, utcnow
from agentik.core.store.base import LeaseLost
from agentik.core.tool_steps import ToolSteps
from agentik.core.turns import TurnRecord, TurnState, TurnStateError, check_move
from agentik.core.types import (
    AppendText,
    End,
    Error,
    Event,
    Interrupted,
    Message,
    StartReasoning,
    StartResponse,
    Truncated,
)

if TYPE_CHECKING:
    from agentik.core.conversation import ChatConversation

log = logging.getLogger(__name__)

RESTART_ERROR = "the turn was cut off by a server restart"
STORAGE_ERROR = "the turn's end could not be recorded: the database failed"
#: the Error of a turn whose model still called a tool when it was offered none
TOOL_LOOP = "tool_loop"


class TurnRunner:
    """Runs the turns of one conversation, one at a time (the inbox calls :meth:`run`)."""

    def __init__(self, conv: ChatConversation) -> None:
        self.conv = conv
        self.task: asyncio.Task[None] | None = None
        self.turn: Progress | None = None
        self._interrupting = False
        self._abandoning = False  # a stop hands the turn to another instance (see abandon)
        self._finishing = False  # the turn is recording its end: an interrupt would split it
        self.tools = ToolSteps(conv)
        self.span: Span | None = None  # the running turn's, when something observes

    async def run(
        self,
        record: TurnRecord,
        *,
        cut: bool = False,
        cancel: bool = False,
        trace_links: Sequence[dict[str, str]] = (),
    ) -> TurnRecord:
        """Run a turn (a new one, or one a crash or a wait left) until it ends or waits.
        ``cut``: a crash stopped it while it ran; ``cancel``: end a waiting turn as interrupted;
        ``trace_links``: the trace headers of the requests that answered its waits.
        Returns the turn as it stands then."""
        self.turn = turn = Progress(record, cut)
        turn.compactions = self.conv.context.compactions
        self._interrupting, self._finishing, self._abandoning = cancel, False, False
        self.task = asyncio.create_task(
            self._run(turn, cancel, trace_links), name=f"turn-{record.id}"
        )
        try:
            await asyncio.wait([self.task])
            if not self.task.cancelled() and self.task.exception() is not None:
                error = self.task.exception()
                if isinstance(error, LeaseLost):  # the inbox stops running this conversation
                    raise error
                log.error("turn %s of %s crashed", record.id, self.conv.id, exc_info=error)
            return replace(record, state=turn.state, step=turn.steps, waits=turn.waits)
        finally:
            self.task = self.turn = None

    def interrupt(self) -> bool:
        task = self.task
        if task is None or task.done() or self._finishing:
            return False
        self._interrupting = True
        task.cancel()
        return True

    def abandon(self) -> bool:
        """Stop the running turn as a crash would (a stop that hands it to another instance):
        nothing more of it is recorded or said here; the next owner resumes it from its last
        recorded step."""
        task = self.task
        if task is None or task.done() or self._finishing:
            return False
        self._abandoning = True
        task.cancel()
        return True

    async def _run(
        self, turn: Progress, cancel: bool, trace_links: Sequence[dict[str, str]]
    ) -> None:
        agent = self.conv.agent
        via = turn.record.user.payload.get("via")
        transport = via.get("transport") if isinstance(via, dict) else None
        # this task's own: log lines and plugins see which turn they are in
        turn_scope.set(TurnScope(self.conv.id, turn.id, transport))
        if agent.observers:
            attributes = {
                CONVERSATION_ID: self.conv.id,
                TURN_ID: turn.id,
                TRANSPORT: transport,
                INPUT_TEXT: turn.llm_text,
            }
            # in the trace of the request that sent the message, every part of the turn
            trace = turn.record.user.payload.get("trace")
            self.span = agent.observers.start(
                TURN,
                f"{TURN} {agent.id}",
                attributes,
                root=True,
                trace_parent=trace if isinstance(trace, dict) else None,
                trace_links=trace_links,
            )
        agent.turn_started(self.conv.id)
        gone = False  # the turn goes on elsewhere, or ended there: nothing more of it here
        # a move the store refuses: ended through another instance (store shared), else a bug
        elsewhere = (TurnStateError,) if self.conv.ownership.shared else ()
        try:
            try:
                if cancel:
                    await self._restore(turn)
                    raise asyncio.CancelledError
                if turn.state is TurnState.QUEUED:
                    inputs = await self._start(turn)
                else:
                    await self._restore(turn)
                    inputs = []
                await self._steps(turn, inputs)
            except asyncio.CancelledError:
                if self._abandoning:
                    raise _Abandoned from None
                await self._finish_interrupted(turn)
            except (LeaseLost, *elsewhere):
                raise
            except LLMError as e:
                await self._fail(turn, e.message, e.code)
            except Exception as e:
                log.exception("turn %s of %s failed", turn.id, self.conv.id)
                await self._fail(turn, f"internal error: {type(e).__name__}: {e}", "internal")
        except _Abandoned:
            gone = True
        except LeaseLost:
            # another instance took the conversation over: it resumes the turn
            gone = True
            raise
        except elsewhere as e:
            # ended through another instance (a queued send cancelled as it started, the
            # conversation deleted): nothing more to record
            log.warning("turn %s of %s ended elsewhere: %s", turn.id, self.conv.id, e)
            if not turn.ended:
                self._end(turn)
        except Exception as e:
            # even the end could not be recorded (a full disk): the agent writes the turn's
            # Error record once the database takes writes again (else the next start takes the
            # turn up again); listeners still get their Error and End now
            log.error("recording the end of turn %s of %s failed: %s", turn.id, self.conv.id, e)
            if self.span is not None:
                self.span.set(**{ERROR_CODE: "storage"})
            partial = "".join(turn.text)
            record = error_record(self.conv.id, turn.id, STORAGE_ERROR, "storage", partial)
            self.conv.agent.record_end_later(self.conv.store, record)
        finally:
            if not turn.ended and turn.state is not TurnState.WAITING and not gone:
                self._emit(Error("the turn could not be recorded", "internal"))
                self._end(turn)
            waiting = turn.state is TurnState.WAITING
            agent.publish("TurnWaiting" if waiting else "TurnEnded", self.conv.id)
            if self.span is not None:
                span, self.span = self.span, None
                error = span.attributes.get(ERROR_CODE)  # set by _fail, or when the end failed
                span.end(error, **{OUTCOME: "failed" if error else turn.state.value})

    # --- starting and resuming --------------------------------------------------------------

    async def _start(self, turn: Progress) -> list[LLMInput]:
        await self.conv.context.offer(self.conv.agent.turn_tools(self.conv, turn.record))
        await self.conv.context.prepare()
        images = user_images(turn.record.user)
        extra = {"images": [p.to_json() for p in images]} if images else {}
        turn.memory.append(HistoryItem("user", turn.llm_text, extra=extra))
        prefix = await self.conv.agent.before_turn(self.conv, turn.llm_text)
        text = f"{prefix}\n\n{turn.llm_text}" if prefix else turn.llm_text
        return [UserInput(text, images)]

    async def _restore(self, turn: Progress) -> None:
        """Take up a turn from what it recorded: its steps' text, its calls without results.
        The live context is rebuilt from working memory, which holds them."""
        await self.conv.context.reset()
        await self.conv.context.offer(self.conv.agent.turn_tools(self.conv, turn.record))
        open_calls: dict[str, tuple[ToolCallRequest, str]] = {}
        for row in await self.conv.store.list_memory(self.conv.id):
            item = row.item
            if row.turn_id != turn.id:
                continue
            if item.role == "assistant":
                turn.text.append(item.text)
            elif item.role == "tool_call" and item.call_id is not None:
                call = ToolCallRequest(item.call_id, item.tool_name or "", item.args_json or "")
                open_calls[item.call_id] = (call, str(item.extra.get("recordId", "")))
                turn.called_tools = True
            elif item.role == "tool_result":
                open_calls.pop(item.call_id or "", None)
        turn.step_start = len(turn.text)
        turn.calls = list(open_calls.values())
        turn.cut = turn.cut and bool(turn.calls)  # only a call that was open can have started
        turn.usage_known = False  # the steps before the cut were counted by no one

    # --- the steps ----------------------------------------------------------------------------

    async def _steps(self, turn: Progress, inputs: Sequence[LLMInput]) -> None:
        while True:
            if turn.calls:
                if turn.state is TurnState.WAITING:
                    return  # held until resume_turn answers every wait
                results = await self.tools.run(turn)
                # a context rebuilt from working memory (a resume) already holds the results
                inputs = results if self.conv.context.llm is not None else []
            # then one last step without tools (AGENTIK_MAX_TOOL_ROUNDS)
            tools = turn.steps < self.conv.agent.max_tool_rounds
            step_text, calls = await self._step(turn, inputs, tools)
            if not calls:
                return await self._finish(turn, step_text)
            if not tools:
                raise LLMError(
                    f"the model kept calling tools: after {turn.steps} rounds it was asked to "
                    "answer without them and called another (AGENTIK_MAX_TOOL_ROUNDS)",
                    TOOL_LOOP,
                )
            await self.tools.record(turn, step_text, calls)

    async def _step(
        self, turn: Progress, inputs: Sequence[LLMInput], tools: bool = True
    ) -> tuple[list[str], list[ToolCallRequest]]:
        step_text: list[str] = []
        calls: list[ToolCallRequest] = []
        started = reasoning = False
        usage: Usage | None = None
        first, turn.sends = turn.sends == 0 and turn.state is TurnState.QUEUED, turn.sends + 1
        emit = self.conv.emit  # per token: no _emit frame
        async for chunk in self.conv.context.stream(turn, inputs, first, tools):
            if isinstance(chunk, TextDelta):
                if not started:
                    started = True
                    emit(StartResponse())
                step_text.append(chunk.text)
                turn.text.append(chunk.text)
                emit(AppendText(chunk.text))
            elif isinstance(chunk, ReasoningDelta):
                if not reasoning:
                    reasoning = True
                    emit(StartReasoning())
                emit(AppendText(chunk.text, reasoning=True))
            elif isinstance(chunk, ToolCallRequest):
                calls.append(chunk)
            elif isinstance(chunk, Usage):
                usage = chunk
            elif isinstance(chunk, TruncatedReply):
                turn.truncated = True
        turn.count(usage)
        return step_text, calls

    # --- the ends -----------------------------------------------------------------------------

    async def _finish(
        self, turn: Progress, last_step: list[str], interrupted: bool = False
    ) -> None:
        self._finishing = True
        tokens = turn.tokens_so_far()
        if not interrupted:
            tokens, problem = turn.tokens(self.conv.context.compactions != turn.compactions)
            if problem is not None:
                self.conv.context.bad_usage(problem)
        payload: dict[str, Any] = {"text": "".join(turn.text), "tokens": tokens.to_json()}
        if interrupted:
            payload["interrupted"] = True
        elif turn.truncated:
            payload["truncated"] = True
        mark = {"interrupted": True} if interrupted else {}
        memory = [HistoryItem("assistant", "".join(last_step), extra=mark)] if last_step else []
        update = turn.move(TurnState.CANCELLED if interrupted else TurnState.DONE)
        record = Message(new_id("as"), self.conv.id, "assistant", utcnow(), payload)
        await turn.write(self.conv.store, [record], memory, update)
        if interrupted:
            self._emit(Interrupted())
        elif turn.truncated:
            self._emit(Truncated())
        self._end(turn)
        if self.span is not None:
            self.span.set(**{OUTPUT_TEXT: payload["text"]})
        if not interrupted:
            self.conv.agent.after_turn(self.conv, turn.llm_text, payload["text"])

    async def _finish_interrupted(self, turn: Progress) -> None:
        self._finishing = True
        if not self._interrupting:
            log.info("turn %s of %s cancelled by shutdown", turn.id, self.conv.id)
        # the model's stream was cut: its live conversation may be inconsistent
        await self.conv.context.reset()
        while turn.calls:
            await self.tools.record_result(turn, "Error: interrupted", True)
        # the model gets what it had said as it was (an empty reply keeps its context from
        # holding user, user), marked for the system prompt's note (INTERRUPTED_NOTE)
        partial = "".join(turn.text[turn.step_start :])
        said = [partial]
        if not partial and (turn.called_tools or not turn.memory):
            said = []  # it ends with tool results, or the user's text never reached memory
        self.conv.context.holds_interrupted |= bool(said)
        await self._finish(turn, said, interrupted=True)

    async def _fail(self, turn: Progress, message: str, code: str | None) -> None:
        """F2's error path: Error record, Error + End events, LLM reset, working memory clean."""
        self._finishing = True
        await self.conv.context.reset()
        partial = "".join(turn.text)  # kept in the audit log only (F2: memory stays clean)
        check_move(turn.state, TurnState.FAILED)
        if self.span is not None:
            self.span.set(**{ERROR_CODE: code or "error"})
        record = error_record(self.conv.id, turn.id, message, code, partial)
        await self.conv.store.fail_turn(self.conv.id, turn.id, record)
        turn.state = TurnState.FAILED
        self._emit(Error(message, code))
        self._end(turn)

    # --- helpers ------------------------------------------------------------------------------

    def _emit(self, event: Event) -> None:
        self.conv.emit(event)

    def _end(self, turn: Progress) -> None:
        turn.ended = True
        self._emit(End(turn.id))


class _Abandoned(Exception):
    """The turn was abandoned (:meth:`TurnRunner.abandon`)."""


__all__ = ["RESTART_ERROR", "STORAGE_ERROR", "TOOL_LOOP", "TurnRunner"]
