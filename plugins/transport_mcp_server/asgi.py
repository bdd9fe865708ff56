"""One aiohttp request served by an ASGI application (the ``mcp`` SDK's streamable HTTP server
is one): the request becomes an ASGI ``scope`` with its body, the app's response is written to
an aiohttp ``StreamResponse`` as it comes (SSE included), and a client that goes away is an
``http.disconnect``, as under an ASGI server. Nothing here imports the SDK."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from aiohttp import web

from agentik.core.app import error_response

Scope = MutableMapping[str, Any]
ASGIMessage = MutableMapping[str, Any]
ASGIApp = Callable[
    [Scope, Callable[[], Awaitable[ASGIMessage]], Callable[[ASGIMessage], Awaitable[None]]],
    Awaitable[None],
]
#: hop-by-hop headers are the server's to set, not the application's
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"transfer-encoding"})
#: seconds an application gets to notice that its client left before it is cancelled
LEAVE_TIMEOUT = 5.0


async def serve(app: ASGIApp, request: web.Request) -> web.StreamResponse:
    body = await request.read()  # already read (and size-capped) by the app's middleware
    peer = request.transport.get_extra_info("peername") if request.transport else None
    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": f"{request.version.major}.{request.version.minor}",
        "method": request.method,
        "scheme": request.scheme,
        "path": request.path,
        "raw_path": request.url.raw_path.encode(),
        "query_string": request.query_string.encode(),
        "root_path": "",
        "headers": [(name.lower(), value) for name, value in request.raw_headers],
        "client": tuple(peer[:2]) if isinstance(peer, tuple) else None,
        "server": (request.url.host, request.url.port),
        "state": {},
    }
    left = asyncio.Event()  # the client went away, or the response is complete
    response: web.StreamResponse | None = None
    body_given = False

    async def receive() -> ASGIMessage:
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: ASGIMessage) -> None:
        nonlocal response
        if left.is_set():
            return
        try:
            if message["type"] == "http.response.start":
                response = web.StreamResponse(status=message["status"])
                for name, value in message.get("headers", ()):
                    if name.lower() not in HOP_BY_HOP:
                        response.headers.add(name.decode("latin-1"), value.decode("latin-1"))
                await response.prepare(request)
            elif message["type"] == "http.response.body" and response is not None:
                chunk = message.get("body", b"")
                if chunk:
                    await response.write(chunk)
                if not message.get("more_body", False):
                    await response.write_eof()
                    left.set()
        except ConnectionError:
            left.set()  # the client left: the app hears it as a disconnect

    task = asyncio.ensure_future(app(scope, receive, send))
    try:
        # shielded: aiohttp cancels a handler whose client left; the app is told instead
        await asyncio.shield(task)
    except asyncio.CancelledError:
        left.set()
        _, pending = await asyncio.wait([task], timeout=LEAVE_TIMEOUT)
        if pending:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        raise
    finally:
        left.set()
    if response is None:
        return error_response(500, "internal", "the MCP server sent no response")
    return response
