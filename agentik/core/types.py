"""Protocol value types: content parts, message context, turn events and history messages.

They are plain frozen dataclasses with ``to_json``/``from_json`` in the camelCase shape the
HTTP API uses. Persistence stores the same JSON, so records never depend on a transport.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Literal, TypeAlias

JSON: TypeAlias = dict[str, Any]


class InvalidInput(ValueError):
    """Raised for user input that breaks the protocol; transports answer it with a 400."""


class UnknownReference(InvalidInput):
    """Well-formed input naming something that does not exist (a message id to page after);
    transports answer it with a 404."""


# --- JSON from clients ----------------------------------------------------------------------


def parse_json(raw: bytes | str) -> Any:
    """A client's JSON document, refused (:class:`InvalidInput`) unless every value can be stored
    and served back as JSON that any parser reads: no ``NaN``/``Infinity``, no number beyond
    a double's range (``1e999``, which Python reads as infinity and browsers' ``JSON.parse``
    then refuses), no lone surrogate (``"\\ud800"``, which SQLite cannot store as text).
    Every transport parses request bodies with it."""
    try:
        data = json.loads(
            raw, parse_constant=_no_constant, parse_float=_finite, parse_int=_in_range
        )
        json.dumps(data, ensure_ascii=False).encode()
    except RecursionError:
        raise InvalidInput("the JSON body is nested too deeply") from None
    except UnicodeEncodeError:
        raise InvalidInput("the JSON body contains invalid Unicode (a lone surrogate)") from None
    except InvalidInput:
        raise
    except ValueError as e:
        raise InvalidInput(f"malformed JSON: {e}") from None
    return data


def _no_constant(name: str) -> Any:
    raise InvalidInput(f"malformed JSON: {name} is not valid JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InvalidInput(f"the number {text[:40]} is out of range (numbers must be finite)")
    return value


def _in_range(text: str) -> int:
    value = int(text)  # its length is capped by Python (ValueError past 4,300 digits)
    if len(text) > 308 and not math.isfinite(float(text)):
        raise InvalidInput(f"the number {text[:40]}… is out of range (numbers must be finite)")
    return value


# --- content -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TextPart:
    body: str
    type: ClassVar[str] = "text"

    def to_json(self) -> JSON:
        return {"type": "text", "body": self.body}


@dataclass(frozen=True, slots=True)
class ImagePart:
    """An image given inline (base64 ``data``) or by ``url``; v1 backends refuse it clearly."""

    mime_type: str
    data: str | None = None
    url: str | None = None
    type: ClassVar[str] = "image"

    def to_json(self) -> JSON:
        out: JSON = {"type": "image", "mimeType": self.mime_type}
        if self.data is not None:
            out["data"] = self.data
        if self.url is not None:
            out["url"] = self.url
        return out


ContentPart: TypeAlias = TextPart | ImagePart
#: the largest image part accepted (decoded bytes), for backends that take images
MAX_IMAGE_BYTES = 4 * 1024 * 1024


#: the schemes of image URLs a model is given: a ``file:`` or ``javascript:`` URL is no image
#: a client may point the model (or a model server that fetches it) at
IMAGE_URL_SCHEMES = ("https:", "http:", "data:")


def check_image_url(url: str, where: str = "image") -> str:
    """``url`` when it is an ``https:``, ``http:`` or ``data:`` URL; else :class:`InvalidInput`."""
    if not url.strip().lower().startswith(IMAGE_URL_SCHEMES):
        raise InvalidInput(f"{where}.url must be an http(s) or data: URL, got {url[:40]!r}")
    return url


def _require_str(obj: JSON, key: str, where: str, *, optional: bool = False) -> str | None:
    value = obj.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"{where}.{key} must be a string")
    return value


_PART_FIELDS = {"text": {"type", "body"}, "image": {"type", "mimeType", "data", "url"}}


def content_from_json(raw: Any) -> list[ContentPart]:
    """Parse a list of content parts, raising :class:`InvalidInput` with the bad path."""
    if not isinstance(raw, list) or not raw:
        raise InvalidInput("content must be a non-empty array of content parts")
    parts: list[ContentPart] = []
    for i, item in enumerate(raw):
        where = f"content[{i}]"
        if not isinstance(item, dict):
            raise InvalidInput(f"{where} must be an object")
        kind = item.get("type")
        unknown = set(item) - _PART_FIELDS.get(str(kind), set(item))
        if unknown:
            raise InvalidInput(f"{where} has unknown fields: {', '.join(sorted(unknown))}")
        if kind == "text":
            body = _require_str(item, "body", where)
            assert body is not None
            parts.append(TextPart(body))
        elif kind == "image":
            mime = _require_str(item, "mimeType", where)
            data = _require_str(item, "data", where, optional=True)
            url = _require_str(item, "url", where, optional=True)
            if (data is None) == (url is None):
                raise InvalidInput(f"{where} needs exactly one of 'data' or 'url'")
            if url is not None:
                check_image_url(url, where)
            if data is not None:
                try:
                    base64.b64decode(data, validate=True)
                except (binascii.Error, ValueError):  # ValueError: not ASCII
                    raise InvalidInput(f"{where}.data must be base64") from None
            assert mime is not None
            if not mime.startswith("image/"):
                raise InvalidInput(f"{where}.mimeType must be an image type, got {mime!r}")
            parts.append(ImagePart(mime, data=data, url=url))
        else:
            raise InvalidInput(f"{where}.type must be 'text' or 'image', got {kind!r}")
    return parts


def content_to_json(parts: list[ContentPart]) -> list[JSON]:
    return [p.to_json() for p in parts]


def content_text(parts: list[ContentPart]) -> str:
    return "\n".join(p.body for p in parts if isinstance(p, TextPart))


# --- message context (F4) -----------------------------------------------------------------

Origin: TypeAlias = Literal["user", "system", "event"]
ORIGINS: tuple[Origin, ...] = ("user", "system", "event")


@dataclass(frozen=True, slots=True)
class MessageContext:
    """Who or what started a turn. ``metadata`` is kept for audit and never reaches the LLM."""

    origin: Origin = "user"
    description: str | None = None
    source_id: str | None = None
    metadata: JSON | None = None

    def __post_init__(self) -> None:
        if self.origin not in ORIGINS:
            raise InvalidInput(f"context.origin must be one of {', '.join(ORIGINS)}")
        if self.origin != "user" and not (self.description and self.description.strip()):
            raise InvalidInput(f"context.description is required for origin {self.origin!r}")

    def llm_prefix(self) -> str:
        """The line put before the user text for non-user origins, e.g. ``[EVENT] …``."""
        if self.origin == "user":
            return ""
        line = f"[{self.origin.upper()}] {self.description}"
        if self.source_id:
            line += f" (sourceId={self.source_id})"
        return line + "\n"

    def to_json(self) -> JSON:
        out: JSON = {"origin": self.origin}
        if self.description is not None:
            out["description"] = self.description
        if self.source_id is not None:
            out["sourceId"] = self.source_id
        if self.metadata is not None:
            out["metadata"] = self.metadata
        return out

    @classmethod
    def from_json(cls, raw: Any) -> MessageContext:
        if not isinstance(raw, dict):
            raise InvalidInput("context must be an object")
        unknown = set(raw) - {"origin", "description", "sourceId", "metadata"}
        if unknown:
            raise InvalidInput(f"context has unknown fields: {', '.join(sorted(unknown))}")
        origin = raw.get("origin", "user")
        if origin is None:
            origin = "user"
        description = _require_str(raw, "description", "context", optional=True)
        source_id = _require_str(raw, "sourceId", "context", optional=True)
        metadata = raw.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise InvalidInput("context.metadata must be an object")
        return cls(origin, description, source_id, metadata)


SENDER_MAX = 200
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # a sender is shown on one line to others


@dataclass(frozen=True, slots=True)
class Via:
    """How a user message arrived: the ``transport`` that took it (``http``, ``a2a``,
    ``agui``…) and the ``sender`` it names, as the client gave it (a label for other viewers,
    not an identity the server checked). Kept on the ``user`` record; never reaches the LLM."""

    transport: str
    sender: str | None = None

    def __post_init__(self) -> None:
        if self.sender is not None and not (
            0 < len(self.sender) <= SENDER_MAX and not _CONTROL.search(self.sender)
        ):
            raise InvalidInput(f"sender must be 1 to {SENDER_MAX} characters, none a control")

    def to_json(self) -> JSON:
        out: JSON = {"transport": self.transport}
        if self.sender is not None:
            out["sender"] = self.sender
        return out

    @classmethod
    def from_json(cls, raw: Any) -> Via:
        if not isinstance(raw, dict) or not isinstance(raw.get("transport"), str):
            raise InvalidInput("via must be an object with a transport")
        sender = raw.get("sender")
        if sender is not None and not isinstance(sender, str):
            raise InvalidInput("via.sender must be a string")
        return cls(raw["transport"], sender)


# --- turn events (F1) ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Event:
    """Base of turn events. ``type`` is the wire name; subclasses add their fields."""

    type: ClassVar[str] = "Event"

    def to_json(self) -> JSON:
        return {"type": self.type}


@dataclass(frozen=True, slots=True)
class StartReasoning(Event):
    type: ClassVar[str] = "StartReasoning"


@dataclass(frozen=True, slots=True)
class StartResponse(Event):
    type: ClassVar[str] = "StartResponse"


@dataclass(frozen=True, slots=True)
class AppendText(Event):
    text: str = ""
    reasoning: bool = False
    type: ClassVar[str] = "AppendText"

    def to_json(self) -> JSON:
        out: JSON = {"type": "AppendText", "text": self.text}
        if self.reasoning:
            out["reasoning"] = True
        return out


@dataclass(frozen=True, slots=True)
class ToolCall(Event):
    call_id: str = ""
    tool_name: str = ""
    args_json: str = ""
    type: ClassVar[str] = "ToolCall"

    def to_json(self) -> JSON:
        return {
            "type": "ToolCall",
            "callId": self.call_id,
            "toolName": self.tool_name,
            "argsJson": self.args_json,
        }


@dataclass(frozen=True, slots=True)
class ToolResult(Event):
    result_id: str = ""
    call_id: str = ""
    text: str = ""
    is_error: bool = False
    type: ClassVar[str] = "ToolResult"

    def to_json(self) -> JSON:
        return {
            "type": "ToolResult",
            "resultId": self.result_id,
            "callId": self.call_id,
            "text": self.text,
            "isError": self.is_error,
        }


@dataclass(frozen=True, slots=True)
class End(Event):
    """The turn is over. ``turn_id``: the id of the user message whose turn it ends (None when
    a server too old to say sent it)."""

    turn_id: str | None = None
    type: ClassVar[str] = "End"

    def to_json(self) -> JSON:
        return {"type": "End"} if self.turn_id is None else {"type": "End", "turnId": self.turn_id}


@dataclass(frozen=True, slots=True)
class Interrupted(Event):
    type: ClassVar[str] = "Interrupted"


@dataclass(frozen=True, slots=True)
class Truncated(Event):
    """The reply stopped at the output-token cap or the end of the model's context."""

    type: ClassVar[str] = "Truncated"


@dataclass(frozen=True, slots=True)
class Error(Event):
    message: str = ""
    code: str | None = None
    type: ClassVar[str] = "Error"

    def to_json(self) -> JSON:
        return {"type": "Error", "message": self.message, "code": self.code}


@dataclass(frozen=True, slots=True)
class Compacted(Event):
    """Working memory was compacted: old turns became one summary (``summary_id`` is its
    audit record); the token estimates of the live context before and after."""

    summary_id: str = ""
    tokens_before: int = 0
    tokens_after: int = 0
    type: ClassVar[str] = "Compacted"

    def to_json(self) -> JSON:
        return {
            "type": "Compacted",
            "summaryId": self.summary_id,
            "tokensBefore": self.tokens_before,
            "tokensAfter": self.tokens_after,
        }


@dataclass(frozen=True, slots=True)
class Gap(Event):
    """Not a turn event: the reader fell behind and missed events after ``after``.

    The events in between are gone from the live stream; read them from history."""

    after: int = 0
    type: ClassVar[str] = "Gap"

    def to_json(self) -> JSON:
        return {"type": "Gap", "after": self.after}


@dataclass(frozen=True, slots=True)
class UserMessage(Event):
    """A user message was accepted (recorded, its turn queued): on the conversation's stream
    and the agent's, so every viewer sees what started the turns that follow. Its fields are
    those of the ``user`` record (:meth:`record`)."""

    id: str = ""
    conversation_id: str = ""
    created_at: datetime | None = None
    content: tuple[ContentPart, ...] = ()
    context: MessageContext | None = None
    via: Via | None = None
    type: ClassVar[str] = "UserMessage"

    @classmethod
    def of(cls, record: Message) -> UserMessage:
        """The event of a stored ``user`` record."""
        p = record.payload
        context, via = p.get("context"), p.get("via")
        return cls(
            record.id,
            record.conversation_id,
            record.created_at,
            tuple(content_from_json(p["content"])),
            None if context is None else MessageContext.from_json(context),
            None if via is None else Via.from_json(via),
        )

    def to_json(self) -> JSON:
        out: JSON = {
            "type": "UserMessage",
            "id": self.id,
            "conversationId": self.conversation_id,
            "createdAt": self.created_at.isoformat() if self.created_at else None,
            "content": content_to_json(list(self.content)),
        }
        if self.context is not None:
            out["context"] = self.context.to_json()
        if self.via is not None:
            out["via"] = self.via.to_json()
        return out

    @property
    def text(self) -> str:
        return content_text(list(self.content))


@dataclass(frozen=True, slots=True)
class AgentEvent(Event):
    """Agent-level event: something happened to a conversation (created, updated, …)."""

    kind: str = ""
    conversation_id: str = ""
    type: ClassVar[str] = "AgentEvent"

    def to_json(self) -> JSON:
        return {"type": self.kind, "conversationId": self.conversation_id}


@dataclass(frozen=True, slots=True)
class ApprovalRequested(Event):
    """A tool call waits for a person to approve it (its turn is ``waiting``): on the
    conversation's stream and the agent's, so one dashboard can watch every conversation.
    Answer it with ``POST …/approvals/{callId}`` (``ChatConversation.approve``/``deny``)."""

    call_id: str = ""
    tool_name: str = ""
    args_json: str = ""
    conversation_id: str = ""
    turn_id: str = ""
    type: ClassVar[str] = "ApprovalRequested"

    def to_json(self) -> JSON:
        return {
            "type": "ApprovalRequested",
            "callId": self.call_id,
            "toolName": self.tool_name,
            "argsJson": self.args_json,
            "conversationId": self.conversation_id,
            "turnId": self.turn_id,
        }


@dataclass(frozen=True, slots=True)
class Waiting(Event):
    """The turn waits for answers from outside (its state is ``waiting``): what each held
    call of its step waits for, as ``Wait.to_json()`` gives it (``callId``, ``kind``,
    ``request``). Nothing more of the turn comes until they are answered; a transport that
    answers a request with the turn (AG-UI) ends its answer here."""

    turn_id: str = ""
    waits: tuple[JSON, ...] = ()
    type: ClassVar[str] = "Waiting"

    def to_json(self) -> JSON:
        return {"type": "Waiting", "turnId": self.turn_id, "waits": list(self.waits)}


# --- history messages (F1) ----------------------------------------------------------------

MessageKind: TypeAlias = Literal[
    "user", "assistant", "tool_call", "tool_result", "error", "summary", "approval"
]


@dataclass(frozen=True, slots=True)
class TokenUsage:
    input: int | None
    output: int | None
    estimated: bool = False  # guessed (characters / 4): the endpoint sent no counts

    def to_json(self) -> JSON:
        out: JSON = {"input": self.input, "output": self.output}
        if self.estimated:
            out["estimated"] = True
        return out


@dataclass(frozen=True, slots=True)
class Message:
    """One audit-log record. ``payload`` holds the kind's fields in their JSON form.

    Kinds and payload fields: ``user`` {content, context?, via?}; ``assistant`` {text, tokens};
    ``tool_call`` {callId, toolName, argsJson}; ``tool_result`` {toolCallId, callId, toolName,
    text, isError}; ``error`` {message, code, userMessageId}; ``summary`` {text}.
    ``assistant`` also has ``interrupted: true`` when the turn was interrupted and
    ``truncated: true`` when its reply stopped at the output-token cap; ``error`` has
    ``partialText`` when the failed turn had streamed text before it failed.
    """

    id: str
    conversation_id: str
    kind: MessageKind
    created_at: datetime
    payload: JSON = field(default_factory=dict)

    def to_json(self) -> JSON:
        return {
            "id": self.id,
            "conversationId": self.conversation_id,
            "type": self.kind,
            "createdAt": self.created_at.isoformat(),
            **self.payload,
        }


@dataclass(frozen=True, slots=True)
class ConversationInfo:
    """What a conversation row holds; the live object adds behaviour on top."""

    id: str
    title: str | None
    is_temporal: bool
    created_at: datetime
    updated_at: datetime


# --- the wire form read back (clients of the HTTP API) --------------------------------------

AGENT_EVENT_KINDS = frozenset(
    {
        "ConversationCreated",
        "ConversationUpdated",
        "ConversationDeleted",
        "TurnStarted",
        "TurnWaiting",
        "TurnEnded",
    }
)
_EVENT_READERS: dict[str, Any] = {
    "StartReasoning": lambda d: StartReasoning(),
    "StartResponse": lambda d: StartResponse(),
    "AppendText": lambda d: AppendText(d["text"], bool(d.get("reasoning", False))),
    "ToolCall": lambda d: ToolCall(d["callId"], d["toolName"], d["argsJson"]),
    "ToolResult": lambda d: ToolResult(d["resultId"], d["callId"], d["text"], d["isError"]),
    "End": lambda d: End(d.get("turnId")),
    "Interrupted": lambda d: Interrupted(),
    "Truncated": lambda d: Truncated(),
    "Error": lambda d: Error(d["message"], d.get("code")),
    "Compacted": lambda d: Compacted(d["summaryId"], d["tokensBefore"], d["tokensAfter"]),
    "Gap": lambda d: Gap(d["after"]),
    "ApprovalRequested": lambda d: ApprovalRequested(
        d["callId"], d["toolName"], d["argsJson"], d["conversationId"], d["turnId"]
    ),
    "Waiting": lambda d: Waiting(d["turnId"], tuple(d["waits"])),
    "UserMessage": lambda d: UserMessage.of(
        Message(d["id"], d["conversationId"], "user", datetime.fromisoformat(d["createdAt"]), d)
    ),
}


def event_from_json(raw: JSON) -> Event | None:
    """The event whose ``to_json()`` gave ``raw``; None for a type this version does not know
    (a newer server's, or a plugin's). Raises ``KeyError`` for a known type missing a field."""
    kind = str(raw.get("type"))
    reader = _EVENT_READERS.get(kind)
    if reader is not None:
        return reader(raw)  # type: ignore[no-any-return]
    if kind in AGENT_EVENT_KINDS:
        return AgentEvent(kind, raw["conversationId"])
    return None


def message_from_json(raw: JSON) -> Message:
    """The record whose ``to_json()`` gave ``raw``."""
    payload = {
        k: v for k, v in raw.items() if k not in ("id", "conversationId", "type", "createdAt")
    }
    return Message(
        raw["id"],
        raw["conversationId"],
        raw["type"],
        datetime.fromisoformat(raw["createdAt"]),
        payload,
    )
