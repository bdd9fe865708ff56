"""A ``/v1/chat/completions`` body read into what the agent needs: the new user message, the
client's system text, and the earlier messages as the digest that finds the conversation
(``docs/openai_api.md``). Every refusal is an :class:`OpenAIError`, answered in OpenAI's shape."""

from __future__ import annotations

import hashlib
import json
import mimetypes
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from agentik.core.types import ContentPart, ImagePart, InvalidInput, TextPart, content_from_json

#: the history a client sends is (role, text) pairs; a digest chains them (see :func:`chain`)
Transcript = list[tuple[str, str]]
#: the digest of no messages at all
EMPTY = ""
#: roles whose messages are instructions, not the conversation (they become message context)
SYSTEM_ROLES = ("system", "developer")


class OpenAIError(Exception):
    """A refusal in OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.kind = (
            status, message, code, param, kind,
        )  # fmt: skip

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self, headers: dict[str, str] | None = None) -> web.Response:
        return web.json_response(self.body(), status=self.status, headers=headers)


@dataclass(frozen=True, slots=True)
class ChatRequest:
    stream: bool
    include_usage: bool
    #: the messages before the new one, as the client has them (user and assistant texts)
    prior: Transcript
    #: the client's system (and developer) messages joined; None without any
    system: str | None
    #: the new user message (the last one) as the agent takes it
    content: list[ContentPart]
    #: the new user message as the client has it (for the digests)
    text: str

    @property
    def prior_digest(self) -> str:
        return chain(EMPTY, self.prior)

    @property
    def request_digest(self) -> str:
        """The digest of the earlier messages and the new one: the same request sent again."""
        return chain(self.prior_digest, [("user", self.text)])


def chain(start: str, messages: Transcript) -> str:
    """The digest of a transcript, extended message by message: ``chain(chain(a, b), c)`` is
    ``chain(a, b + c)``, so the digest of a conversation after its next reply is found from
    the digest before it without the earlier messages."""
    digest = start
    for role, text in messages:
        digest = hashlib.sha256(f"{digest}\x1e{role}\x1f{text}".encode()).hexdigest()
    return digest


def normalise(text: str) -> str:
    """A message's text as it is compared: line ends unified, outer whitespace dropped (clients
    trim or keep it as they like)."""
    return text.replace("\r\n", "\n").strip()


def system_digest(text: str) -> str:
    return hashlib.sha256(normalise(text).encode()).hexdigest()


def parse(raw: bytes, model_id: str) -> ChatRequest:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise OpenAIError(400, f"the body is not valid JSON: {e}", "invalid_json") from None
    if not isinstance(body, dict):
        raise OpenAIError(400, "the body must be a JSON object", "invalid_request")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise OpenAIError(400, "model is required", "missing_required_parameter", "model")
    if model != model_id:
        raise OpenAIError(
            404,
            f"The model {model!r} does not exist; this server has one model, {model_id!r}",
            "model_not_found",
            "model",
        )
    _refuse_unsupported(body)
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise OpenAIError(400, "stream must be a boolean", "invalid_type", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise OpenAIError(400, "stream_options must be an object", "invalid_type", "stream_options")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise OpenAIError(400, "messages must be a non-empty array", "invalid_value", "messages")
    prior: Transcript = []
    system: list[str] = []
    for i, message in enumerate(messages[:-1]):
        role, text = _message(message, i)
        if role in SYSTEM_ROLES:
            system.append(text)
        else:
            prior.append((role, normalise(text)))
    last = messages[-1]
    role, text = _message(last, len(messages) - 1)
    if role != "user":
        raise OpenAIError(
            400,
            f"the last message must be the user's new message, not a {role} message",
            "invalid_value",
            f"messages[{len(messages) - 1}].role",
        )
    content = _content(last["content"], len(messages) - 1)
    return ChatRequest(
        stream=stream,
        include_usage=bool(options.get("include_usage")) and stream,
        prior=prior,
        system="\n\n".join(s for s in system if s.strip()) or None,
        content=content,
        text=normalise(text),
    )


def _refuse_unsupported(body: dict[str, Any]) -> None:
    n = body.get("n")
    if n is not None and n != 1:
        raise OpenAIError(
            400,
            "n must be 1: the agent gives one reply per message (its conversation has one history)",
            "unsupported_value",
            "n",
        )
    for field in ("tools", "functions"):
        if body.get(field):
            raise OpenAIError(
                400,
                f"client-side tools are not supported ({field} must be empty): the agent calls "
                "only its own tools, which it runs itself",
                "client_tools_unsupported",
                field,
            )
    choice = body.get("tool_choice")
    if choice not in (None, "none", "auto"):
        raise OpenAIError(
            400,
            "tool_choice can only be none or auto: the agent calls no client-side tool",
            "client_tools_unsupported",
            "tool_choice",
        )
    modalities = body.get("modalities") or []
    if body.get("audio") is not None or (isinstance(modalities, list) and "audio" in modalities):
        raise OpenAIError(
            400, "audio output is not supported: the agent answers in text", "audio_unsupported",
            "audio" if body.get("audio") is not None else "modalities",
        )  # fmt: skip


def _message(message: Any, i: int) -> tuple[str, str]:
    """A message's role and its text as a client sends it back (images by their URL)."""
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise OpenAIError(400, f"{where} must be an object", "invalid_type", where)
    role = message.get("role")
    if role in ("tool", "function") or message.get("tool_calls") or message.get("function_call"):
        raise OpenAIError(
            400,
            f"{where} is a client-side tool call or result: this agent calls only its own tools",
            "client_tools_unsupported",
            where,
        )
    if role not in ("user", "assistant", *SYSTEM_ROLES):
        raise OpenAIError(400, f"{where}.role {role!r} is not supported", "invalid_value", where)
    content = message.get("content")
    if content is None and role == "assistant":
        return role, ""
    if isinstance(content, str):
        return role, content
    if not isinstance(content, list):
        raise OpenAIError(
            400, f"{where}.content must be a string or an array of parts", "invalid_type", where
        )
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image_url" and role == "user":
            texts.append(f"[image {_image_url(part, f'{where}.content[{j}]')}]")
        elif kind == "refusal" and role == "assistant":
            texts.append(str(part.get("refusal", "")))
        else:
            raise _part_refused(kind, f"{where}.content[{j}]")
    return role, "\n".join(texts)


def _content(content: Any, i: int) -> list[ContentPart]:
    """The new user message as the agent's content parts."""
    if isinstance(content, str):
        parts: list[ContentPart] = [TextPart(content)] if content.strip() else []
    else:
        parts = []
        for j, part in enumerate(content):
            if part["type"] == "text":
                if part["text"].strip():
                    parts.append(TextPart(part["text"]))
            else:  # image_url (the others were refused by _message)
                parts.append(_image(part, f"messages[{i}].content[{j}]"))
    if not parts:
        raise OpenAIError(
            400, "the new user message has no content", "invalid_value", f"messages[{i}].content"
        )
    return parts


def _image_url(part: dict[str, Any], where: str) -> str:
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    if not isinstance(url, str) or not url:
        raise OpenAIError(400, f"{where}.image_url.url must be a URL", "invalid_value", where)
    return url


def _image(part: dict[str, Any], where: str) -> ImagePart:
    url = _image_url(part, where)
    if url.startswith("data:"):
        header, _, data = url[5:].partition(",")
        mime, _, encoding = header.partition(";")
        if encoding != "base64":
            raise OpenAIError(400, f"{where}: a data URL must be base64", "invalid_value", where)
        raw = {"type": "image", "mimeType": mime, "data": data}
    else:
        mime = mimetypes.guess_type(url.split("?", 1)[0])[0] or "image/jpeg"
        raw = {"type": "image", "mimeType": mime, "url": url}
    try:
        (image,) = content_from_json([raw])
    except InvalidInput as e:
        raise OpenAIError(400, f"{where}: {e}", "invalid_value", where) from None
    assert isinstance(image, ImagePart)
    return image


def _part_refused(kind: Any, where: str) -> OpenAIError:
    if kind == "input_audio":
        return OpenAIError(
            400, f"{where}: audio input is not supported", "audio_unsupported", where
        )
    return OpenAIError(
        400, f"{where}: {kind!r} parts are not supported (text and images are)",
        "unsupported_content", where,
    )  # fmt: skip
