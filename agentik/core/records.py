"""How records are named and dated: ids with a kind prefix (``msg-…``, ``tc-…``), UTC times,
and the Error record that ends a turn that failed."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from agentik.core.types import Message


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def utcnow() -> datetime:
    return datetime.now(UTC)


def error_record(
    conversation_id: str, user_id: str, message: str, code: str | None, partial_text: str = ""
) -> Message:
    payload: dict[str, Any] = {"message": message, "code": code, "userMessageId": user_id}
    if partial_text:  # what the user saw of the reply before it failed
        payload["partialText"] = partial_text
    return Message(new_id("err"), conversation_id, "error", utcnow(), payload)
