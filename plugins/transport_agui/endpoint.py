"""``POST /agui``: one AG-UI run is one agentik turn (or, with no new user message, just a
snapshot of the thread). How a client's ``messages`` meet the agent's history is in
``docs/agui.md``; in short, only the user messages at the end of ``messages`` are new input,
sent once (their id is the send's idempotency key), and a ``MESSAGES_SNAPSHOT`` follows
``RUN_STARTED`` whenever the client's messages do not end where the agent's history does."""

from __future__ import annotations

import contextlib
from typing import Any

from ag_ui.core import (
    PROTOCOL_VERSION,
    BaseEvent,
    DataSource,
    MessagesSnapshotEvent,
    ResumeEntry,
    RunAgentInput,
    RunStartedEvent,
    ToolMessage,
    UrlSource,
    UserMessage,
)
from ag_ui.core import ImagePart as AguiImage
from ag_ui.core import Message as AguiMessage
from ag_ui.core import TextPart as AguiText
from ag_ui.core import Tool as AguiTool
from ag_ui.encoder import EventEncoder
from aiohttp import web
from pydantic import ValidationError

from agentik.core import approvals
from agentik.core.agent import ChatAgent, ChatConversation, ConversationClosed
from agentik.core.app import error_response
from agentik.core.approvals import APPROVAL
from agentik.core.conversation import NotWaiting
from agentik.core.store import utcnow
from agentik.core.tools import TOOL_NAME, ToolSpec
from agentik.core.turns import CLIENT_TOOL, TurnRecord, TurnState, Wait
from agentik.core.types import (
    ContentPart,
    InvalidInput,
    Message,
    MessageContext,
    TextPart,
    UnknownReference,
    Via,
    content_from_json,
    parse_json,
)
from agentik_transport_agui.translate import META, RunTranslator, client_id, history_messages

HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
PAGE = 200  # history records read per query for a snapshot
MAX_ID = 200  # a message id longer than this is no client's id (it keys a durable send)
VIA = Via("agui")
CLOSED = "the server stopped before the run ended; its reply is in the thread's history"


class NewInput:
    """What a run brings that the agent has not seen: the trailing user messages."""

    def __init__(self, body: RunAgentInput) -> None:
        #: the front end's own tools, offered to the model for the turn this run starts
        self.tools = [_tool(t) for t in body.tools or ()]
        #: answers to the interrupts of the run before (approvals)
        self.resume = list(body.resume or ())
        messages = list(body.messages)
        tail: list[UserMessage] = []
        while messages and isinstance(last := messages[-1], UserMessage):
            tail.insert(0, last)
            messages.pop()
        #: the results of the front end's tools, by call id (those the waiting turn waits for
        #: answer it; the others are history)
        self.results = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
        #: the messages the client already had before the new ones
        self.prior_ids = {m.id for m in messages}
        self.users = tail
        if any(len(m.id) > MAX_ID for m in tail):
            raise InvalidInput(f"a message id may be at most {MAX_ID} characters")
        self.context = [f"- {c.description}: {c.value}" for c in body.context or ()]

    def answers(self, turn: TurnRecord) -> bool:
        """Whether this run answers any of what ``turn`` waits for."""
        return any(self._result_for(w) is not None for w in turn.waits)

    def _result_for(self, wait: Wait) -> ToolMessage | None:
        """The tool message that answers a waiting call of a client's tool, if there is one."""
        if wait.kind != CLIENT_TOOL or wait.answered:
            return None
        return self.results.get(wait.call_id)

    def checked_answers(self, turn: TurnRecord, agent: ChatAgent) -> list[tuple[str, Any]]:
        """The answers this run gives ``turn``'s waits, each checked (:class:`InvalidInput`
        says what is wrong before anything is answered): ``(call id, answer)``."""
        waits = {w.call_id: w for w in turn.waits}
        out: list[tuple[str, Any]] = []
        for entry in self.resume:
            wait = waits.get(entry.interrupt_id)
            if wait is None or wait.kind == CLIENT_TOOL:
                raise Refused(
                    "unknown_interrupt",
                    f"resume entry {entry.interrupt_id!r} answers no interrupt of this thread",
                )
            if wait.answered:
                raise Refused("not_waiting", f"interrupt {wait.call_id!r} was answered", 409)
            answer = resume_answer(wait, entry)
            if wait.kind == APPROVAL:
                approvals.check(answer, wait, agent.tools)
            out.append((wait.call_id, answer))
        for wait in turn.waits:
            message = self._result_for(wait)
            if message is not None:
                text = _text(message.content) or message.error or ""
                out.append((wait.call_id, {"result": text, "isError": message.error is not None}))
        return out

    def content(self) -> tuple[list[ContentPart], MessageContext]:
        """The parts to send (one turn for all new user messages) and the context that keeps
        the client's id of the last one and how many parts the ``context[]`` block took."""
        parts: list[ContentPart] = []
        if self.context:
            parts.append(
                TextPart("[Context from the client application]\n" + "\n".join(self.context))
            )
        added = len(parts)
        for message in self.users:
            parts.extend(_parts(message))
        if len(parts) == added:
            raise InvalidInput("the new user message has no content")
        meta: dict[str, Any] = {"messageId": self.users[-1].id, "contextParts": added}
        if self.tools:  # kept with the turn: a turn taken up after a restart offers them again
            meta["tools"] = [
                {"name": t.name, "description": t.description, "parameters": t.parameters}
                for t in self.tools
            ]
        meta = {META: meta}
        return parts, MessageContext(metadata=meta)


class Refused(InvalidInput):
    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code, self.status = code, status


def resume_answer(wait: Wait, entry: ResumeEntry) -> Any:
    """What a resume entry answers a wait with: for an approval, its ``payload`` (the
    approvals API's answer, ``{"approve": …, "note"?, "args"?}``; a bare ``true``/``false`` or
    none — approved — will do) or, ``cancelled``, a denial; for a wait of another kind, the
    payload as it is, or, cancelled, an error result for the call."""
    payload = entry.payload
    if wait.kind == APPROVAL:
        if entry.status == "cancelled":
            return {"approve": False, "note": "cancelled in the front end"}
        if payload is None or isinstance(payload, bool):
            return {"approve": payload is not False}
        return payload
    if entry.status == "cancelled":
        return {"result": "Error: cancelled in the front end", "isError": True}
    return payload


def _tool(tool: AguiTool) -> ToolSpec:
    """A front end's tool as the model is offered it; a name no model takes is refused."""
    if not TOOL_NAME.match(tool.name):
        raise InvalidInput(f"tool name {tool.name!r} must match {TOOL_NAME.pattern}")
    parameters = tool.parameters if tool.parameters is not None else {"type": "object"}
    if not isinstance(parameters, dict):
        raise InvalidInput(f"tool {tool.name!r}: parameters must be a JSON schema object")
    return ToolSpec(tool.name, tool.description, parameters)


def _text(content: Any) -> str:
    """The text of a tool message's content (a string, or parts of which text is kept)."""
    if isinstance(content, str):
        return content
    return "".join(p.text for p in content if isinstance(p, AguiText))


def _parts(message: UserMessage) -> list[ContentPart]:
    if isinstance(message.content, str):
        return [TextPart(message.content)] if message.content else []
    parts: list[ContentPart] = []
    for part in message.content:
        if isinstance(part, AguiText):
            parts.append(TextPart(part.text))
        elif isinstance(part, AguiImage) and isinstance(part.source, DataSource | UrlSource):
            # checked as the agent's own API checks it: an image type, base64 data
            where = "data" if isinstance(part.source, DataSource) else "url"
            image = {"type": "image", "mimeType": part.source.mime_type, where: part.source.value}
            try:
                parts.extend(content_from_json([image]))
            except InvalidInput as e:
                raise InvalidInput(f"message {message.id!r}: {e}") from None
        else:
            kind = getattr(part, "type", type(part).__name__)
            raise InvalidInput(f"message {message.id!r}: {kind} parts are not supported")
    return parts


def parse(raw: bytes) -> RunAgentInput:
    data = parse_json(raw)  # as every transport: no NaN, 1e999 or lone surrogate gets stored
    try:
        return RunAgentInput.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise InvalidInput(f"not a RunAgentInput: {where}: {first['msg']}") from None


async def run(request: web.Request, agent: ChatAgent) -> web.StreamResponse:
    try:
        body = parse(await request.read())
        new = NewInput(body)
        parts, context = new.content() if new.users else ([], None)  # refused before any write
        taken = [t.name for t in new.tools if t.name in agent.tools]
        if taken:
            raise Refused(
                "client_tool_conflict",
                f"the agent has a tool named {taken[0]!r} of its own: rename the front end's",
            )
        conv = await agent.aliased_conversation("agui", body.thread_id)
        # a turn that waits keeps its conversation busy: an idle one costs no query here
        # (where another instance runs its turns, one query of the turn table)
        waiting = await conv.waiting_turn() if await conv.busy_now() else None
        if waiting is not None and (new.resume or new.answers(waiting)):
            return await _answer(request, body, conv, waiting, new)
        if new.resume:
            raise Refused("not_waiting", "nothing in this thread waits for an answer (resume)", 409)
        if not new.users:
            return await _stream(request, body, conv, snapshot=True, waiting=waiting)
        if waiting is not None:
            if client_id(waiting.user) == new.users[-1].id:  # a retry of the run that asked
                return await _stream(request, body, conv, snapshot=True, waiting=waiting)
            raise Refused(
                "turn_waiting",
                "this thread's turn waits for answers (the interrupts or tool calls its last run "
                "ended with): send them first (resume entries, tool messages)",
                409,
            )
        recent = await conv.recent_turns(1)
        known = [client_id(r) for r in recent if r.kind == "user"]
        # in step: the client's messages end where the agent's history does
        in_step = new.prior_ids >= set(known) if known else not new.prior_ids
        after, started = conv.last_event_id, utcnow()
        msg = await conv.send(parts, context, idempotency_key=f"agui:{new.users[-1].id}", via=VIA)
    except Refused as e:
        return error_response(e.status, e.code, str(e))
    except InvalidInput as e:
        return error_response(400, "invalid_request", str(e))
    except ConversationClosed:
        return error_response(
            409, "conversation_closed", "this thread's conversation is being deleted"
        )
    # a retry of a run whose message the agent already took (the same last message id): its
    # turn is not run again, and the client gets the thread as it is now
    if msg.created_at < started:
        return await _stream(request, body, conv, snapshot=True)
    return await _stream(request, body, conv, msg.id, after, snapshot=not in_step)


async def _answer(
    request: web.Request,
    body: RunAgentInput,
    conv: ChatConversation,
    turn: TurnRecord,
    new: NewInput,
) -> web.StreamResponse:
    """A run that answers what the thread's waiting turn waits for (resume entries for its
    interrupts, tool messages for its calls of the client's tools): every answer is checked
    before the first is given; then the run streams the turn from there. It starts with a
    snapshot of the thread as it was before the answers: the results it streams belong to
    tool calls of an earlier run."""
    answers = new.checked_answers(turn, conv.agent)
    after = conv.last_event_id
    history = await _history(conv)
    try:
        for call_id, answer in answers:
            turn = await conv.resume_turn(turn.id, call_id, answer)
    except NotWaiting as e:  # answered meanwhile (another client, a timeout) or interrupted
        return error_response(409, "not_waiting", str(e))
    except (InvalidInput, UnknownReference) as e:
        return error_response(400, "invalid_request", str(e))
    still = turn if turn.state is TurnState.WAITING else None
    turn_id = None if still else turn.id
    return await _stream(request, body, conv, turn_id, after, history=history, waiting=still)


async def _stream(
    request: web.Request,
    body: RunAgentInput,
    conv: ChatConversation,
    turn_id: str | None = None,
    after: int | None = None,
    *,
    snapshot: bool = False,
    history: list[AguiMessage] | None = None,
    waiting: TurnRecord | None = None,
) -> web.StreamResponse:
    """Answer the run: ``RUN_STARTED``, a ``MESSAGES_SNAPSHOT`` when due (``history``, or read
    now with ``snapshot``), then the turn ``turn_id``'s events after ``after`` until it ends or
    waits; without a turn, the run ends at once — on the outcome of the ``waiting`` turn's
    open waits when there is one."""
    encoder = EventEncoder(accept=request.headers.get("Accept", ""))
    resp = web.StreamResponse(headers={"Content-Type": encoder.get_content_type(), **HEADERS})
    await resp.prepare(request)
    run = RunTranslator(body.thread_id, body.run_id, turn_id or body.run_id)

    async def write(events: list[BaseEvent]) -> None:
        data = "".join(encoder.encode(e) for e in events)
        await resp.write(data.encode("utf-8", "replace"))

    items = conv.turn_batches(turn_id, after) if turn_id is not None else None
    try:
        first: list[BaseEvent] = [
            RunStartedEvent(
                thread_id=body.thread_id,
                run_id=body.run_id,
                parent_run_id=body.parent_run_id,
                protocol_version=PROTOCOL_VERSION,
            )
        ]
        if snapshot and history is None:
            history = await _history(conv, through=turn_id)
        if history is not None:
            first.append(MessagesSnapshotEvent(messages=history))
        if items is None:  # nothing to run: a snapshot, a retry, answers still missing
            end = run.waiting(waiting.waits) if waiting is not None else run.finished()
            await write([*first, end])
            return resp
        await write(first)
        async for batch in items:
            out = run.feed_all([item.event for item in batch])
            if out:
                await write(out)
            if run.ended:
                break
        else:
            await write(run.fail(CLOSED, "shutdown"))
    except ConnectionError:
        pass  # the client went away; the turn goes on without it
    finally:
        if items is not None:
            with contextlib.suppress(Exception):
                await items.aclose()
    return resp


async def _history(conv: ChatConversation, through: str | None = None) -> list[AguiMessage]:
    """The thread as AG-UI messages; with ``through`` (the run's turn) up to its user message:
    what the turn adds comes as the run's events, even when it was quicker than this read."""
    records: list[Message] = []
    while True:
        page = await conv.get_messages(None, len(records), PAGE)
        records.extend(page)
        cut = next((i for i, r in enumerate(page) if r.id == through), None)
        if cut is not None:
            del records[len(records) - len(page) + cut + 1 :]
            return history_messages(records)
        if len(page) < PAGE:
            return history_messages(records)
