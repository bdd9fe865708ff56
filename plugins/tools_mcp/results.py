"""An MCP ``CallToolResult`` as the text the model reads.

Text stays text; images, audio and binary resources are summarised (type and size), never
dumped as base64; an embedded text resource is shown with its URI; a resource link by name and
URI; structured content is added as JSON unless a text block already carries the same JSON.
Duck-typed on the blocks' ``type`` so this module does not import ``mcp``.
"""

from __future__ import annotations

import json
from typing import Any


def result_text(result: Any) -> str:
    content = list(getattr(result, "content", None) or [])
    parts = [block_text(block) for block in content]
    structured = getattr(result, "structured_content", None)
    if structured is not None and not any(_same_json(b, structured) for b in content):
        parts.append(json.dumps(structured, ensure_ascii=False))
    return "\n".join(p for p in parts if p)


def block_text(block: Any) -> str:
    kind = getattr(block, "type", None)
    if kind == "text":
        return str(block.text)
    if kind in ("image", "audio"):
        return f"[{kind}: {block.mime_type}, {size(block.data)}]"
    if kind == "resource_link":
        extra = f" ({block.mime_type})" if block.mime_type else ""
        desc = f": {block.description}" if block.description else ""
        return f"[resource link: {block.name} <{block.uri}>{extra}{desc}]"
    if kind == "resource":
        res = block.resource
        mime = getattr(res, "mime_type", None) or "unknown type"
        text = getattr(res, "text", None)
        if text is not None:
            return f"[resource <{res.uri}> ({mime})]\n{text}"
        return f"[resource <{res.uri}>: {mime}, {size(getattr(res, 'blob', ''))}, not shown]"
    return f"[{kind or type(block).__name__} content, not shown]"


def size(b64: str) -> str:
    """The decoded size of base64 data, for people: ``640 bytes``, ``12.5 KB``, ``3.1 MB``."""
    n = len(b64) * 3 // 4 - b64[-2:].count("=") if b64 else 0
    if n < 1024:
        return f"{n} bytes"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} KB"
    return f"{n / 1024 / 1024:.1f} MB"


def _same_json(block: Any, structured: Any) -> bool:
    if getattr(block, "type", None) != "text":
        return False
    try:
        return bool(json.loads(block.text) == structured)
    except ValueError:
        return False
