"""B25: history pages of big messages, and clients that ask for them and do not read.

A conversation of 100 messages of 1 MB (50 turns: a 1 MB send and a 1 MB reply, written to the
database before the server starts, so no model is involved). Measured on ``agentik serve``:

- reading the whole history page by page (``limit=200``): pages, wall time, the largest page,
  and the worst ``/health`` answer time meanwhile (a probe every 10 ms: how long the event loop
  stalled);
- the server's RSS at rest, then with six clients that asked for the history and read nothing
  (a 4 KiB receive buffer each), then after they are gone: once when they close their
  connections, once when they keep them open and the server drops them after
  ``AGENTIK_WRITE_TIMEOUT`` (5 s here). Target: back within 10% of the RSS at rest.

The baseline is the same server's RSS before the clients came, in the same run.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from datetime import UTC, datetime
from typing import Any

import common
from common import row, stats

MESSAGES = 100
SIZE = 1_000_000
READERS = 6
WRITE_TIMEOUT = 5.0


async def build_history(path: str) -> str:
    """The conversation, written with agentik's own store."""
    from agentik.core.db import Database
    from agentik.core.store import SqliteStore
    from agentik.core.types import ConversationInfo, Message

    store = SqliteStore(Database(path))
    await store.open()
    now = datetime.now(UTC)
    cid = "conv-big"
    await store.create_conversation(ConversationInfo(cid, "big", False, now, now))
    for i in range(MESSAGES // 2):
        text = f"{i:04d}" + "x" * (SIZE - 4)
        user = Message(f"msg-{i}", cid, "user", now, {"content": [{"type": "text", "body": text}]})
        await store.add_user_message(user)
        reply = Message(f"as-{i}", cid, "assistant", now, {"text": text, "tokens": {}})
        await store.append(cid, [reply], turn_id=user.id)
    await store.close()
    return cid


async def read_all(port: int, cid: str) -> dict[str, float]:
    """Every page; the worst /health latency while they are read."""
    worst = 0.0
    reading = True

    async def probe() -> None:
        nonlocal worst
        async with common.session() as s:
            while reading:
                t0 = time.perf_counter()
                async with s.get(f"http://{common.HOST}:{port}/health") as r:
                    await r.read()
                worst = max(worst, time.perf_counter() - t0)
                await asyncio.sleep(0.01)

    probing = asyncio.create_task(probe())
    await asyncio.sleep(0.2)
    pages, biggest, after = 0, 0, None
    t0 = time.perf_counter()
    async with common.session() as s:
        while True:
            params = {"limit": "200", **({"after": after} if after else {})}
            url = f"http://{common.HOST}:{port}/agentik/conversations/{cid}/messages"
            async with s.get(url, params=params) as r:
                body = await r.read()
            page = json.loads(body)
            pages += 1
            biggest = max(biggest, len(body))
            if not page["hasMore"]:
                break
            after = page.get("nextAfter") or page["items"][-1]["id"]
    wall = time.perf_counter() - t0
    reading = False
    await probing
    return {
        "pages": pages,
        "wall_ms": wall * 1e3,
        "biggest_mb": biggest / 1e6,
        "health_ms": worst * 1e3,
    }


def stuck_reader(port: int, cid: str) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((common.HOST, port))
    path = f"/agentik/conversations/{cid}/messages?limit=200"
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {common.HOST}\r\n\r\n".encode())
    return sock


async def settled_rss(pid: int, seconds: float = 10.0) -> int:
    """The RSS once it stops falling (or after ``seconds``)."""
    last = common.rss_kib(pid)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        now = common.rss_kib(pid)
        if now >= last - 256:
            return now
        last = now
    return last


async def readers_round(port: int, pid: int, cid: str, close: bool) -> dict[str, float]:
    before = await settled_rss(pid)
    socks = [stuck_reader(port, cid) for _ in range(READERS)]
    await asyncio.sleep(2)
    peak = common.rss_kib(pid)
    if close:
        for sock in socks:
            sock.close()
        await asyncio.sleep(0.5)
    else:
        await asyncio.sleep(WRITE_TIMEOUT + 2)  # dropped by the server
    after = await settled_rss(pid)
    for sock in socks:
        sock.close()
    return {"before_mb": before / 1024, "peak_mb": peak / 1024, "after_mb": after / 1024}


async def main(args: Any) -> dict[str, Any]:
    reps = common.repeats(args, 3, 1)
    fake = common.start_fake()
    rows: list[dict[str, Any]] = []
    raw: dict[str, Any] = {"reads": [], "closed": [], "dropped": []}
    try:
        for _ in range(reps):
            db = str(common.tmpdir() / f"big-{time.monotonic_ns()}.db")
            cid = await build_history(db)
            ag = common.start_agentik(fake.port, db, AGENTIK_WRITE_TIMEOUT=str(WRITE_TIMEOUT))
            try:
                raw["reads"].append(await read_all(ag.port, cid))
                raw["closed"].append(await readers_round(ag.port, ag.pid, cid, close=True))
                raw["dropped"].append(await readers_round(ag.port, ag.pid, cid, close=False))
            finally:
                ag.stop()
    finally:
        fake.stop()
    reads = {k: stats([r[k] for r in raw["reads"]]) for k in raw["reads"][0]}
    rows.append(
        row("pages for 100 x 1 MB (limit=200)", reads["pages"], unit="pages", target="(info)")
    )
    rows.append(row("largest page", reads["biggest_mb"], unit="MB", target="≈ 4 MiB budget"))
    rows.append(row("read the whole history", reads["wall_ms"], unit="ms", target="(info)"))
    rows.append(
        row(
            "worst /health answer while it is read",
            reads["health_ms"],
            unit="ms",
            target="(info: the loop stalls at most one page's encoding)",
        )
    )
    for kind, label in (
        ("closed", "closed their connections"),
        ("dropped", "dropped by the write timeout"),
    ):
        r = raw[kind]
        before = stats([x["before_mb"] for x in r])
        peak = stats([x["peak_mb"] for x in r])
        after = stats([x["after_mb"] for x in r])
        ratio = after["median"] / before["median"]
        rows.append(
            row(f"RSS with {READERS} clients not reading", peak, before, unit="MB", target="(info)")
        )
        rows.append(
            row(
                f"RSS after the {READERS} readers {label} (vs before them)",
                after,
                before,
                unit="MB",
                target="≤ 1.10x",
                met=ratio <= 1.10,
            )
        )
    return {
        "id": "B25",
        "title": "big history pages, clients that do not read",
        "rows": rows,
        "notes": [
            f"{reps} repeats, a fresh server and database each; "
            f"AGENTIK_WRITE_TIMEOUT={WRITE_TIMEOUT:g}"
        ],
        "raw": raw,
    }


if __name__ == "__main__":
    common.cli(main)
