"""A whole conversation as one document: JSON (every record as the API gives it, the
conversation and its token stats) or Markdown (to read, print or paste). Served at
``GET /agentik/conversations/{id}/export``; ``agentik export`` and the chat's ``/export`` ask
for it through the client."""

from __future__ import annotations

import json
import re
from typing import Any

from agentik.core.types import Message

FORMATS = {"md": "text/markdown", "json": "application/json"}
_BACKTICKS = re.compile(r"`+")


def as_json(conversation: dict[str, Any], stats: dict[str, Any], records: list[Message]) -> str:
    document = {
        "conversation": conversation,
        "stats": stats,
        "messages": [m.to_json() for m in records],
    }
    return json.dumps(document, ensure_ascii=False, indent=2) + "\n"


def as_markdown(conversation: dict[str, Any], stats: dict[str, Any], records: list[Message]) -> str:
    title = conversation["title"] or f"Conversation {conversation['id']}"
    out = [
        f"# {title}",
        "",
        f"- id: `{conversation['id']}`",
        f"- created: {conversation['createdAt']}",
        f"- updated: {conversation['updatedAt']}",
        f"- turns: {stats['turns']}, tokens in: {stats['input']}, out: {stats['output']}",
        "",
    ]
    for record in records:
        out += _record(record)
    return "\n".join(out).rstrip() + "\n"


def _record(m: Message) -> list[str]:
    p, when = m.payload, m.created_at.isoformat(timespec="seconds")
    if m.kind == "user":
        via = p.get("via") or {}
        sender = via.get("sender")
        where = f" via {via['transport']}" if via else ""
        lines = [f"## User{f' ({sender})' if sender else ''} — {when}{where}", ""]
        context = p.get("context")
        if context and context != {"origin": "user"}:
            lines += [f"> context: `{json.dumps(context, ensure_ascii=False)}`", ""]
        for part in p["content"]:
            if part["type"] == "text":
                lines += [part["body"], ""]
            else:
                lines += [f"[image: {part.get('mimeType')} {part.get('url', '(inline)')}]", ""]
        return lines
    if m.kind == "assistant":
        marks = [k for k in ("interrupted", "truncated") if p.get(k)]
        head = f"## Agent — {when}" + (f" ({', '.join(marks)})" if marks else "")
        tokens = p.get("tokens") or {}
        counted = f"tokens in: {tokens.get('input')}, out: {tokens.get('output')}"
        return [head, "", f"_{counted}_", "", p.get("text", ""), ""]
    if m.kind == "tool_call":
        return [f"**Tool call** `{p['toolName']}` ({p['callId']})", "", *_fenced(p["argsJson"])]
    if m.kind == "tool_result":
        what = "Tool error" if p.get("isError") else "Tool result"
        return [f"**{what}** `{p['toolName']}` ({p['callId']})", "", *_fenced(p["text"])]
    if m.kind == "error":
        lines = [f"**Error** ({p.get('code')}) — {when}: {p.get('message')}", ""]
        if p.get("partialText"):
            lines += ["What was said before it failed:", "", *_fenced(p["partialText"])]
        return lines
    return [f"## Summary (context compaction) — {when}", "", p.get("text", ""), ""]


def _fenced(text: str) -> list[str]:
    """``text`` in a code block whose fence is longer than any backtick run in it."""
    longest = max((len(run) for run in _BACKTICKS.findall(text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, text, fence, ""]
