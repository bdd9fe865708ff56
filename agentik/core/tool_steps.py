"""The tool calls of a step: recorded all together with the step (and its turn's move, to
``waiting`` when a ``tool_call_gate`` holds one), then run one by one, each result recorded as it
comes; after a crash, the first call without a result may have started."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from agentik.core import approvals
from agentik.core.approvals import APPROVAL
from agentik.core.llm import HistoryItem, LLMInput, ToolCallRequest, ToolResultInput
from agentik.core.observe import (
    CONVERSATION_ID,
    TOOL,
    TOOL_ARGUMENTS,
    TOOL_CALL_ID,
    TOOL_NAME,
    TOOL_RESULT,
)
from agentik.core.progress import Progress
from agentik.core.records import new_id, utcnow
from agentik.core.turns import CLIENT_TOOL, TurnState, Wait
from agentik.core.types import ApprovalRequested, Message, ToolCall, ToolResult, Waiting

if TYPE_CHECKING:
    from agentik.core.conversation import ChatConversation

#: the result of a call that a crash cut after it may have started (its tool is not idempotent)
CUT_CALL = (
    "Error: this call was cut by a server restart; it may or may not have taken effect. "
    "Check before you call it again."
)


class ToolSteps:
    def __init__(self, conv: ChatConversation) -> None:
        self.conv = conv

    async def record(
        self, turn: Progress, step_text: list[str], calls: list[ToolCallRequest]
    ) -> None:
        """The step's text and all its calls in one write, with the turn's move: to
        ``waiting`` when a gate holds a call, else ``running``."""
        turn.step_start = len(turn.text)  # the step's text is in working memory now
        turn.called_tools, turn.truncated = True, False  # the turn goes on
        turn.steps += 1
        records: list[Message] = []
        memory = [HistoryItem("assistant", "".join(step_text))] if step_text else []
        for call in calls:
            record_id = new_id("tc")
            turn.calls.append((call, record_id))
            payload = {"callId": call.call_id, "toolName": call.name, "argsJson": call.args_json}
            records.append(Message(record_id, self.conv.id, "tool_call", utcnow(), payload))
            memory.append(
                HistoryItem(
                    "tool_call",
                    call_id=call.call_id,
                    tool_name=call.name,
                    args_json=call.args_json,
                    extra={"recordId": record_id},
                )
            )
        waits = self._holds(calls)
        asked = [w for w in waits if w.kind == APPROVAL]
        records += [approvals.request_record(self.conv.id, w) for w in asked]
        update = turn.move(TurnState.WAITING if waits else TurnState.RUNNING, waits)
        for call in calls:
            self.conv.emit(ToolCall(call.call_id, call.name, call.args_json))
        await turn.write(self.conv.store, records, memory, update)
        for wait in asked:  # now that the turn waits in the store: an answer may come at once
            r = wait.request
            event = ApprovalRequested(
                wait.call_id, r["toolName"], r["argsJson"], self.conv.id, turn.id
            )
            self.conv.emit(event)
            self.conv.agent.announce(event)
        if waits:  # the turn's last event until they are answered
            self.conv.emit(Waiting(turn.id, tuple(w.to_json() for w in waits)))

    def _holds(self, calls: list[ToolCallRequest]) -> tuple[Wait, ...]:
        """The waits of a step's calls: a call to one of the turn's own tools (``turn_tools``)
        waits for whoever offered it to run it (no gate is asked: it is theirs to run); the
        others as the ``tool_call_gate`` hooks say."""
        offered = self.conv.context.turn_tool_names
        held = {
            c.call_id: Wait(c.call_id, CLIENT_TOOL, {"toolName": c.name, "argsJson": c.args_json})
            for c in calls
            if c.name in offered
        }
        rest = [c for c in calls if c.call_id not in held]
        held |= {w.call_id: w for w in self.conv.agent.tool_gates(self.conv, rest)}
        return tuple(held[c.call_id] for c in calls if c.call_id in held)

    async def run(self, turn: Progress) -> list[LLMInput]:
        """Run the recorded calls without results, in order, each result recorded when it
        comes. A call that a crash cut after it may have started runs again only when its tool
        is idempotent; otherwise the model is told the call was cut."""
        agent = self.conv.agent
        answers = {w.call_id: w for w in turn.waits}
        if answers and self.conv.ownership.shared and not any(w.taken for w in turn.waits):
            # said before a call runs: an instance that takes the turn up after this one's
            # end (a stop's hand-off too) cuts it, and runs no approved call twice
            taken = tuple(replace(w, taken=True) for w in turn.waits)
            await turn.write(self.conv.store, update=turn.move(TurnState.RUNNING, taken))
        cut, turn.cut = turn.cut, False  # the first open call after a crash
        results: list[LLMInput] = []
        while turn.calls:
            call, _ = turn.calls[0]
            wait = answers.get(call.call_id)
            outcome = agent.tool_answer(self.conv, call, wait) if wait is not None else call
            run = isinstance(outcome, ToolCallRequest)
            if cut and run and not agent.tools.idempotent(call.name):
                outcome = (CUT_CALL, True)
            cut = False
            if isinstance(outcome, ToolCallRequest) and agent.observers:
                text, is_error = await self._observed(outcome)
            elif isinstance(outcome, ToolCallRequest):
                text, is_error = await agent.tools.invoke(outcome.name, outcome.args_json)
            else:
                text, is_error = outcome
            await self.record_result(turn, text, is_error)
            results.append(ToolResultInput(call.call_id, call.name, text))
        return results

    async def _observed(self, call: ToolCallRequest) -> tuple[str, bool]:
        attributes = {
            CONVERSATION_ID: self.conv.id,
            TOOL_NAME: call.name,
            TOOL_CALL_ID: call.call_id,
            TOOL_ARGUMENTS: call.args_json,
        }
        with self.conv.agent.observers.start(TOOL, f"{TOOL} {call.name}", attributes) as span:
            text, is_error = await self.conv.agent.tools.invoke(call.name, call.args_json)
            span.end("tool_error" if is_error else None, **{TOOL_RESULT: text})
            return text, is_error

    async def record_result(self, turn: Progress, text: str, is_error: bool) -> None:
        call, record_id = turn.calls.pop(0)
        result_id = new_id("tr")
        self.conv.emit(ToolResult(result_id, call.call_id, text, is_error))
        payload: dict[str, Any] = {
            "toolCallId": record_id,
            "callId": call.call_id,
            "toolName": call.name,
            "text": text,
            "isError": is_error,
        }
        await turn.write(
            self.conv.store,
            [Message(result_id, self.conv.id, "tool_result", utcnow(), payload)],
            [HistoryItem("tool_result", text, call_id=call.call_id, tool_name=call.name)],
        )
