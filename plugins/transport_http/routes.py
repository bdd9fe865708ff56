"""The agent's own HTTP+SSE API under ``/agentik`` (SPEC F3). Handlers only translate HTTP
to the :class:`~agentik.core.agent.ChatAgent` protocol and back."""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

from aiohttp import web

from agentik.core.agent import ChatAgent, ChatConversation, ConversationClosed
from agentik.core.app import AGENT, error_response
from agentik.core.approvals import Approval
from agentik.core.conversation import NotWaiting
from agentik.core.protocol import read_history
from agentik.core.security import event_stream
from agentik.core.types import (
    ConversationInfo,
    InvalidInput,
    MessageContext,
    UnknownReference,
    Via,
    content_from_json,
    parse_json,
)
from agentik_transport_http import export
from agentik_transport_http.sse import StreamHub, resume_point

HUB = web.AppKey("agentik.http.streams", StreamHub)
OPENAPI = web.AppKey("agentik.http.openapi", dict[str, str])
MAX_LIMIT = 200
#: a history page ends early (with ``nextAfter``) once its messages' JSON reaches this size
PAGE_BYTES = 4 * 2**20
WRITE_CHUNK = 64 * 1024  # bytes of a page encoded before they are written
DEFAULT_LIMIT = 50
MAX_TITLE = 1000
MAX_KEY = 255
INTEGER = re.compile(r"-?[0-9]{1,18}")  # longer is out of any range (and slow to parse)
#: printable ASCII without spaces at either end (HTTP strips those from a header's value)
KEY = re.compile(r"[!-~](?:[ -~]*[!-~])?")

REQUIRED = object()
VIA = Via("http")  # a send that names no sender

routes = web.RouteTableDef()


def conversation_json(c: ChatConversation | ConversationInfo, busy: bool = False) -> dict[str, Any]:
    return {
        "id": c.id,
        "title": c.title,
        "temp": c.is_temporal,
        "createdAt": c.created_at.isoformat(),
        "updatedAt": c.updated_at.isoformat(),
        "busy": busy,
    }


def conv_json(conv: ChatConversation, busy: bool | None = None) -> dict[str, Any]:
    return {
        **conversation_json(conv, conv.busy if busy is None else busy),
        "supportsImageInput": conv.supports_image_input,
        "supportsImageOutput": conv.supports_image_output,
    }


def bad_request(message: str, code: str = "invalid_request") -> web.Response:
    return error_response(400, code, message)


async def read_json(request: web.Request, *, empty: Any = REQUIRED) -> Any:
    """The JSON body; ``empty`` is what an empty body means (by default it is refused)."""
    body = await request.read()  # raises 413 past client_max_size
    if not body.strip():
        if empty is not REQUIRED:
            return empty
        raise InvalidInput("the request needs a JSON body")
    return parse_json(body)


def page_params(request: web.Request) -> tuple[int, int]:
    def number(name: str, default: int, lo: int, hi: int) -> int:
        raw = request.query.get(name)
        if raw is None:
            return default
        if not INTEGER.fullmatch(raw):
            if raw.lstrip("-").isdigit():
                raise InvalidInput(f"{name} must be between {lo} and {hi}")
            raise InvalidInput(f"{name} must be an integer, got {raw[:40]!r}")
        value = int(raw)
        if not lo <= value <= hi:
            raise InvalidInput(f"{name} must be between {lo} and {hi}")
        return value

    return number("offset", 0, 0, 2**31), number("limit", DEFAULT_LIMIT, 1, MAX_LIMIT)


async def conversation_or_404(request: web.Request) -> ChatConversation:
    cid = request.match_info["id"]
    conv = await request.app[AGENT].get_conversation(cid)
    if conv is None:
        raise web.HTTPNotFound(text=f"no conversation {cid!r}")
    return conv


@web.middleware
async def invalid_input_as_400(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)  # type: ignore[no-any-return]
    except UnknownReference as e:
        return error_response(404, "not_found", str(e))
    except InvalidInput as e:
        return bad_request(str(e))


@routes.post("/conversations")
async def create_conversation(request: web.Request) -> web.Response:
    body = await read_json(request, empty={})
    if not isinstance(body, dict):
        raise InvalidInput("the body must be a JSON object")
    unknown = set(body) - {"temp", "title"}
    if unknown:
        raise InvalidInput(f"unknown fields: {', '.join(sorted(unknown))}")
    temp = body.get("temp", False)
    title = body.get("title")
    if not isinstance(temp, bool):
        raise InvalidInput("temp must be a boolean")
    _check_title(title)
    conv = await request.app[AGENT].create_conversation(temp=temp, title=title)
    return web.json_response(conv_json(conv), status=201)


def _check_title(title: Any) -> None:
    if title is not None and not isinstance(title, str):
        raise InvalidInput("title must be a string or null")
    if isinstance(title, str) and len(title) > MAX_TITLE:
        raise InvalidInput(f"title must be at most {MAX_TITLE} characters")


@routes.get("/conversations")
async def list_conversations(request: web.Request) -> web.Response:
    offset, limit = page_params(request)
    agent: ChatAgent = request.app[AGENT]
    infos = await agent.list_conversations(offset, limit + 1)
    busy = await agent.busy_among([i.id for i in infos[:limit]])
    items = [conversation_json(i, i.id in busy) for i in infos[:limit]]
    return web.json_response(
        {"items": items, "offset": offset, "limit": limit, "hasMore": len(infos) > limit}
    )


@routes.get("/conversations/{id}")
async def get_conversation(request: web.Request) -> web.Response:
    conv = await conversation_or_404(request)
    # another instance may be running its turns: busy then comes from the store
    return web.json_response(conv_json(conv, await conv.busy_now()))


@routes.patch("/conversations/{id}")
async def rename_conversation(request: web.Request) -> web.Response:
    conv = await conversation_or_404(request)
    body = await read_json(request)
    if not isinstance(body, dict) or "title" not in body:
        raise InvalidInput('the body must be {"title": string | null}')
    if set(body) - {"title"}:
        raise InvalidInput(f"unknown fields: {', '.join(sorted(set(body) - {'title'}))}")
    _check_title(body["title"])
    await conv.rename(body["title"])
    return web.json_response(conv_json(conv, await conv.busy_now()))  # as get_conversation


@routes.delete("/conversations/{id}")
async def delete_conversation(request: web.Request) -> web.Response:
    cid = request.match_info["id"]
    if not await request.app[AGENT].delete_conversation(cid):
        raise web.HTTPNotFound(text=f"no conversation {cid!r}")
    return web.Response(status=204)


def parse_message_body(body: Any) -> tuple[list[Any], MessageContext | None, Via]:
    """Both forms: a bare array of content parts, or ``{"content": [...], "context": {...},
    "sender": "..."}``."""
    if isinstance(body, list):
        return content_from_json(body), None, VIA
    if not isinstance(body, dict):
        raise InvalidInput("the body must be an array of content parts or an object")
    unknown = set(body) - {"content", "context", "sender"}
    if unknown:
        raise InvalidInput(f"unknown fields: {', '.join(sorted(unknown))}")
    if "content" not in body:
        raise InvalidInput("content is required")
    raw_context = body.get("context")
    context = None if raw_context is None else MessageContext.from_json(raw_context)
    sender = body.get("sender")
    if sender is not None and not isinstance(sender, str):
        raise InvalidInput("sender must be a string or null")
    via = VIA if sender is None else Via("http", sender)
    return content_from_json(body["content"]), context, via


def idempotency_key(request: web.Request) -> str | None:
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return None
    if len(key) > MAX_KEY or not KEY.fullmatch(key):
        raise InvalidInput(f"Idempotency-Key must be 1 to {MAX_KEY} printable ASCII characters")
    return key


@routes.post("/conversations/{id}/messages")
async def send_message(request: web.Request) -> web.Response:
    conv = await conversation_or_404(request)
    key = idempotency_key(request)
    content, context, via = parse_message_body(await read_json(request))
    try:
        msg = await conv.send(content, context, idempotency_key=key, via=via)
    except ConversationClosed:
        raise web.HTTPNotFound(text=f"no conversation {conv.id!r}") from None
    # a retried send learns whether anything will still answer its message (a crash may have
    # cut its turn: "failed" with error "restart")
    state, error = await conv.turn_state(msg.id)
    body = {**msg.to_json(), "turn": state}
    if error is not None:
        body["error"] = error
    return web.json_response(body, status=202)


@routes.post("/conversations/{id}/interrupt")
async def interrupt(request: web.Request) -> web.Response:
    conv = await conversation_or_404(request)
    return web.json_response({"interrupted": await conv.ainterrupt()}, status=202)


@routes.get("/conversations/{id}/approvals")
async def list_approvals(request: web.Request) -> web.Response:
    conv = await conversation_or_404(request)
    items = [a.to_json() for a in await conv.approvals()]
    return web.json_response({"items": items})


@routes.post("/conversations/{id}/approvals/{callId}")
async def answer_approval(request: web.Request) -> web.Response:
    conv = await conversation_or_404(request)
    call_id = request.match_info["callId"]
    approval = Approval.from_json(await read_json(request))
    try:
        if approval.approve:
            turn = await conv.approve(call_id, note=approval.note, args=approval.args)
        else:
            turn = await conv.deny(call_id, note=approval.note)
    except NotWaiting as e:
        return error_response(409, "not_waiting", str(e))
    status = "approved" if approval.approve else "denied"
    return web.json_response({"callId": call_id, "status": status, "turn": str(turn.state)})


@routes.get("/conversations/{id}/messages")
async def list_messages(request: web.Request) -> web.StreamResponse:
    conv = await conversation_or_404(request)
    offset, limit = page_params(request)
    after = request.query.get("after") or None
    msgs = await conv.get_messages(after, offset, limit + 1, max_bytes=PAGE_BYTES)
    items = msgs[:limit]
    if len(msgs) > limit:
        more = True
    elif items:  # the end, or the byte budget cut the page: one more message tells which
        more = bool(await conv.get_messages(items[-1].id, 0, 1, max_bytes=0))
    else:
        more = False
    tail = {
        "offset": offset,
        "limit": limit,
        "hasMore": more,
        "nextAfter": items[-1].id if more else None,
    }
    return await stream_json_page(request, [m.to_json() for m in items], tail)


async def stream_json_page(
    request: web.Request, items: list[dict[str, Any]], tail: dict[str, Any]
) -> web.StreamResponse:
    """``{"items": [...], **tail}``, encoded and written a chunk at a time: a page of big
    messages neither stalls the event loop for its whole encoding nor needs a second copy of
    itself in memory (a client that stops reading is dropped by the server's write timeout)."""
    if request.method == "HEAD":  # the headers a GET would get, and no body
        return web.Response(content_type="application/json", charset="utf-8")
    resp = web.StreamResponse()
    resp.content_type, resp.charset = "application/json", "utf-8"
    await resp.prepare(request)
    chunk = bytearray(b'{"items":[')
    for i, item in enumerate(items):
        if i:
            chunk += b","
        chunk += json.dumps(item, ensure_ascii=False).encode("utf-8", "replace")
        if len(chunk) >= WRITE_CHUNK:
            await resp.write(bytes(chunk))
            chunk.clear()
    chunk += b"]," + json.dumps(tail).encode()[1:]
    await resp.write(bytes(chunk))
    await resp.write_eof()
    return resp


@routes.get("/conversations/{id}/events")
@event_stream
async def conversation_events(request: web.Request) -> web.StreamResponse:
    conv = await conversation_or_404(request)
    after = resume_point(request)
    if after is None:  # from now: said in a header, so a client resumes from there
        after = conv.last_event_id
    hub = request.app[HUB]
    return await hub.serve(request, conv.event_batches(after, hub.linger), after)


@routes.get("/events")
@event_stream
async def agent_events(request: web.Request) -> web.StreamResponse:
    after = resume_point(request)
    agent: ChatAgent = request.app[AGENT]
    if after is None:
        after = await agent.events_now()
    hub = request.app[HUB]
    return await hub.serve(request, agent.event_batches(after, hub.linger), after)


@routes.get("/conversations/{id}/stats")
async def conversation_stats(request: web.Request) -> web.Response:
    conv = await conversation_or_404(request)
    stats = await conv.token_stats()
    return web.json_response(
        {"conversationId": conv.id, **stats.to_json(), "contextTokens": stats.context}
    )


@routes.get("/conversations/{id}/export")
async def export_conversation(request: web.Request) -> web.Response:
    form = request.query.get("format", "md")
    if form not in export.FORMATS:
        raise InvalidInput(f"format must be one of {', '.join(export.FORMATS)}, got {form[:40]!r}")
    conv = await conversation_or_404(request)
    records = await read_history(conv)
    stats = await conv.token_stats()
    write = export.as_json if form == "json" else export.as_markdown
    counts = {"conversationId": conv.id, **stats.to_json(), "contextTokens": stats.context}
    text = write(conv_json(conv), counts, records)
    return web.Response(
        text=text,
        content_type=export.FORMATS[form],
        charset="utf-8",
        headers={"Content-Disposition": f'attachment; filename="{conv.id}.{form}"'},
    )


@routes.get("/stats")
async def agent_stats(request: web.Request) -> web.Response:
    agent: ChatAgent = request.app[AGENT]
    stats = await agent.store.token_stats()
    background = await agent.store.background_usage()
    return web.json_response(
        {
            "conversations": await agent.count_conversations(),
            **stats.to_json(),
            "background": {feature: usage.to_json() for feature, usage in background.items()},
        }
    )


@routes.get("/openapi.json")
async def openapi(request: web.Request) -> web.Response:
    cache = request.app[OPENAPI]  # built at the first request: the model has started by then
    if "text" not in cache:
        cache["text"] = served_document(request.app[AGENT])
    return web.Response(text=cache["text"], content_type="application/json")


def served_document(agent: ChatAgent) -> str:
    """openapi.json as this server accepts it: without image input parts when the model
    takes no images (so every send the document allows is one the server takes)."""
    text = resources.files("agentik_transport_http").joinpath("openapi.json").read_text()
    if (agent.llm.capabilities or {}).get("image_input"):
        return text
    doc = json.loads(text)
    doc["components"]["schemas"]["InputPart"]["oneOf"] = [{"$ref": "#/components/schemas/TextPart"}]
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def make_subapp(agent: ChatAgent, heartbeat: float, linger: float = 0.0) -> web.Application:
    sub = web.Application(middlewares=[invalid_input_as_400])
    sub[AGENT] = agent
    hub = sub[HUB] = StreamHub(heartbeat, linger)
    sub[OPENAPI] = {}
    sub.add_routes(routes)

    async def close_hub(app: web.Application) -> None:
        await hub.close()

    sub.on_cleanup.append(close_hub)
    return sub
