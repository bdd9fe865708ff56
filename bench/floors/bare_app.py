"""Floor for B1 (cold start), B8 (idle SSE streams, broadcast) and B16 (trivial route): a bare
aiohttp app, no middleware, started the way ``agentik serve`` starts (AppRunner + TCPSite)."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal

from aiohttp import web

HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
streams: set[web.StreamResponse] = set()


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "agent": "bare"})


async def stream(request: web.Request) -> web.StreamResponse:
    """An idle SSE stream: headers, then whatever /broadcast writes, until the client leaves."""
    resp = web.StreamResponse(headers=HEADERS)
    await resp.prepare(request)
    streams.add(resp)
    try:
        await request.app["stop"].wait()
    except asyncio.CancelledError:
        pass
    finally:
        streams.discard(resp)
    return resp


async def broadcast(request: web.Request) -> web.Response:
    """Write ``n`` AppendText frames and an End frame to every open stream (one task), one
    write per frame and stream; with ``delay`` (s), that long before each frame."""
    n = int(request.query.get("n", "1"))
    delay = float(request.query.get("delay", "0"))
    for i in range(n + 1):
        if delay:
            await asyncio.sleep(delay)
        seq = i + 1
        kind = "End" if i == n else "AppendText"
        payload = {"type": kind} if kind == "End" else {"type": kind, "text": "tok"}
        data = json.dumps(payload, separators=(",", ":"))
        frame = f"id: {seq}\nevent: {kind}\ndata: {data}\n\n".encode()
        for resp in list(streams):
            try:
                await resp.write(frame)
            except ConnectionError:
                streams.discard(resp)
    return web.json_response({"streams": len(streams)})


async def main(host: str, port: int) -> None:
    app = web.Application()
    app["stop"] = asyncio.Event()
    app.router.add_get("/health", health)
    app.router.add_get("/stream", stream)
    app.router.add_post("/broadcast", broadcast)
    runner = web.AppRunner(  # as `agentik serve` runs its app
        app, handle_signals=False, access_log=None, shutdown_timeout=1, handler_cancellation=True
    )
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    app["stop"].set()
    await runner.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    asyncio.run(main(args.host, args.port))
