"""B27: what turns waiting for approval cost at rest (issue 25: 1,000 of them add <= 5 MB RSS).

Two ``agentik serve`` processes side by side, the same settings (``AGENTIK_TOOL_APPROVAL=all``),
each given N conversations with one turn: on the *idle* server a plain turn (a reply, done), on
the *waiting* server a turn whose model calls a tool (``bench call=write_file``), which the
policy holds: the turn is ``waiting`` for a person's approval, durably, with no task. Each turn
is read to its end (``End``) or its wait (``Waiting``) on the conversation's SSE stream, whose
reader then leaves. Conversations beyond ``AGENTIK_LIVE_CONVERSATIONS`` (256) that hold no task
or reader are dropped from memory, waiting ones too (their turn is a row of the turn table);
``--live 2000`` keeps them all, the worst case. RSS of both servers is read after they settle;
the cost of the waiting turns is each server's growth over its own RSS at rest, waiting minus
idle. A last check answers a few of the approvals: the turns go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import aiohttp
import common
from common import HOST, row, stats

N = 1000
SETTLE = 3.0  # s before RSS is read
TARGET_MB = 5.0  # for 1,000 waiting conversations, over the idle ones


async def one_turn(s: aiohttp.ClientSession, port: int, text: str, until: str) -> str:
    """A new conversation, one message, its stream read until ``until``; the conversation id."""
    base = f"http://{HOST}:{port}/agentik/conversations"
    async with s.post(base) as r:
        assert r.status == 201, await r.text()
        cid = str((await r.json())["id"])
    async with s.get(f"{base}/{cid}/events") as events:
        assert events.status == 200
        body = [{"type": "text", "body": text}]
        async with s.post(f"{base}/{cid}/messages", json=body) as r:
            assert r.status == 202, await r.text()
        async for raw in events.content:
            line = raw.decode().strip()
            if line == f"event: {until}":
                break
            if line in ("event: Error", "event: End") and line != f"event: {until}":
                raise AssertionError(f"{cid}: {line} before {until}")
    return cid


async def fill(port: int, n: int, text: str, until: str) -> list[str]:
    async with common.session(limit=32) as s:
        return await common.gather_limited(n, 16, lambda _: one_turn(s, port, text, until))


async def settle_rss(pid: int) -> int:
    await asyncio.sleep(SETTLE)
    return min(common.rss_kib(pid) for _ in range(3))


def db_kib(path: Path) -> int:
    """The size of a database's pages (its WAL's included), in KiB."""
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        size = db.execute("PRAGMA page_size").fetchone()[0]
    return int(pages * size // 1024)


async def approve_some(port: int, cids: list[str]) -> int:
    """Approve the first call of a few waiting conversations; how many turns then ended."""
    ended = 0
    async with common.session() as s:
        for cid in cids:
            base = f"http://{HOST}:{port}/agentik/conversations/{cid}"
            async with s.get(f"{base}/approvals") as r:
                (item,) = (await r.json())["items"]
            async with s.post(f"{base}/approvals/{item['callId']}", json={"approve": True}) as r:
                assert r.status == 200, await r.text()
            for _ in range(200):
                async with s.get(f"{base}/messages") as r:
                    kinds = [m["type"] for m in (await r.json())["items"]]
                if kinds[-1] == "assistant":
                    ended += 1
                    break
                await asyncio.sleep(0.05)
    return ended


async def round_(fake_port: int, n: int, live: int) -> dict[str, float]:
    env = {"AGENTIK_TOOL_APPROVAL": "all", "AGENTIK_MAX_CONNECTIONS": str(n + 100)}
    if live:
        env["AGENTIK_LIVE_CONVERSATIONS"] = str(live)
    dbs = common.tmpdir()
    idle_db, waiting_db = dbs / "idle.db", dbs / "waiting.db"
    idle = common.start_agentik(fake_port, str(idle_db), **env)
    waiting = common.start_agentik(fake_port, str(waiting_db), **env)
    try:
        out: dict[str, float] = {
            "idle_rest_kib": await settle_rss(idle.pid),
            "waiting_rest_kib": await settle_rss(waiting.pid),
        }
        await fill(idle.port, n, "hello", "End")
        cids = await fill(waiting.port, n, "bench call=write_file", "Waiting")
        out["idle_kib"] = await settle_rss(idle.pid)
        out["waiting_kib"] = await settle_rss(waiting.pid)
        # the database each server wrote (its page cache, up to 16 MB, holds what it touched)
        out["idle_db_kib"] = db_kib(idle_db)
        out["waiting_db_kib"] = db_kib(waiting_db)
        out["threads_idle"] = common.thread_count(idle.pid)
        out["threads_waiting"] = common.thread_count(waiting.pid)
        async with common.session() as s:
            url = f"http://{HOST}:{waiting.port}/agentik/conversations/{cids[0]}/approvals"
            async with s.get(url) as r:
                out["pending_first"] = len((await r.json())["items"])
        out["approved_and_ended"] = await approve_some(waiting.port, cids[:5])
        return out
    finally:
        common.stop_all(idle, waiting)


async def main(args: Any) -> dict[str, Any]:
    n = args.n
    runs = args.runs or common.repeats(args, full=3, quick=1)
    fake = common.start_fake()
    try:
        rounds = [await round_(fake.port, n, args.live) for _ in range(runs)]
    finally:
        common.stop_all(fake)
    added = [(r["waiting_kib"] - r["idle_kib"]) / 1024 for r in rounds]
    # each server's own growth over its rest, so a difference at rest does not count
    grown = [
        ((r["waiting_kib"] - r["waiting_rest_kib"]) - (r["idle_kib"] - r["idle_rest_kib"])) / 1024
        for r in rounds
    ]
    per_1000 = [g * 1000 / n for g in grown]
    assert all(r["pending_first"] == 1 for r in rounds), "a turn did not wait"
    assert all(r["approved_and_ended"] == 5 for r in rounds), "an approved turn did not end"
    worst = max(per_1000)
    return {
        "n": n,
        "live_conversations": args.live or "default (256)",
        "rounds": rounds,
        "rows": [
            row(
                f"RSS, {n} conversations with a turn waiting for approval, over {n} idle ones "
                "(each server's growth over its own rest)",
                stats(grown),
                unit="MB",
                target=f"<= {TARGET_MB:g} MB per 1,000",
                met=worst <= TARGET_MB,
                note=f"per 1,000: {json.dumps([round(x, 2) for x in per_1000])}; raw RSS "
                f"difference {json.dumps([round(x, 2) for x in added])} MB",
            ),
            row(
                "RSS of the server with the idle conversations",
                stats(r["idle_kib"] / 1024 for r in rounds),
                unit="MB",
            ),
            row(
                "RSS of the server with the waiting conversations",
                stats(r["waiting_kib"] / 1024 for r in rounds),
                unit="MB",
            ),
        ],
    }


def add_args(parser: Any) -> None:
    parser.add_argument("--n", type=int, default=N, help="conversations per server")
    parser.add_argument("--runs", type=int, default=0, help="rounds (fresh servers each)")
    parser.add_argument(
        "--live",
        type=int,
        default=0,
        help="AGENTIK_LIVE_CONVERSATIONS of both servers (default: the server's, 256); above N, "
        "no conversation is dropped from memory",
    )


if __name__ == "__main__":
    common.cli(main, add_args)
