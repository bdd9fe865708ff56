"""Tool approvals over A2A: a task whose turn waits for a person is ``INPUT_REQUIRED``, its
status message carrying each request as a data part; a message in the same task answers them
(a data part ``{"approve": …, "note"?, "args"?, "callId"?}`` per call, or the text ``yes`` /
``no`` when one call waits). The waiting and the checks are the core's
(:mod:`agentik.core.approvals`); this is the A2A shape of both."""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

from a2a.types import a2a_pb2 as pb
from a2a.utils import errors
from google.protobuf.json_format import MessageToDict

from agentik.core import approvals
from agentik.core.approvals import APPROVAL, Approval, PendingApproval
from agentik.core.types import InvalidInput

if TYPE_CHECKING:
    from agentik.core.conversation import ChatConversation
    from agentik.core.turns import Wait

REQUEST = "approvalRequest"  # the ``type`` of a request's data part
YES = frozenset({"yes", "y", "approve"})
NO = frozenset({"no", "n", "deny"})
HOW = (
    "answer in this task: the text yes or no (one call waits), or a data part "
    '{"approve": true|false, "note"?: "…", "args"?: {…}, "callId": "…"} per call'
)


def request_data(waiting: PendingApproval) -> dict[str, Any]:
    """The data part of one request: what the model asked to run."""
    data: dict[str, Any] = {
        "type": REQUEST,
        "callId": waiting.call_id,
        "toolName": waiting.tool_name,
        "argsJson": waiting.args_json,
    }
    try:
        args = json.loads(waiting.args_json)
    except ValueError:  # the model's arguments are not JSON: argsJson says what they were
        args = None
    if isinstance(args, dict):
        data["args"] = args
    return data


def input_message(task: pb.Task, pending: list[PendingApproval]) -> pb.Message:
    """The ``INPUT_REQUIRED`` status message: a line for people, a data part per request."""
    asked = "; ".join(f"run {p.tool_name} {p.args_json}?" for p in pending)
    message = pb.Message(
        message_id=str(uuid.uuid4()),
        context_id=task.context_id,
        task_id=task.id,
        role=pb.ROLE_AGENT,
        parts=[pb.Part(text=f"Approval needed: {asked} ({HOW})")],
    )
    for waiting in pending:
        part = message.parts.add()
        part.data.struct_value.update(request_data(waiting))
        part.media_type = "application/json"
    return message


def whole(value: Any) -> Any:
    """A data part's JSON with its whole numbers as integers again: a protobuf ``Value`` holds
    every number as a double (``5`` arrives as ``5.0``, which an integer field refuses)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: whole(v) for k, v in value.items()}
    if isinstance(value, list):
        return [whole(v) for v in value]
    return value


def read_answers(
    task_id: str, parts: Any, pending: list[PendingApproval]
) -> list[tuple[str, dict[str, Any]]]:
    """(call id, answer) for each part of an answering message, or the A2A error that says
    what is wrong (nothing is answered then): an unknown or repeated call id, a yes/no or a
    part without ``callId`` while several calls wait, an answer the core refuses."""
    waiting = {p.call_id: p for p in pending}
    if not waiting:
        raise errors.InvalidParamsError(message=f"task {task_id} waits for no approval")
    answers: list[tuple[str, dict[str, Any]]] = []
    for part in parts:
        kind = part.WhichOneof("content")
        if kind == "data":
            raw = whole(MessageToDict(part.data))
            if not isinstance(raw, dict):
                raise errors.InvalidParamsError(message=f"an answer is an object: {HOW}")
            call_id = raw.pop("callId", None)
        elif kind == "text":
            word = part.text.strip().lower().rstrip(".!")
            if word not in YES | NO:
                raise errors.InvalidParamsError(
                    message=f"{part.text[:40]!r} is not an answer: {HOW}"
                )
            raw, call_id = {"approve": word in YES}, None
        else:
            raise errors.InvalidParamsError(message=f"a {kind or 'empty'} part: {HOW}")
        if call_id is None:
            if len(waiting) != 1:
                ids = ", ".join(waiting)
                raise errors.InvalidParamsError(
                    message=f"{len(waiting)} calls wait for approval ({ids}): "
                    'say which with a data part {"approve": …, "callId": "…"} for each'
                )
            call_id = next(iter(waiting))
        if not isinstance(call_id, str) or call_id not in waiting:
            raise errors.InvalidParamsError(
                message=f"no call {call_id!r} waits for approval in task {task_id} "
                f"(waiting: {', '.join(waiting)})"
            )
        if any(call_id == done for done, _ in answers):
            raise errors.InvalidParamsError(message=f"call {call_id} is answered twice")
        answers.append((call_id, raw))
    return answers


async def answer(
    conv: ChatConversation, turn_id: str, answers: list[tuple[str, dict[str, Any]]]
) -> None:
    """Check every answer (edited arguments against the tool's schema), then give them to the
    turn: all or, when one is refused, none."""
    turn = await conv.waiting_turn()
    if turn is None or turn.id != turn_id:
        raise errors.InvalidParamsError(message="the task's turn waits for no approval now")
    waits: dict[str, Wait] = {w.call_id: w for w in turn.waits if w.kind == APPROVAL}
    checked: list[tuple[str, Approval]] = []
    for call_id, raw in answers:
        try:
            checked.append((call_id, approvals.check(raw, waits[call_id], conv.agent.tools)))
        except InvalidInput as e:
            raise errors.InvalidParamsError(message=f"call {call_id}: {e}") from None
    for call_id, approval in checked:
        await conv.resume_turn(turn_id, call_id, approval.to_json())
