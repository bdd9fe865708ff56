"""B8: idle SSE streams and broadcast.

Part 1, memory: RSS of the server process before and after opening N idle SSE streams (agentik:
the agent-level ``GET /agentik/events``; and N conversations each with its own
``GET …/{id}/events``), vs the bare StreamResponse of bench/floors/bare_app.py (``GET /stream``).
Each repeat starts fresh servers. N = 2,000 (10k would need ~40k sockets on this 2-CPU machine in
one run); the 10k figure is extrapolated per stream: RSS at rest + 10,000 x KiB per stream.

Part 2, broadcast: K subscribers of one conversation, one turn of T tokens; server CPU per
delivered frame = (CPU with K subscribers - CPU with 1) / ((K - 1) x T), so the LLM read is not
counted. Floor: bare_app's /broadcast writes T frames to K bare StreamResponses, one write per
frame and stream, same slope. Two paces: tokens 2 ms apart (each frame its own write in agentik
too: the target row), and as fast as the fake sends (agentik writes what piled up for a
subscriber in one write, so a burst costs it far less per frame than the floor).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import common
from common import CpuMeter, RawSSE, TurnClient, row, spec_text, stats

N = 2000
CLOSED_AFTER = 3.0  # s after the streams closed when RSS is read again
K, T = 100, 200
PACE = 0.002  # s between tokens in the paced broadcast


async def open_many(port: int, paths: list[str]) -> list[RawSSE]:
    sem = asyncio.Semaphore(100)

    async def one(path: str) -> RawSSE:
        async with sem:
            return await RawSSE.open(port, path)

    return await asyncio.gather(*(one(p) for p in paths))


async def settle_rss(pid: int) -> int:
    await asyncio.sleep(0.5)
    return common.rss_kib(pid)


async def memory_round(fake_port: int, s: Any, n: int) -> dict[str, float]:
    out: dict[str, float] = {}
    cap = {"AGENTIK_MAX_CONNECTIONS": str(n + 100)}  # the default cap is 1,000
    # agentik, agent-level streams
    ag = common.start_agentik(fake_port, **cap)
    try:
        base = await settle_rss(ag.pid)
        out["agentik_base_kib"] = base
        streams = await open_many(ag.port, ["/agentik/events"] * n)
        out["agentik_stream_kib"] = (await settle_rss(ag.pid) - base) / n
        for st in streams:
            st.close()
        await asyncio.sleep(CLOSED_AFTER)
        out["agentik_closed_ratio"] = common.rss_kib(ag.pid) / base
    finally:
        ag.stop()
    # conversations with one stream each (what N chat windows cost), on a fresh server
    ag = common.start_agentik(fake_port, **cap)
    try:
        c = TurnClient(ag.port, s)
        before = await settle_rss(ag.pid)
        sem = asyncio.Semaphore(50)

        async def conv() -> str:
            async with sem:
                return await c.new_conversation()

        t0 = time.perf_counter()
        cids = await asyncio.gather(*(conv() for _ in range(n // 2)))
        out["create_ms"] = (time.perf_counter() - t0) * 1e3 / (n // 2)
        streams = await open_many(ag.port, [f"/agentik/conversations/{i}/events" for i in cids])
        out["agentik_conv_kib"] = (await settle_rss(ag.pid) - before) / (n // 2)
        for st in streams:
            st.close()
    finally:
        ag.stop()
    bare = common.start_floor("bare_app.py")
    try:
        base = await settle_rss(bare.pid)
        out["bare_base_kib"] = base
        streams = await open_many(bare.port, ["/stream"] * n)
        out["bare_stream_kib"] = (await settle_rss(bare.pid) - base) / n
        for st in streams:
            st.close()
    finally:
        bare.stop()
    return out


async def agentik_broadcast(c: TurnClient, pid: int, k: int, pace: float = 0.0) -> int:
    cid = await c.new_conversation()
    subs = await asyncio.gather(*(c.open_events(cid) for _ in range(k)))
    try:
        with CpuMeter(pid) as m:
            reads = [asyncio.ensure_future(x.read_turn()) for x in subs]
            await c.post(cid, spec_text(T, delay=pace))
            got = await asyncio.wait_for(asyncio.gather(*reads), 60)
    finally:
        for x in subs:
            x.close()
    assert all(g[0] == T for g in got)
    return m.ns


async def bare_broadcast(s: Any, port: int, pid: int, k: int, pace: float = 0.0) -> int:
    subs = await open_many(port, ["/stream"] * k)
    await asyncio.sleep(0.05)
    try:
        with CpuMeter(pid) as m:
            reads = [asyncio.ensure_future(x.read_turn()) for x in subs]
            url = f"http://{common.HOST}:{port}/broadcast?n={T}&delay={pace}"
            async with s.post(url) as r:
                assert (await r.json())["streams"] == k
            got = await asyncio.wait_for(asyncio.gather(*reads), 60)
    finally:
        for x in subs:
            x.close()
    assert all(g[0] == T for g in got)
    return m.ns


async def main(args: Any) -> dict[str, Any]:
    reps = common.repeats(args, 5, 1)
    n = getattr(args, "n", None) or (500 if args.quick else N)
    fake = common.start_fake()
    rows: list[dict[str, Any]] = []
    raw: dict[str, Any] = {}
    try:
        async with common.session() as s:
            mem = [await memory_round(fake.port, s, n) for _ in range(reps)]
            m = {k: stats([r[k] for r in mem]) for k in mem[0]}
            raw["memory"] = m
            a, f = m["agentik_stream_kib"], m["bare_stream_kib"]
            rows.append(
                row(
                    f"RSS per idle SSE stream (/agentik/events, {n} streams)",
                    a,
                    f,
                    unit="KiB",
                    target="(10k ≤ 150 MB)",
                )
            )
            proj = (m["agentik_base_kib"]["median"] + 10_000 * a["median"]) / 1024
            projf = (m["bare_base_kib"]["median"] + 10_000 * f["median"]) / 1024
            rows.append(
                row(
                    "projected server RSS with 10k idle streams (base + 10k x per stream)",
                    proj,
                    projf,
                    unit="MB",
                    target="≤ 150 MB",
                    met=proj <= 150,
                )
            )
            ac = m["agentik_conv_kib"]
            rows.append(
                row(
                    f"RSS per conversation + its SSE stream ({n // 2} conversations)",
                    ac,
                    f,
                    unit="KiB",
                    target="(info)",
                )
            )
            projc = (m["agentik_base_kib"]["median"] + 10_000 * ac["median"]) / 1024
            rows.append(
                row(
                    "projected RSS with 10k conversations each with an idle stream",
                    projc,
                    projf,
                    unit="MB",
                    target="≤ 150 MB",
                    met=projc <= 150,
                )
            )
            closed = m["agentik_closed_ratio"]
            rows.append(
                row(
                    f"RSS {CLOSED_AFTER:g} s after the {n} streams closed, vs at rest",
                    closed,
                    unit="x",
                    target="≤ 1.20x",
                    met=closed["median"] <= 1.20,
                )
            )
            rows.append(
                row(
                    "server RSS at rest (after start)",
                    m["agentik_base_kib"]["median"] / 1024,
                    m["bare_base_kib"]["median"] / 1024,
                    unit="MB",
                    target="(info)",
                )
            )
            if getattr(args, "memory_only", False):
                return {"id": "B8", "title": "idle SSE streams", "rows": rows, "raw": raw}
            # part 2: broadcast
            ag = common.start_agentik(fake.port)
            bare = common.start_floor("bare_app.py")
            try:
                c = TurnClient(ag.port, s)
                await agentik_broadcast(c, ag.pid, 10)
                await bare_broadcast(s, bare.port, bare.pid, 10)
                per: dict[float, dict[str, list[float]]] = {}
                for pace in (PACE, 0.0):
                    pa: list[float] = []
                    pf: list[float] = []
                    for _ in range(common.repeats(args, 5, 2)):
                        big = await agentik_broadcast(c, ag.pid, K, pace)
                        one = await agentik_broadcast(c, ag.pid, 1, pace)
                        pa.append((big - one) / ((K - 1) * T) / 1e3)
                        big = await bare_broadcast(s, bare.port, bare.pid, K, pace)
                        one = await bare_broadcast(s, bare.port, bare.pid, 1, pace)
                        pf.append((big - one) / ((K - 1) * T) / 1e3)
                    per[pace] = {"agentik": pa, "bare": pf}
            finally:
                common.stop_all(ag, bare)
            for pace, label, target in (
                (PACE, f"tokens {PACE * 1e3:g} ms apart", "≤ 1.5x"),
                (0.0, "a burst (the fake's full speed)", "(info)"),
            ):
                sa, sf = stats(per[pace]["agentik"]), stats(per[pace]["bare"])
                raw[f"broadcast_{pace}"] = {"agentik": sa, "bare": sf}
                rows.append(
                    row(
                        f"server CPU per delivered frame, {K} subscribers x {T} tokens, {label}",
                        sa,
                        sf,
                        unit="µs",
                        target=target,
                        met=sa["median"] / sf["median"] <= 1.5 if pace else None,
                    )
                )
            rows.append(
                row(
                    "heartbeat tasks for N idle streams",
                    1,
                    0,
                    unit="tasks",
                    target="one shared heartbeat",
                    met=True,
                    note="by code: plugins/transport_http/sse.py StreamHub._beat, one task "
                    "per app (not measured)",
                )
            )
    finally:
        fake.stop()
    notes = [
        f"memory: {reps} repeats, fresh servers each; RSS read 0.5 s after the streams opened",
        f"broadcast: {common.repeats(args, 5, 2)} alternating repeats",
        f"creating a conversation over HTTP while up to {n // 2} exist: "
        f"{m['create_ms']['median']:.2f} ms wall each (50 in flight)",
    ]
    return {
        "id": "B8",
        "title": "idle SSE streams, broadcast",
        "rows": rows,
        "notes": notes,
        "raw": raw,
    }


def add_args(p: Any) -> None:
    p.add_argument("--memory-only", action="store_true", help="part 1 only")
    p.add_argument(
        "--n",
        type=int,
        help=f"idle streams (default {N}; 10000 needs a hard ulimit -n past 10,100)",
    )


if __name__ == "__main__":
    common.cli(main, add_args)
