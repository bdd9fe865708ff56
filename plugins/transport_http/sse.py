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
import time
from collections.abc import AsyncIterator
from email.utils import formatdate
from json.encoder import encode_basestring as _string  # JSON string, ensure_ascii=False

from aiohttp import web

from agentik.core.events import StreamItem
from agentik.core.streaming import LateStream
from agentik.core.types import AppendText, InvalidInput

log = logging.getLogger(__name__)

PING = b": ping\n\n"
MAX_EVENT_ID = 2**63 - 1
HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


#: one encoder for every event (``json.dumps`` with options builds a new one per call)
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def encode(item: StreamItem) -> bytes:
    frame = item.memo.get("sse")
    if frame is None:
        event = item.event
        if type(event) is AppendText and not event.reasoning:
            # nearly every frame: AppendText.to_json() as JSON, without the dict in between
            kind, data = "AppendText", f'{{"type":"AppendText","text":{_string(event.text)}}}'
        else:
            payload = event.to_json()
            kind, data = payload["type"], _dumps(payload)
        text = f"id: {item.seq}\nevent: {kind}\ndata: {data}\n\n"
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


class EventStream(LateStream):
    """An SSE response, streamed by its hub once the handler returned it (the handler and the
    route's middlewares do not stay in memory for the stream's hours: B8)."""

    def __init__(
        self, hub: StreamHub, request: web.Request, batches: AsyncIterator[list[StreamItem]]
    ) -> None:
        super().__init__(headers=HEADERS)
        self._hub, self.request = hub, request
        self._batches: AsyncIterator[list[StreamItem]] | None = batches

    async def end(self) -> None:
        """Close the event source (without streaming it, if it never was)."""
        batches, self._batches = self._batches, None
        aclose = getattr(batches, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()

    async def body(self) -> None:
        """Every batch in one write, until the log ends or the client leaves."""
        batches, hub = self._batches, self._hub
        if batches is None:
            return
        hub.streams[self] = asyncio.current_task()
        hub.beat()
        try:
            async for batch in batches:
                if len(batch) == 1:
                    await self.write(encode(batch[0]))
                else:
                    await self.write(b"".join(encode(item) for item in batch))
        except (ConnectionError, asyncio.CancelledError):
            pass  # the client went away; the turn goes on without it
        finally:
            hub.streams.pop(self, None)
            await self.end()


class StreamHub:
    """The open SSE responses of one app and the one heartbeat that keeps them alive."""

    def __init__(self, interval: float, linger: float = 0.0) -> None:
        self.interval = interval
        self.linger = linger  # seconds to gather more events before a write (coalescing)
        self.streams: dict[EventStream, asyncio.Task[object] | None] = {}
        self._heartbeat: asyncio.Task[None] | None = None
        self._dated: tuple[int, str] = (0, "")

    def _date(self) -> str:
        """The Date header, made once a second: aiohttp makes one string per response, and
        every open stream keeps its own."""
        now = int(time.time())
        if self._dated[0] != now:
            self._dated = (now, formatdate(now, usegmt=True))
        return self._dated[1]

    async def serve(
        self,
        request: web.Request,
        batches: AsyncIterator[list[StreamItem]],
        after: int | None = None,
    ) -> web.StreamResponse:
        """The response that streams event batches until the log ends or the client leaves;
        one write a batch. ``after``: the event id the stream starts after, sent as the
        ``Last-Event-ID`` response header (a client that loses the connection before the first
        event resumes from it). Its headers are sent now; the streaming happens in its
        ``write_eof``, so the handler and the middlewares around it return at once."""
        resp = EventStream(self, request, batches)
        if after is not None:
            resp.headers["Last-Event-ID"] = str(after)
        resp.headers["Date"] = self._date()  # one string for the streams of a second
        if request.method == "HEAD":  # the headers a GET would get, and no stream
            await resp.end()
            return web.Response(headers=resp.headers)
        await resp.prepare(request)
        return resp

    def beat(self) -> None:
        """Start the heartbeat of every stream, if it is not running."""
        if self._heartbeat is None:
            self._heartbeat = asyncio.create_task(self._beat())

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            for resp, task in list(self.streams.items()):
                request = resp.request
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
