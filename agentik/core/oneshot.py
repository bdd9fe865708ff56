"""One way for background features to ask the model a one-shot question and read JSON back.

Memory review, reflection and skill mining each ask :meth:`LLMBackend.complete` for an answer
of a fixed JSON shape. Models wrap JSON in code fences, put prose around it, or answer
something else entirely; :func:`parse_json_answer` finds the JSON value in such a reply and
:func:`ask_json` adds the call, the shape check and the logging, so a bad answer is one log
line and ``None``, never an exception in a background job. Summaries (compaction) are plain
text and use :meth:`LLMBackend.complete` directly.

``render_transcript`` turns audit-log records into the plain transcript those prompts quote.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from agentik.core.llm import HistoryItem, LLMBackend, LLMError

if TYPE_CHECKING:
    from agentik.core.types import Message

log = logging.getLogger(__name__)
T = TypeVar("T")

#: appended to every prompt that expects JSON
JSON_ONLY = "Answer with the JSON object only: no code fences, no text before or after it."

_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n(.*?)```", re.DOTALL)
_DECODER = json.JSONDecoder()


class BadAnswer(ValueError):
    """The model's answer holds no JSON value of the expected shape."""


def parse_json_answer(text: str) -> Any:
    """The JSON value in a model's answer: the whole text, else a fenced block, else the first
    ``{…}`` or ``[…]`` that parses. Raises :class:`BadAnswer` when there is none."""
    stripped = text.strip()
    candidates = [stripped, *(m.group(1).strip() for m in _FENCE.finditer(text))]
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except ValueError:
            pass
    # prose around the value: try each opening bracket until one decodes
    for match in re.finditer(r"[{\[]", stripped):
        try:
            value, _end = _DECODER.raw_decode(stripped, match.start())
        except ValueError:
            continue
        return value
    raise BadAnswer(f"no JSON in the answer: {_preview(text)}")


def _preview(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "…"


async def ask_json(
    llm: LLMBackend,
    prompt: str,
    validate: Callable[[Any], T],
    *,
    system_prompt: str | None = None,
    purpose: str = "one-shot call",
) -> T | None:
    """Ask ``prompt`` (with :data:`JSON_ONLY` appended) and return ``validate(value)``.

    ``validate`` receives the parsed JSON and returns the typed answer or raises ``ValueError``
    (or ``TypeError``/``KeyError``) when the shape is wrong. A failed call, an answer without
    JSON or of the wrong shape is logged as a warning naming ``purpose`` and gives ``None``.
    """
    try:
        answer = await llm.complete(
            f"{prompt.rstrip()}\n\n{JSON_ONLY}", system_prompt=system_prompt
        )
    except LLMError as e:
        log.warning("%s: the model call failed: %s", purpose, e.message)
        return None
    try:
        return validate(parse_json_answer(answer))
    except (ValueError, TypeError, KeyError) as e:
        log.warning("%s: answer ignored: %s", purpose, e)
        return None


_ROLES = {"user": "User", "assistant": "Assistant", "summary": "Summary"}


def render_transcript(messages: Iterable[Message], max_chars: int = 2000) -> str:
    """Audit records as ``User: …`` / ``Assistant: …`` / ``Tool call name(args)`` / ``Tool
    result name: …`` lines, each cut to ``max_chars`` (errors and empty replies left out)."""
    from agentik.core.types import content_from_json, content_text

    items = []
    for m in messages:
        p = m.payload
        if m.kind == "user":
            items.append(HistoryItem("user", content_text(content_from_json(p["content"]))))
        elif m.kind in ("assistant", "summary"):
            items.append(HistoryItem(m.kind, p.get("text") or ""))
        elif m.kind in ("tool_call", "tool_result"):
            items.append(
                HistoryItem(
                    m.kind,
                    p.get("text") or "",
                    tool_name=p.get("toolName"),
                    args_json=p.get("argsJson"),
                )
            )
    return render_items(items, max_chars)


def render_items(items: Iterable[HistoryItem], max_chars: int = 2000) -> str:
    """Working-memory entries as the same lines as :func:`render_transcript`."""
    lines = []
    for i in items:
        if i.role == "tool_call":
            lines.append(f"Tool call {i.tool_name}({_cut(i.args_json or '', 500)})")
        elif i.role == "tool_result":
            lines.append(f"Tool result {i.tool_name}: {_cut(i.text, 500)}")
        elif i.role in _ROLES and i.text:
            lines.append(f"{_ROLES[i.role]}: {_cut(i.text, max_chars)}")
    return "\n".join(lines)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + " […]"
