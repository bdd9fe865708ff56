"""agentik's server, built by ``create_app`` from the same plugins and environment as
``agentik serve`` and run the same way (AppRunner + TCPSite), plus two probes on its event loop:

* lag: a task sleeping 1 ms in a loop records how late it wakes (overshoot, ms);
* jobs: every 50 ms ``agent.jobs.spawn`` of a coroutine that records how long after the spawn
  it started running (dispatch latency, ms).

Samples carry ``time.monotonic()`` stamps (the same clock in every process), so the benchmark
can cut idle and loaded windows. On SIGTERM it writes them as JSON to ``--out`` and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from pathlib import Path

from aiohttp import web

from agentik.core.app import AGENT, create_app


async def lag_probe(out: list[tuple[float, float]]) -> None:
    mono = time.monotonic
    while True:
        t = mono()
        await asyncio.sleep(0.001)
        now = mono()
        out.append((now, (now - t - 0.001) * 1e3))


async def job_probe(app: web.Application, out: list[tuple[float, float]]) -> None:
    agent = app[AGENT]

    async def job(t_spawn: float) -> None:
        now = time.monotonic()
        out.append((now, (now - t_spawn) * 1e3))

    while True:
        await asyncio.sleep(0.05)
        agent.jobs.spawn("bench-probe", job(time.monotonic()))


async def main(port: int, out_path: Path, slow: float | None = None) -> None:
    if slow:  # diagnosis only: asyncio debug mode logs every callback slower than ``slow`` s
        import logging

        logging.basicConfig(level=logging.WARNING)
        loop = asyncio.get_running_loop()
        loop.set_debug(True)
        loop.slow_callback_duration = slow
    app = create_app()  # plugins and settings from the environment, like `agentik serve`
    # as agentik/core/cli.py runs it (handler_cancellation: a departed SSE client's handler ends)
    runner = web.AppRunner(
        app,
        handle_signals=False,
        access_log=None,
        shutdown_timeout=2,
        handler_cancellation=True,
    )
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    lag: list[tuple[float, float]] = []
    jobs: list[tuple[float, float]] = []
    probes = [asyncio.create_task(lag_probe(lag)), asyncio.create_task(job_probe(app, jobs))]
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    for p in probes:
        p.cancel()
    await asyncio.to_thread(out_path.write_text, json.dumps({"lag": lag, "jobs": jobs}))
    await runner.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--slow", type=float, help="log callbacks slower than this (s)")
    args = parser.parse_args()
    asyncio.run(main(args.port, args.out, args.slow))
