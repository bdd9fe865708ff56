"""Long-term memory over HTTP, for people (the web page's memory panel) and scripts:
``GET /agentik/memory/notes?category=…`` (a page of one category, oldest first) and
``DELETE /agentik/memory/notes/{id}`` (archived, recoverable, as ``memory_delete`` does). The
routes exist only while memory is on; they sit behind the API key like every route."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from agentik.core.app import error_response
from agentik.core.memory import CATEGORIES, MemoryBackend, Note

PREFIX = "/agentik/memory"
DEFAULT_LIMIT, MAX_LIMIT = 50, 200


def note_json(note: Note) -> dict[str, Any]:
    return {
        "id": note.id,
        "category": note.category,
        "text": note.text,
        "source": note.source,
        "createdAt": note.created.isoformat(),
        "lastUsedAt": note.last_used.isoformat() if note.last_used else None,
        "uses": note.uses,
    }


def number(request: web.Request, name: str, default: int, lo: int, hi: int) -> int | None:
    raw = request.query.get(name)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 10 and lo <= int(raw) <= hi):
        return None
    return int(raw)


def add_routes(app: web.Application, memory: MemoryBackend) -> None:
    async def list_notes(request: web.Request) -> web.Response:
        category = request.query.get("category")
        if category not in CATEGORIES:
            return error_response(
                400, "invalid_request", f"category must be one of {', '.join(CATEGORIES)}"
            )
        offset = number(request, "offset", 0, 0, 2**31)
        limit = number(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
        if offset is None or limit is None:
            return error_response(
                400, "invalid_request", f"offset must be ≥ 0 and limit 1 to {MAX_LIMIT}"
            )
        notes = await memory.list(category, offset, limit + 1)
        return web.json_response(
            {
                "items": [note_json(n) for n in notes[:limit]],
                "offset": offset,
                "limit": limit,
                "hasMore": len(notes) > limit,
            }
        )

    async def delete_note(request: web.Request) -> web.Response:
        note_id = request.match_info["id"]
        if not await memory.delete(note_id, recoverable=True):
            raise web.HTTPNotFound(text=f"no note {note_id!r}")
        return web.Response(status=204)

    app.router.add_get(f"{PREFIX}/notes", list_notes)
    app.router.add_delete(PREFIX + "/notes/{id}", delete_note)
