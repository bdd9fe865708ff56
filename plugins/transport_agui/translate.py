"""agentik turn events and history records as AG-UI events and messages.

:class:`RunTranslator` follows one turn's events and keeps what it has opened (a text message,
a reasoning message), so whatever ends the stream — the turn's ``End``, a lost stretch of events,
a log closed by shutdown — it closes them and ends with exactly one ``RUN_FINISHED`` or
``RUN_ERROR``.
"""

from __future__ import annotations

from typing import Any

from ag_ui.core import (
    AssistantMessage,
    BaseEvent,
    FunctionCall,
    Interrupt,
    Message,
    ReasoningEndEvent,
    ReasoningMessageContentEvent,
    ReasoningMessageEndEvent,
    ReasoningMessageStartEvent,
    ReasoningStartEvent,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunFinishedSuccessOutcome,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCall,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    ToolMessage,
    UserMessage,
)

from agentik.core import types as ev
from agentik.core.approvals import APPROVAL
from agentik.core.turns import CLIENT_TOOL, Wait

#: the key under a user record's ``context.metadata`` where this endpoint keeps what it needs
#: to show the message back to an AG-UI client (its own message id, the context parts it added)
META = "agui"


class RunTranslator:
    """The AG-UI events of one run, fed the agentik events of its turn one at a time."""

    def __init__(self, thread_id: str, run_id: str, turn_id: str) -> None:
        self.thread_id, self.run_id, self.turn_id = thread_id, run_id, turn_id
        self.text: str | None = None  # the open text message's id
        self.reasoning: str | None = None  # the open reasoning message's id
        self.messages = 0  # text and reasoning messages opened so far (their ids' suffix)
        self.interrupted = False
        self.error: ev.Error | None = None
        self.ended = False

    def feed_all(self, events: list[ev.Event]) -> list[BaseEvent]:
        """The AG-UI events for a list of agentik events, the text of consecutive deltas joined
        into one (fewer events to encode and send); nothing after the run's end."""
        out: list[BaseEvent] = []
        i = 0
        while i < len(events) and not self.ended:
            event = events[i]
            i += 1
            if isinstance(event, ev.AppendText):
                texts = [event.text]
                while (
                    i < len(events)
                    and isinstance(nxt := events[i], ev.AppendText)
                    and nxt.reasoning == event.reasoning
                ):
                    texts.append(nxt.text)
                    i += 1
                if len(texts) > 1:
                    event = ev.AppendText("".join(texts), event.reasoning)
            out += self.feed(event)
        return out

    def feed(self, event: ev.Event) -> list[BaseEvent]:
        """The AG-UI events for one agentik event; after the last one :attr:`ended` is set."""
        if isinstance(event, ev.AppendText):
            if not event.text:
                return []  # AG-UI deltas are never empty
            if event.reasoning:
                out = [] if self.reasoning else self._open_reasoning()
                assert self.reasoning is not None
                return [
                    *out,
                    ReasoningMessageContentEvent(message_id=self.reasoning, delta=event.text),
                ]
            out = [] if self.text else self._open_text()
            assert self.text is not None
            return [*out, TextMessageContentEvent(message_id=self.text, delta=event.text)]
        if isinstance(event, ev.StartResponse):
            return self._open_text()
        if isinstance(event, ev.StartReasoning):
            return self._open_reasoning()
        if isinstance(event, ev.ToolCall):
            out = self._close()
            out.append(
                ToolCallStartEvent(tool_call_id=event.call_id, tool_call_name=event.tool_name)
            )
            if event.args_json:
                out.append(ToolCallArgsEvent(tool_call_id=event.call_id, delta=event.args_json))
            out.append(ToolCallEndEvent(tool_call_id=event.call_id))
            return out
        if isinstance(event, ev.ToolResult):
            return [
                *self._close(),
                ToolCallResultEvent(
                    message_id=event.result_id,
                    tool_call_id=event.call_id,
                    content=event.text,
                    role="tool",
                ),
            ]
        if isinstance(event, ev.Waiting):
            # the turn waits for answers: the run ends here, and a later run answers them
            waits = tuple(Wait.from_json(w) for w in event.waits)
            self.ended = True
            return [*self._close(), self.waiting(waits)]
        if isinstance(event, ev.Interrupted):
            self.interrupted = True
        elif isinstance(event, ev.Error):
            self.error = event
        elif isinstance(event, ev.End):
            return self._finish()
        elif isinstance(event, ev.Gap):
            # the run's own events were lost (this reader fell behind the replay buffer): the
            # stream cannot be made whole, so it ends; the next run's snapshot shows the turn
            return self.fail(
                "this stream fell behind and lost events of the turn; reconnect to see it",
                "events_lost",
            )
        return []  # Truncated, Compacted: nothing an AG-UI client shows

    def fail(self, message: str, code: str) -> list[BaseEvent]:
        """Close what is open and end the run with ``RUN_ERROR`` (the stream cannot go on)."""
        self.error = ev.Error(message, code)
        return self._finish()

    def _open_text(self) -> list[BaseEvent]:
        out = self._close()
        self.text = self._next_id()
        out.append(TextMessageStartEvent(message_id=self.text, role="assistant"))
        return out

    def _open_reasoning(self) -> list[BaseEvent]:
        out = self._close()
        self.reasoning = self._next_id()
        out.append(ReasoningStartEvent(message_id=self.reasoning))
        out.append(ReasoningMessageStartEvent(message_id=self.reasoning, role="reasoning"))
        return out

    def _next_id(self) -> str:
        self.messages += 1
        return f"{self.turn_id}-{self.messages}"

    def _close(self) -> list[BaseEvent]:
        out: list[BaseEvent] = []
        if self.text is not None:
            out.append(TextMessageEndEvent(message_id=self.text))
            self.text = None
        if self.reasoning is not None:
            out.append(ReasoningMessageEndEvent(message_id=self.reasoning))
            out.append(ReasoningEndEvent(message_id=self.reasoning))
            self.reasoning = None
        return out

    def _finish(self) -> list[BaseEvent]:
        out = self._close()
        self.ended = True
        if self.error is not None:
            out.append(RunErrorEvent(message=self.error.message, code=self.error.code))
        else:
            out.append(self.finished(cancelled=self.interrupted))
        return out

    def waiting(self, waits: tuple[Wait, ...]) -> RunFinishedEvent:
        """How a run ends on a waiting turn: with the ``interrupt`` outcome when it asks
        something (an approval: one interrupt per held call, its id the call's), else — calls
        of the client's own tools only — as a success naming them (``pendingToolCallIds``):
        the two ways AG-UI 1.0 gives a run to stop for outside input."""
        open_ = [w for w in waits if not w.answered]
        interrupts = [interrupt(w) for w in open_ if w.kind != CLIENT_TOOL]
        outcome: Any
        if interrupts:
            outcome = RunFinishedInterruptOutcome(interrupts=interrupts)
        else:
            pending = [w.call_id for w in open_]
            outcome = RunFinishedSuccessOutcome(pending_tool_call_ids=pending or None)
        return RunFinishedEvent(thread_id=self.thread_id, run_id=self.run_id, outcome=outcome)

    def finished(self, cancelled: bool = False) -> RunFinishedEvent:
        outcome = RunFinishedCancelledOutcome() if cancelled else None
        return RunFinishedEvent(thread_id=self.thread_id, run_id=self.run_id, outcome=outcome)


#: what a resume entry's ``payload`` answers an approval interrupt with (the approvals API's
#: answer; ``status: "cancelled"`` denies)
APPROVAL_ANSWER = {
    "type": "object",
    "properties": {
        "approve": {"type": "boolean"},
        "note": {"type": "string"},
        "args": {"type": "object", "description": "other arguments to run the call with"},
    },
    "required": ["approve"],
}


def interrupt(wait: Wait) -> Interrupt:
    """The AG-UI interrupt of a wait: an approval is ``reason: "tool_approval"`` with its
    tool call; a wait of another plugin's kind keeps its kind as the reason."""
    name = wait.request.get("toolName")
    if wait.kind == APPROVAL:
        return Interrupt(
            id=wait.call_id,
            reason="tool_approval",
            message=f"Run {name} with {wait.request.get('argsJson') or '{}'}?",
            tool_call_id=wait.call_id,
            response_schema=APPROVAL_ANSWER,
            metadata={"toolName": name, "argsJson": wait.request.get("argsJson")},
        )
    return Interrupt(id=wait.call_id, reason=wait.kind, tool_call_id=wait.call_id)


def client_id(record: ev.Message) -> str:
    """The id an AG-UI client knows a user record by: its own message id when it sent it."""
    meta = (record.payload.get("context") or {}).get("metadata") or {}
    return str((meta.get(META) or {}).get("messageId") or record.id)


def history_messages(records: list[ev.Message]) -> list[Message]:
    """The conversation's audit records as AG-UI messages (``MESSAGES_SNAPSHOT``): user
    messages under the ids their client gave them, without the context parts this endpoint
    added; the agent's tool calls and results; each turn's reply. Errors and compaction
    summaries are not messages of the conversation and are left out."""
    out: list[Message] = []
    for record in records:
        p = record.payload
        if record.kind == "user":
            out.append(UserMessage(id=client_id(record), content=_user_content(p)))
        elif record.kind == "tool_call":
            call = ToolCall(
                id=p["callId"], function=FunctionCall(name=p["toolName"], arguments=p["argsJson"])
            )
            out.append(AssistantMessage(id=record.id, tool_calls=[call]))
        elif record.kind == "tool_result":
            error = p["text"] if p.get("isError") else None
            out.append(
                ToolMessage(id=record.id, tool_call_id=p["callId"], content=p["text"], error=error)
            )
        elif record.kind == "assistant" and p.get("text"):
            out.append(AssistantMessage(id=record.id, content=p["text"]))
    return out


def _user_content(payload: dict[str, Any]) -> Any:
    meta = (payload.get("context") or {}).get("metadata") or {}
    added = int((meta.get(META) or {}).get("contextParts", 0))
    parts = payload["content"][added:]
    if all(part["type"] == "text" for part in parts):
        return "\n".join(part["body"] for part in parts)
    return [_part(part) for part in parts]


def _part(part: dict[str, Any]) -> dict[str, Any]:
    if part["type"] == "text":
        return {"type": "text", "text": part["body"]}
    if "data" in part:
        return {
            "type": "image",
            "source": {"type": "data", "value": part["data"], "mimeType": part["mimeType"]},
        }
    return {
        "type": "image",
        "source": {"type": "url", "value": part["url"], "mimeType": part["mimeType"]},
    }
