"""B7: concurrent streaming turns.

Part 1: how many streams at 50 tok/s one server process carries with inter-token p99 < 100 ms,
agentik vs the minimal relay (bench/floors/relay.py). Step the number of streams (doubling, then
one bisection), each step: ramp 1 s, measure 3 s; a step passes when the p99 of the inter-token
gaps in the window is < 100 ms and ≥ 90% of the expected tokens arrived (a step of the doubling
that fails is tried once more before the search stops). The load client and the fake LLM share
the machine's 2 CPUs with the server, so the step where the *machine* runs out is also reported,
with the server's CPU use and a per-core projection (streams / server CPU). The same search runs
against a second agentik with ``AGENTIK_SSE_COALESCE_MS=20``.

Part 2: 20 simultaneous 200-chunk, 600-character turns (each a new conversation: create + SSE +
POST -> End) vs the openai client making 20 simultaneous streaming calls to the fake directly
(and vs the raw aiohttp client): wall time until the last turn ends.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import common
from common import CpuMeter, TurnClient, row, spec_text, stats
from load import StreamLoad
from upstream import stream_deltas

STEPS = [25, 50, 100, 200, 400, 800, 1600]
WINDOW = 3.0
COALESCE_MS = 20


async def step(kind: str, proc: common.Proc, session: Any, n: int) -> dict[str, Any]:
    tokens = int((1.0 + 0.5 + WINDOW + 1.0) / 0.02)  # every stream stays in one turn
    load = StreamLoad(kind, proc.port, session, n, tokens=tokens, ramp=1.0)
    t_setup = time.perf_counter()
    await load.start()
    setup_s = time.perf_counter() - t_setup
    await asyncio.sleep(load.ramp + 0.5)
    t0 = time.perf_counter()
    with CpuMeter(proc.pid) as m:
        await asyncio.sleep(WINDOW)
    t1 = time.perf_counter()
    await load.stop()
    gaps = load.gaps_ms(t0, t1)
    got = load.tokens_between(t0, t1)
    expected = n * WINDOW / 0.02
    st = stats(gaps)
    ok = bool(gaps) and st["p99"] < 100 and got >= 0.9 * expected and load.errors == 0
    return {
        "n": n,
        "ok": ok,
        "p50": st.get("median"),
        "p99": st.get("p99"),
        "max": st.get("max"),
        "delivered": got / expected if expected else 0,
        "util": m.util,
        "errors": load.errors,
        "setup_s": setup_s,
    }


async def find_max(kind: str, proc: common.Proc, session: Any, quick: bool) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    best: dict[str, Any] | None = None
    fail: dict[str, Any] | None = None
    for n in STEPS[: 4 if quick else len(STEPS)]:
        r = await step(kind, proc, session, n)
        steps.append(r)
        if not r["ok"]:  # once more: on this shared VM one noisy window can fail a step
            r = await step(kind, proc, session, n)
            steps.append(r)
        if not r["ok"]:
            fail = r
            break
        best = r
    if best is not None and fail is not None and not quick:
        mid = (best["n"] + fail["n"]) // 2
        r = await step(kind, proc, session, mid)
        steps.append(r)
        if r["ok"]:
            best = r
    return {"best": best, "fail": fail, "steps": steps}


async def burst_agentik(c: TurnClient, text: str) -> float:
    t0 = time.perf_counter()
    await asyncio.gather(*(c.turn(text) for _ in range(20)))
    return (time.perf_counter() - t0) * 1e3


async def burst_sdk(oai: Any, text: str) -> float:
    async def one() -> None:
        stream = await oai.chat.completions.create(
            model="fake-model",
            stream=True,
            messages=[
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": text},
            ],
        )
        async for _ in stream:
            pass

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(20)))
    return (time.perf_counter() - t0) * 1e3


async def burst_raw(session: Any, up: str, text: str) -> float:
    async def one() -> None:
        async for _ in stream_deltas(session, up, text):
            pass

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(20)))
    return (time.perf_counter() - t0) * 1e3


def describe(r: dict[str, Any] | None) -> str:
    if r is None:
        return "none"
    return (
        f"{r['n']} streams: gap p50 {r['p50']:.1f} / p99 {r['p99']:.1f} / max "
        f"{r['max']:.0f} ms, {r['delivered'] * 100:.0f}% delivered, server CPU "
        f"{r['util'] * 100:.0f}%, {r['errors']} errors"
    )


async def main(args: Any) -> dict[str, Any]:
    import openai

    fake = common.start_fake()
    agentik = common.start_agentik(fake.port)
    relay = common.start_floor("relay.py", "--upstream", f"http://{common.HOST}:{fake.port}/v1")
    coalescing: common.Proc | None = None
    up = f"http://{common.HOST}:{fake.port}/v1"
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    raw: dict[str, Any] = {}
    try:
        async with common.session() as s:
            ra = await find_max("agentik", agentik, s, args.quick)
            rf = await find_max("relay", relay, s, args.quick)
            coalescing = common.start_agentik(fake.port, AGENTIK_SSE_COALESCE_MS=str(COALESCE_MS))
            rc = await find_max("agentik", coalescing, s, args.quick)
            common.stop_all(coalescing)
            coalescing = None
            raw["agentik"], raw["relay"], raw["agentik_coalesced"] = ra, rf, rc
            for name, r in (
                ("agentik", ra),
                ("minimal relay", rf),
                (f"agentik, {COALESCE_MS} ms coalescing", rc),
            ):
                notes.append(
                    f"{name}: best {describe(r['best'])}; first failing {describe(r['fail'])}"
                )
            ba, bf, bc = ra["best"], rf["best"], rc["best"]

            def proj(r: dict[str, Any] | None) -> float | None:
                return r["n"] / r["util"] if r and r["util"] > 0 else None

            rows.append(
                row(
                    "max streams at 50 tok/s with gap p99 < 100 ms, this machine "
                    "(client + fake on the same 2 CPUs)",
                    ba["n"] if ba else 0,
                    bf["n"] if bf else None,
                    unit="streams",
                    target="≥ 1,000 on one core",
                    met=bool(ba and ba["n"] >= 1000),
                )
            )
            pa, pf = proj(ba), proj(bf)
            rows.append(
                row(
                    "projected streams per fully used server core (max / server CPU)",
                    pa,
                    pf,
                    unit="streams",
                    target="≥ 1,000",
                    met=bool(pa and pa >= 1000),
                    note="linear extrapolation: assumes the server alone on a core",
                )
            )
            rows.append(
                row(
                    f"with {COALESCE_MS} ms coalescing: max streams, this machine (floor: "
                    "relay without coalescing)",
                    bc["n"] if bc else 0,
                    bf["n"] if bf else None,
                    unit="streams",
                    target="(info; machine-bound)",
                )
            )
            pc = proj(bc)
            rows.append(
                row(
                    f"with {COALESCE_MS} ms coalescing: projected streams per server core",
                    pc,
                    pf,
                    unit="streams",
                    target="≥ 2,000 with coalescing",
                    met=bool(pc and pc >= 2000),
                    note="linear extrapolation, as above",
                )
            )
            # part 2: 20 simultaneous 200-chunk turns
            c = TurnClient(agentik.port, s)
            oai = openai.AsyncOpenAI(base_url=up, api_key="sk-bench", max_retries=0)
            text = spec_text(200, 600)
            await burst_agentik(c, text)
            await burst_sdk(oai, text)
            await burst_raw(s, up, text)
            wa: list[float] = []
            wd: list[float] = []
            wr: list[float] = []
            for _ in range(common.repeats(args, 7, 2)):
                wa.append(await burst_agentik(c, text))
                wd.append(await burst_sdk(oai, text))
                wr.append(await burst_raw(s, up, text))
            await oai.close()
            sa, sd, sr = stats(wa), stats(wd), stats(wr)
            raw["burst"] = {"agentik": sa, "sdk": sd, "raw": sr}
            rows.append(
                row(
                    "20 simultaneous 200-chunk turns, wall vs openai client direct",
                    sa,
                    sd,
                    unit="ms",
                    target="≤ 1.5x",
                    met=sa["median"] / sd["median"] <= 1.5,
                )
            )
            rows.append(
                row(
                    "20 simultaneous 200-chunk turns, wall vs raw aiohttp client direct",
                    sa,
                    sr,
                    unit="ms",
                    target="(info)",
                )
            )
    finally:
        common.stop_all(agentik, relay, coalescing, fake)
    notes.append(
        f"steps {STEPS}, doubling until a step fails twice, then one bisection; window "
        f"{WINDOW:g} s after a 1 s ramp; part 2: alternating repeats"
    )
    return {
        "id": "B7",
        "title": "concurrent streaming turns",
        "rows": rows,
        "notes": notes,
        "raw": raw,
    }


if __name__ == "__main__":
    common.cli(main)
