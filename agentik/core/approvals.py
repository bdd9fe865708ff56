"""Approvals: a tool call that waits for a person to say yes, no, or yes with other arguments
(F19). Which calls wait is the ``approvals`` plugin's policy (its ``tool_call_gate``); this is
what a wait of kind :data:`APPROVAL` is everywhere else: the request clients are shown, its two
records in the history (the request, with the step; the answer, when it comes), the answers a
person may give, and what each makes of the call."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentik.core.records import new_id, utcnow
from agentik.core.turns import Wait
from agentik.core.types import InvalidInput, Message

if TYPE_CHECKING:  # the client reads approvals too: it imports no engine
    from agentik.core.llm import ToolCallRequest
    from agentik.core.tools import ToolRegistry

APPROVAL = "approval"  # the kind of such a wait
MAX_NOTE = 2000  # characters of a person's note
DENIED = "Error: a person denied this call"


@dataclass(frozen=True, slots=True)
class Approval:
    """A person's answer: ``approve``, a ``note`` (given to the model with a denial), the
    arguments to run the call with instead of the model's (``args``, an approval only), and
    why no one answered (``reason``: ``"timeout"``)."""

    approve: bool
    note: str | None = None
    args: dict[str, Any] | None = None
    reason: str | None = None

    @classmethod
    def from_json(cls, raw: Any) -> Approval:
        """Read an answer (``{"approve": true|false, "note": "...", "args": {...}}``), raising
        :class:`InvalidInput` with what is wrong."""
        if not isinstance(raw, dict) or not isinstance(raw.get("approve"), bool):
            raise InvalidInput('an answer is {"approve": true|false, "note"?: …, "args"?: {…}}')
        unknown = set(raw) - {"approve", "note", "args", "reason"}
        if unknown:
            raise InvalidInput(f"unknown fields in the answer: {', '.join(sorted(unknown))}")
        note, args = raw.get("note"), raw.get("args")
        if note is not None and (not isinstance(note, str) or len(note) > MAX_NOTE):
            raise InvalidInput(f"note must be text of at most {MAX_NOTE} characters")
        if args is not None and not isinstance(args, dict):
            raise InvalidInput("args must be an object: the call's arguments")
        if args is not None and not raw["approve"]:
            raise InvalidInput("args go with an approval only")
        reason = raw.get("reason")
        return cls(raw["approve"], note or None, args, reason if isinstance(reason, str) else None)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"approve": self.approve}
        if self.note is not None:
            out["note"] = self.note
        if self.args is not None:
            out["args"] = self.args
        if self.reason is not None:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True, slots=True)
class PendingApproval:
    """A tool call waiting for a person's answer, as clients list it."""

    call_id: str
    tool_name: str
    args_json: str
    turn_id: str
    requested_at: str | None

    @classmethod
    def of(cls, turn_id: str, wait: Wait) -> PendingApproval:
        r = wait.request
        return cls(wait.call_id, r["toolName"], r["argsJson"], turn_id, r.get("requestedAt"))

    def to_json(self) -> dict[str, Any]:
        return {
            "callId": self.call_id,
            "toolName": self.tool_name,
            "argsJson": self.args_json,
            "turnId": self.turn_id,
            "requestedAt": self.requested_at,
        }


def request(call: ToolCallRequest) -> Wait:
    """The wait of a call that a person must approve (what a gate returns)."""
    when = utcnow().isoformat()
    asked = {"toolName": call.name, "argsJson": call.args_json, "requestedAt": when}
    return Wait(call.call_id, APPROVAL, asked)


def request_record(conversation_id: str, wait: Wait) -> Message:
    """The ``approval`` record that says a call waits (written with its step)."""
    r = wait.request
    payload = {"callId": wait.call_id, "toolName": r["toolName"], "argsJson": r["argsJson"]}
    return Message(
        new_id("ap"), conversation_id, "approval", utcnow(), {**payload, "status": "pending"}
    )


def check(answer: Any, wait: Wait, tools: ToolRegistry) -> Approval:
    """A person's ``answer`` to ``wait``, read and checked: edited arguments must fit the
    tool's schema (:class:`InvalidInput` otherwise; nothing is stored)."""
    approval = Approval.from_json(answer)
    if approval.args is not None:
        problem = tools.problem(wait.request["toolName"], approval.args)
        if problem is not None:
            raise InvalidInput(f"args do not fit {wait.request['toolName']}: {problem}")
    return approval


def answer_record(conversation_id: str, wait: Wait, approval: Approval) -> Message:
    """The ``approval`` record of the answer (written with the turn's move): what the person
    said, and both argument sets when they edited the model's."""
    r = wait.request
    payload: dict[str, Any] = {
        "callId": wait.call_id,
        "toolName": r["toolName"],
        "status": "approved" if approval.approve else "denied",
        "argsJson": r["argsJson"],
    }
    if approval.args is not None:
        payload["editedArgsJson"] = json.dumps(approval.args, ensure_ascii=False)
    if approval.note is not None:
        payload["note"] = approval.note
    if approval.reason is not None:
        payload["reason"] = approval.reason
    return Message(new_id("ap"), conversation_id, "approval", utcnow(), payload)


def outcome(call: ToolCallRequest, wait: Wait) -> ToolCallRequest | tuple[str, bool]:
    """What an answered approval makes of the call: the call to run (with the person's
    arguments if they edited them), or the result a denial gives the model."""
    from agentik.core.llm import ToolCallRequest

    approval = Approval.from_json(wait.answer)
    if not approval.approve:
        why = "no one answered in time" if approval.reason == "timeout" else None
        said = "; ".join(p for p in (why, approval.note) if p)
        return (f"{DENIED}: {said}" if said else DENIED), True
    if approval.args is not None:
        return ToolCallRequest(call.call_id, call.name, json.dumps(approval.args))
    return call
