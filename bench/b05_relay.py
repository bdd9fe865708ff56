"""B5: per-token relay cost at 1 / 10 / 100 concurrent streams, ``agentik serve`` vs the minimal
aiohttp relay (bench/floors/relay.py), both reading the same fake LLM as fast as it sends.

Server CPU per token is a slope, so a turn's fixed cost (requests, database) drops out:
(CPU of C concurrent turns of T tokens - CPU of C concurrent 1-token turns) / (C x (T - 1)).
agentik's conversations and SSE streams are opened before the measured window; the relay's one
request per stream is inside both windows and cancels out.

Coalesced rows: the same against ``agentik serve`` with ``AGENTIK_SSE_COALESCE_MS=20`` and the
relay with ``--coalesce-ms 20`` (frames that arrive within 20 ms go out in one write).
"""

from __future__ import annotations

import asyncio
from typing import Any

import common
from common import CpuMeter, RawSSE, TurnClient, row, spec_text, stats

PLAN = {1: 1000, 10: 300, 100: 150}  # concurrent streams -> tokens per stream
COALESCE_MS = 20


async def agentik_window(c: TurnClient, pid: int, conc: int, tokens: int) -> int:
    cids = await asyncio.gather(*(c.new_conversation() for _ in range(conc)))
    streams = await asyncio.gather(*(c.open_events(cid) for cid in cids))
    text = spec_text(tokens)
    try:
        with CpuMeter(pid) as m:
            reads = [asyncio.ensure_future(s.read_turn()) for s in streams]
            await asyncio.gather(*(c.post(cid, text) for cid in cids))
            got = await asyncio.wait_for(asyncio.gather(*reads), 120)
    finally:
        for s in streams:
            s.close()
    assert all(g[0] == tokens for g in got), [g[0] for g in got][:5]
    return m.ns


async def relay_window(port: int, pid: int, conc: int, tokens: int) -> int:
    path = "/relay?text=" + spec_text(tokens).replace(" ", "%20")

    async def one() -> int:
        s = await RawSSE.open(port, path)
        try:
            return (await s.read_turn())[0]
        finally:
            s.close()

    with CpuMeter(pid) as m:
        got = await asyncio.wait_for(asyncio.gather(*(one() for _ in range(conc))), 120)
    assert all(g == tokens for g in got), got[:5]
    return m.ns


async def slopes(
    c: TurnClient, agentik: common.Proc, relay: common.Proc, reps: int
) -> dict[int, dict[str, dict[str, float]]]:
    """Per-token CPU slopes of agentik and the relay at each concurrency, alternating."""
    out: dict[int, dict[str, dict[str, float]]] = {}
    await agentik_window(c, agentik.pid, 5, 50)  # warm-up
    await relay_window(relay.port, relay.pid, 5, 50)
    for conc, tokens in PLAN.items():
        pa: list[float] = []
        pf: list[float] = []
        for _ in range(reps):
            big = await agentik_window(c, agentik.pid, conc, tokens)
            small = await agentik_window(c, agentik.pid, conc, 1)
            pa.append((big - small) / (conc * (tokens - 1)) / 1e3)
            big = await relay_window(relay.port, relay.pid, conc, tokens)
            small = await relay_window(relay.port, relay.pid, conc, 1)
            pf.append((big - small) / (conc * (tokens - 1)) / 1e3)
        out[conc] = {"agentik": stats(pa), "floor": stats(pf)}
    return out


async def main(args: Any) -> dict[str, Any]:
    reps = common.repeats(args, 5, 2)
    fake = common.start_fake()
    up = f"http://{common.HOST}:{fake.port}/v1"
    rows: list[dict[str, Any]] = []
    raw: dict[str, Any] = {}
    agentik = relay = None
    try:
        async with common.session() as s:
            for coalesce in (0, COALESCE_MS):
                if coalesce:
                    agentik = common.start_agentik(fake.port, AGENTIK_SSE_COALESCE_MS=str(coalesce))
                    relay = common.start_floor(
                        "relay.py", "--upstream", up, "--coalesce-ms", str(coalesce)
                    )
                else:
                    agentik = common.start_agentik(fake.port)
                    relay = common.start_floor("relay.py", "--upstream", up)
                res = await slopes(TurnClient(agentik.port, s), agentik, relay, reps)
                common.stop_all(agentik, relay)
                agentik = relay = None
                for conc, r in res.items():
                    a, f = r["agentik"], r["floor"]
                    raw[f"{conc}{'_coalesced' if coalesce else ''}"] = r
                    tokens = PLAN[conc]
                    if coalesce:
                        rows.append(
                            row(
                                f"with {coalesce} ms coalescing: server CPU per token, {conc} "
                                f"stream(s) x {tokens} tokens (floor: relay, same coalescing)",
                                a,
                                f,
                                unit="µs",
                                target="≤ 5 µs/token",
                                met=a["median"] <= 5,
                            )
                        )
                    else:
                        rows.append(
                            row(
                                f"server CPU per token, {conc} concurrent stream(s) x {tokens} "
                                "tokens",
                                a,
                                f,
                                unit="µs",
                                target="≤ 1.3x and ≤ 16 µs",
                                met=a["median"] / f["median"] <= 1.3 and a["median"] <= 16,
                            )
                        )
    finally:
        common.stop_all(agentik, relay, fake)
    notes = [
        f"{reps} alternating repeats per concurrency; each repeat is one big and one "
        "1-token window per server; stats are over the per-repeat slopes",
        f"coalesced rows: agentik with AGENTIK_SSE_COALESCE_MS={COALESCE_MS}, relay with "
        f"--coalesce-ms {COALESCE_MS}; the fake sends as fast as it can, so a 20 ms window "
        "holds many deltas",
    ]
    return {"id": "B5", "title": "per-token relay cost", "rows": rows, "notes": notes, "raw": raw}


if __name__ == "__main__":
    common.cli(main)
