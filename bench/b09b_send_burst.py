"""B9B: 500 simultaneous sends over HTTP — time until each gets its 202 (issue 10, item 11).

Against a real ``agentik serve`` (the fake LLM behind it): 500 conversations are created, then
one message is POSTed to each at the same moment over 500 connections, and the time from the
start of the burst to each 202 is recorded. The floor is the same server with
``AGENTIK_DB_PATH=:memory:`` (no file, no fsync): what the HTTP handling alone costs, so the
difference is what durability adds. Repeated in alternating blocks.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import common
from common import TurnClient, row, start_agentik, start_fake, stats, stop_all


async def burst(port: int, n: int) -> list[float]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        client = TurnClient(port, session)
        cids = [await client.new_conversation() for _ in range(n)]
        t0 = time.perf_counter()

        async def send(cid: str) -> float:
            await client.post(cid, "hello")
            return (time.perf_counter() - t0) * 1e3

        return list(await asyncio.gather(*(send(cid) for cid in cids)))


async def main(args: Any) -> dict[str, Any]:
    common.raise_fd_limit()
    n = 200 if args.quick else 500
    reps = common.repeats(args, 5, 2)
    fake = start_fake()
    durable = start_agentik(fake.port)
    memory = start_agentik(fake.port, db=":memory:")
    s: dict[str, list[float]] = {"file": [], "memory": []}
    try:
        for _ in range(reps):
            s["file"] += await burst(durable.port, n)
            s["memory"] += await burst(memory.port, n)
            await asyncio.sleep(1)  # let the turns the burst started finish
    finally:
        stop_all(durable, memory, fake)
    st = {k: stats(v) for k, v in s.items()}
    return {
        "id": "B9B",
        "title": f"{n} simultaneous sends over HTTP: time to 202",
        "rows": [
            row(
                f"{n} simultaneous POST …/messages, time to each 202 (agentik on a file, durable "
                "with group commit; floor: the same server on :memory:, no fsync)",
                st["file"],
                st["memory"],
                unit="ms",
                target="p50 ≤ 20 ms",
                met=st["file"]["median"] <= 20,
            ),
        ],
        "notes": [
            f"{reps} bursts each, alternating; 500 connections; each message starts a turn on the "
            "fake LLM, so the server also streams replies while the burst is answered"
        ],
        "raw": st,
    }


if __name__ == "__main__":
    common.cli(main)
