"""B21: the Python client's cost per streamed event (agentik.client, typed events, resumable
stream) vs reading the same SSE of the same ``agentik serve`` with raw aiohttp.

The reader's own CPU (this process; the server is another) per event is a slope, so a turn's
fixed cost (the POST, the connection) drops out: (CPU of a T-token turn - CPU of a 1-token
turn) / (T - 1); each token is one ``AppendText`` event. Floors: the obvious raw reader
(``async for line in resp.content``, ``json.loads`` of each ``data:`` line) and a raw reader
that splits whole chunks as the client does (no typed events, no resume bookkeeping).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import common
from common import row, spec_text, stats

from agentik.client import RemoteAgent
from agentik.core.types import AppendText, End, TextPart

TOKENS = 1000  # one turn fits the server's replay buffer (1024): a slow reader gets no Gap


async def raw_lines(s: aiohttp.ClientSession, base: str, cid: str, tokens: int) -> int:
    """A user's raw aiohttp SSE reader: line by line, the JSON of every data line."""
    async with s.get(f"{base}/conversations/{cid}/events") as resp:
        await post(s, base, cid, tokens)
        count = 0
        async for raw in resp.content:
            if raw.startswith(b"data: "):
                data = json.loads(raw[6:])
                if data["type"] == "AppendText":
                    count += 1
                elif data["type"] == "End":
                    return count
    raise AssertionError("the stream ended before End")


async def raw_chunks(s: aiohttp.ClientSession, base: str, cid: str, tokens: int) -> int:
    """Whole chunks split into frames (the client's parsing, without typed events)."""
    async with s.get(f"{base}/conversations/{cid}/events") as resp:
        await post(s, base, cid, tokens)
        count = 0
        buffer = b""
        while chunk := await resp.content.readany():
            buffer += chunk
            *frames, buffer = buffer.split(b"\n\n")
            for frame in frames:
                for line in frame.split(b"\n"):
                    if line.startswith(b"data: "):
                        data = json.loads(line[6:])
                        if data["type"] == "AppendText":
                            count += 1
                        elif data["type"] == "End":
                            return count
    raise AssertionError("the stream ended before End")


async def client(agent: RemoteAgent, cid: str, tokens: int) -> int:
    conv = await agent.get_conversation(cid)
    assert conv is not None
    events = conv.events()
    try:
        await conv.send([TextPart(spec_text(tokens))])
        count = 0
        async for event in events:
            if isinstance(event, AppendText):
                count += 1
            elif isinstance(event, End):
                return count
    finally:
        await events.aclose()
    raise AssertionError("the stream ended before End")


async def post(s: aiohttp.ClientSession, base: str, cid: str, tokens: int) -> None:
    body = [{"type": "text", "body": spec_text(tokens)}]
    async with s.post(f"{base}/conversations/{cid}/messages", json=body) as r:
        assert r.status == 202, await r.text()


async def cpu_us(read: Any, tokens: int) -> float:
    t0 = time.process_time_ns()
    got = await asyncio.wait_for(read(tokens), 120)
    assert got == tokens, (got, tokens)
    return (time.process_time_ns() - t0) / 1e3


async def main(args: Any) -> dict[str, Any]:
    reps = common.repeats(args, 7, 2)
    fake = common.start_fake()
    server = common.start_agentik(fake.port)
    base = f"http://{common.HOST}:{server.port}/agentik"
    slopes: dict[str, list[float]] = {"client": [], "raw_lines": [], "raw_chunks": []}
    try:
        async with common.session() as s, RemoteAgent(f"http://{common.HOST}:{server.port}") as a:
            cid = (await a.create_conversation(temp=True)).id
            readers = {
                "client": lambda n: client(a, cid, n),
                "raw_lines": lambda n: raw_lines(s, base, cid, n),
                "raw_chunks": lambda n: raw_chunks(s, base, cid, n),
            }
            for read in readers.values():  # warm-up
                await cpu_us(read, 50)
            for _ in range(reps):
                for name, read in readers.items():
                    big = await cpu_us(read, TOKENS)
                    small = await cpu_us(read, 1)
                    slopes[name].append((big - small) / (TOKENS - 1))
    finally:
        common.stop_all(server, fake)
    c, lines, chunks = (stats(slopes[k]) for k in ("client", "raw_lines", "raw_chunks"))
    rows = [
        row(
            f"reader CPU per event, {TOKENS}-token turn: client vs raw aiohttp lines",
            c,
            lines,
            unit="µs",
            target="≤ 1.5x",
            met=c["median"] / lines["median"] <= 1.5,
        ),
        row(
            "the same, floor: raw aiohttp reading whole chunks (no typed events)",
            c,
            chunks,
            unit="µs",
            target="(for reference)",
            met=None,
        ),
    ]
    return {
        "id": "B21",
        "title": "the Python client's per-event overhead",
        "rows": rows,
        "notes": [f"{reps} alternating repeats; slope between {TOKENS}- and 1-token turns"],
        "raw": {"client": c, "raw_lines": lines, "raw_chunks": chunks},
    }


if __name__ == "__main__":
    common.cli(main)
