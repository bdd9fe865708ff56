"""B6: time to first token added by agentik, idle and at ~50% load.

agentik TTFT: from sending POST …/messages (conversation and SSE stream opened before) to the
first ``event: AppendText`` byte. Direct TTFT: from sending the chat request to the fake to the
first content chunk, with the raw aiohttp + json.loads client. Samples alternate. Under load,
``n`` clients stream turns at 50 tok/s through agentik, ``n`` calibrated so the server process
uses ~50% of one core; the direct samples are taken during the same load (the fake is shared).
No memory plugin is installed, so there is no prefetch to include.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import common
from common import TurnClient, row, spec_text, stats
from load import calibrated_load, measure_util
from upstream import stream_deltas


async def direct_ttft(session: Any, base_url: str) -> float:
    t0 = time.perf_counter()
    agen = stream_deltas(session, base_url, spec_text(20))
    async for _ in agen:
        t = time.perf_counter()
        break
    async for _ in agen:  # drain, so the connection is reused
        pass
    return (t - t0) * 1e3


async def agentik_ttft(c: TurnClient) -> float:
    return (await c.turn(spec_text(20)))["ttft_ms"]


async def sample(c: TurnClient, s: Any, up: str, n: int) -> tuple[list[float], list[float]]:
    a: list[float] = []
    d: list[float] = []
    for _ in range(n):
        a.append(await agentik_ttft(c))
        d.append(await direct_ttft(s, up))
    return a, d


async def main(args: Any) -> dict[str, Any]:
    n = 30 if args.quick else 150
    fake = common.start_fake()
    agentik = common.start_agentik(fake.port)
    up = f"http://{common.HOST}:{fake.port}/v1"
    rows: list[dict[str, Any]] = []
    raw: dict[str, Any] = {}
    notes: list[str] = []
    try:
        async with common.session() as s:
            c = TurnClient(agentik.port, s)
            await sample(c, s, up, 5)  # warm-up
            a, d = await sample(c, s, up, n)
            load, util = await calibrated_load("agentik", agentik.port, agentik.pid, s, 0.5)
            util_during = measure_util(agentik.pid, 5.0)
            util_task = asyncio.ensure_future(util_during)
            la, ld = await sample(c, s, up, n // 2)
            util2 = await util_task
            await load.stop()
            notes.append(
                f"load: {load.n} clients streaming at 50 tok/s; agentik server CPU "
                f"{util * 100:.0f}% of a core at calibration, {util2 * 100:.0f}% "
                f"while sampling; {load.errors} load errors"
            )
    finally:
        common.stop_all(agentik, fake)
    for name, (xa, xd) in {"idle": (a, d), "~50% load": (la, ld)}.items():
        sa, sd = stats(xa), stats(xd)
        raw[name] = {"agentik": sa, "direct": sd}
        add50 = sa["median"] - sd["median"]
        add99 = sa["p99"] - sd["p99"]
        rows.append(
            row(
                f"TTFT p50, {name}",
                sa,
                sd,
                unit="ms",
                target="≤ 2 ms added",
                met=add50 <= 2,
                note=f"added {add50:.2f} ms",
            )
        )
        rows.append(
            row(
                f"TTFT p99, {name}",
                sa["p99"],
                sd["p99"],
                unit="ms",
                target="≤ 10 ms added",
                met=add99 <= 10,
                note=f"added {add99:.2f} ms",
            )
        )
    notes.append(f"{n} idle and {n // 2} loaded samples per side, alternating")
    return {"id": "B6", "title": "TTFT added", "rows": rows, "notes": notes, "raw": raw}


if __name__ == "__main__":
    common.cli(main)
