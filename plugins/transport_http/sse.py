"""Server-sent events on a bare ``StreamResponse`` with one shared heartbeat.

Not aiohttp-sse (which the design names): it starts a ping task per stream and sends one event
per write, where thousands of idle streams want one heartbeat task for all of them and a busy
stream wants all pending events in one write (B8, B5 in docs/PERFORMANCE.md). Each event is
encoded once and the bytes are shared by every reader (``StreamItem.memo``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from agentik.core.events import StreamItem
from agentik.core.types import InvalidInput

log = logging.getLogger(__name__)

PING = b": ping\n\n"
MAX_EVENT_ID = 2**63 - 1
HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


def encode(item: StreamItem) -> bytes:
    frame = item.memo.get("sse")
    if frame is None:
        payload = item.event.to_json()
        data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
        text = f"id: {item.seq}\nevent: {payload['type']}\ndata: {data}\n\n"
        # "replace": a model's broken surrogate pair must not kill every reader's stream
        frame = item.memo["sse"] = text.encode("utf-8", "replace")
    return frame  # type: ignore[no-any-return]


def resume_point(request: web.Request) -> int | None:
    """Where a client resumes: the ``Last-Event-ID`` header, else ``?after=``, else now. Both
    are checked when both are given."""
    header = _event_id("Last-Event-ID", request.headers.get("Last-Event-ID"))
    query = _event_id("after", request.query.get("after"))
    return header if header is not None else query


def _event_id(name: str, raw: str | None) -> int | None:
    if raw is None:
        return None
    # event ids are 64-bit counters; longer is no id of ours
    if not raw.isascii() or not raw.isdigit() or len(raw) > 19 or int(raw) > MAX_EVENT_ID:
        raise InvalidInput(f"{name} must be an event id (0 to {MAX_EVENT_ID}), got {raw[:40]!r}")
    return int(raw)


class StreamHub:
    """The open SSE responses of one app and the one heartbeat that keeps them alive."""

    def __init__(self, interval: float, linger: float = 0.0) -> None:
        self.interval = interval
        self.linger = linger  # seconds to gather more events before a write (coalescing)
        self.streams: dict[web.StreamResponse, tuple[web.Request, asyncio.Task[object] | None]] = {}
        self._heartbeat: asyncio.Task[None] | None = None

    async def serve(
        self,
        request: web.Request,
        batches: AsyncIterator[list[StreamItem]],
        after: int | None = None,
    ) -> web.StreamResponse:
        """Stream event batches until the log ends or the client leaves; one write a batch.
        ``after``: the event id the stream starts after, sent as the ``Last-Event-ID``
        response header (a client that loses the connection before the first event resumes
        from it)."""
        headers = HEADERS if after is None else {**HEADERS, "Last-Event-ID": str(after)}
        if request.method == "HEAD":  # the headers a GET would get, and no stream
            with contextlib.suppress(Exception):
                await batches.aclose()  # type: ignore[attr-defined]
            return web.Response(headers=headers)
        resp = web.StreamResponse(headers=headers)
        await resp.prepare(request)
        self.streams[resp] = (request, asyncio.current_task())
        if self._heartbeat is None:
            self._heartbeat = asyncio.create_task(self._beat())
        try:
            async for batch in batches:
                if len(batch) == 1:
                    await resp.write(encode(batch[0]))
                else:
                    await resp.write(b"".join(encode(item) for item in batch))
        except (ConnectionError, asyncio.CancelledError):
            pass  # the client went away; the turn goes on without it
        finally:
            self.streams.pop(resp, None)
            with contextlib.suppress(Exception):
                aclose = getattr(batches, "aclose", None)
                if aclose is not None:
                    await aclose()
        return resp

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            for resp, (request, task) in list(self.streams.items()):
                transport = request.transport
                if transport is None or transport.is_closing():
                    if task is not None:
                        task.cancel()  # a dead client: end its handler now
                    continue
                if request.protocol.writing_paused:
                    continue  # not reading: a write would wait for it and stall every ping
                try:
                    await resp.write(PING)
                except Exception:
                    if task is not None:
                        task.cancel()

    async def close(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
