"""Floor for B5/B7 (per-token relay, concurrent streams): the minimal aiohttp relay.
``GET /relay?text=…`` streams a chat completion from the fake LLM and writes one SSE frame per
delta, then an End frame. No conversation, no database, no event log.

``--coalesce-ms M`` (B5's coalesced floor): a delta is not written at once; the frames that
arrive within M ms of the first unwritten one go out in one write (the same rule as agentik's
``AGENTIK_SSE_COALESCE_MS``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from pathlib import Path

from aiohttp import web
from upstream import make_session, stream_deltas

HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def frame(seq: int, delta: str) -> bytes:
    data = json.dumps({"type": "AppendText", "text": delta}, separators=(",", ":"))
    return f"id: {seq}\nevent: AppendText\ndata: {data}\n\n".encode()


def end_frame(seq: int) -> bytes:
    return f'id: {seq}\nevent: End\ndata: {{"type":"End"}}\n\n'.encode()


async def relay(request: web.Request) -> web.StreamResponse:
    app = request.app
    resp = web.StreamResponse(headers=HEADERS)
    await resp.prepare(request)
    if app["linger"]:
        return await coalesced(request, resp, app["linger"])
    seq = 0
    try:
        async for delta in stream_deltas(app["session"], app["upstream"], request.query["text"]):
            seq += 1
            await resp.write(frame(seq, delta))
        await resp.write(end_frame(seq + 1))
    except ConnectionError:
        pass
    return resp


async def coalesced(
    request: web.Request, resp: web.StreamResponse, linger: float
) -> web.StreamResponse:
    """The reader appends frames to a buffer; the writer waits for one, lingers, writes them all."""
    app = request.app
    buf: list[bytes] = []
    news = asyncio.Event()
    done = False

    async def writer() -> None:
        while True:
            await news.wait()
            news.clear()
            if not done:
                await asyncio.sleep(linger)
            if buf:
                out = b"".join(buf)
                buf.clear()
                await resp.write(out)
            if done and not buf:
                return

    task = asyncio.create_task(writer())
    seq = 0
    try:
        async for delta in stream_deltas(app["session"], app["upstream"], request.query["text"]):
            seq += 1
            buf.append(frame(seq, delta))
            news.set()
        buf.append(end_frame(seq + 1))
        done = True
        news.set()
        await task
    except ConnectionError:
        pass
    finally:
        task.cancel()
    return resp


async def lag_probe(out: list[tuple[float, float]]) -> None:
    """B14's reference: how late a 1 ms sleeper wakes on this loop (time.monotonic, ms)."""
    while True:
        t = time.monotonic()
        await asyncio.sleep(0.001)
        now = time.monotonic()
        out.append((now, (now - t - 0.001) * 1e3))


async def main(
    host: str, port: int, upstream: str, lag_out: str | None = None, linger: float = 0.0
) -> None:
    app = web.Application()
    app["upstream"] = upstream
    app["linger"] = linger
    app["session"] = make_session()
    app.router.add_get("/health", health)
    app.router.add_get("/relay", relay)
    runner = web.AppRunner(  # as `agentik serve` runs its app
        app, handle_signals=False, access_log=None, shutdown_timeout=1, handler_cancellation=True
    )
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    lag: list[tuple[float, float]] = []
    probe = asyncio.create_task(lag_probe(lag)) if lag_out else None
    await stop.wait()
    if probe is not None and lag_out:
        probe.cancel()
        await asyncio.to_thread(Path(lag_out).write_text, json.dumps({"lag": lag}))
    await runner.cleanup()
    await app["session"].close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the fake's base URL, …/v1")
    parser.add_argument("--lag-out", help="run a 1 ms loop-lag probe, write it here at exit")
    parser.add_argument("--coalesce-ms", type=float, default=0.0, help="write deltas in batches")
    args = parser.parse_args()
    asyncio.run(main(args.host, args.port, args.upstream, args.lag_out, args.coalesce_ms / 1000))
