"""Floor for B5/B7 (per-token relay, concurrent streams): the minimal aiohttp relay.
``GET /relay?text=…`` streams a chat completion from the fake LLM and writes one SSE frame per
delta, then an End frame. No conversation, no database, no event log."""

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


async def relay(request: web.Request) -> web.StreamResponse:
    app = request.app
    resp = web.StreamResponse(headers=HEADERS)
    await resp.prepare(request)
    seq = 0
    try:
        async for delta in stream_deltas(app["session"], app["upstream"], request.query["text"]):
            seq += 1
            data = json.dumps({"type": "AppendText", "text": delta}, separators=(",", ":"))
            await resp.write(f"id: {seq}\nevent: AppendText\ndata: {data}\n\n".encode())
        await resp.write(f'id: {seq + 1}\nevent: End\ndata: {{"type":"End"}}\n\n'.encode())
    except ConnectionError:
        pass
    return resp


async def lag_probe(out: list[tuple[float, float]]) -> None:
    """B14's reference: how late a 1 ms sleeper wakes on this loop (time.monotonic, ms)."""
    while True:
        t = time.monotonic()
        await asyncio.sleep(0.001)
        now = time.monotonic()
        out.append((now, (now - t - 0.001) * 1e3))


async def main(host: str, port: int, upstream: str, lag_out: str | None = None) -> None:
    app = web.Application()
    app["upstream"] = upstream
    app["session"] = make_session()
    app.router.add_get("/health", health)
    app.router.add_get("/relay", relay)
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1)
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
    args = parser.parse_args()
    asyncio.run(main(args.host, args.port, args.upstream, args.lag_out))
