"""Two checkouts side by side: B3's in-process turn, B13's in-process tool loop and B4's HTTP
turn (server CPU, wall, time to 202), each a short sample, alternating ABBA (issue 24's check).

    python bench/tools/ab_turns.py pairs BEFORE AFTER OUT --pairs 8   # then the table:
    python bench/tools/ab_turns.py ratios OUT

BEFORE and AFTER are checkouts with their own ``.venv`` (``make install``); each sample runs
``<tree>/.venv/bin/python bench/tools/ab_turns.py sample <tree> <json>`` with the tree's own
bench helpers and agentik. The ratio of a metric is the median of the pairs' after/before.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def med(v: list[float]) -> float:
    return statistics.median(v) if v else float("nan")


# --- one sample, run by a tree's own python ---------------------------------------------------


async def b3(res: dict[str, Any]) -> None:
    """B3: ``send`` + ``wait_idle`` on a file DB, 3 x 80 turns; B3's fair floor alternates."""
    import common
    from inproc import agentik_turns, floor_turns, open_agent
    from inproc_loop import Loop

    tmp = common.tmpdir()
    agent = await open_agent(str(tmp / f"ab3-{os.getpid()}.db"))
    floor = Loop(str(tmp / f"ab3-fair-{os.getpid()}.db"))
    await agentik_turns(await agent.create_conversation(), 20, [], [])
    await floor_turns(floor, await floor.new_conversation(), 20, [], [])
    s: dict[str, list[float]] = {"cpu": [], "wall": [], "floor_cpu": [], "floor_wall": []}
    for _ in range(3):
        await agentik_turns(await agent.create_conversation(), 80, s["cpu"], s["wall"])
        await floor_turns(
            floor, await floor.new_conversation(), 80, s["floor_cpu"], s["floor_wall"]
        )
    await agent.close()
    floor.close()
    res["b3"] = {k: med(v) for k, v in s.items()}


async def b13(res: dict[str, Any]) -> None:
    """B13 part 1 on a file DB, agentik's side: µs per turn and per hop, 2 repeats."""
    import b13_tool_loop as b
    import common

    # issue 23 ends a turn after 20 tool rounds (the default): "1 100" runs its 100 steps only
    # with the limit raised (a checkout without the setting ignores it)
    path = str(common.tmpdir() / f"ab13-{os.getpid()}.db")
    agent, _, _ = await b.open_agent(path, b.LoopLLM(), AGENTIK_MAX_TOOL_ROUNDS="1000")
    turns = {"0 1": 30, "1 1": 30, "100 1": 2, "1 100": 2}
    for script in turns:
        await b.agentik_turns(await agent.create_conversation(), script, 2, [], [])
    s: dict[str, list[float]] = {}
    for _ in range(2):
        base: dict[str, float] = {}
        for script, n in turns.items():
            calls = b.SCRIPTS[script][1]
            cpu: list[float] = []
            wall: list[float] = []
            await b.agentik_turns(await agent.create_conversation(), script, n, cpu, wall)
            s.setdefault(f"{script}/cpu", []).extend(cpu)
            s.setdefault(f"{script}/wall", []).extend(wall)
            if not calls:
                base = {"cpu": med(cpu), "wall": med(wall)}
                continue
            s.setdefault(f"{script}/hop_cpu", []).extend((c - base["cpu"]) / calls for c in cpu)
    await agent.close()
    res["b13"] = {k: med(v) for k, v in s.items()}


async def b4(res: dict[str, Any]) -> None:
    """B4 part 1: ``agentik serve`` + the fake LLM, new conversation per turn, one at a time:
    server CPU (schedstat, all threads) from the create to End, wall POST -> End, POST -> 202."""
    import common
    from common import CpuMeter, TurnClient, spec_text

    fake = common.start_fake()
    server = common.start_agentik(fake.port)
    r: dict[str, float] = {}
    try:
        async with common.session() as session:
            c = TurnClient(server.port, session)

            async def turn(tokens: int) -> tuple[float, float, float]:
                with CpuMeter(server.pid) as m:
                    cid = await c.new_conversation()
                    sse = await c.open_events(cid)
                    try:
                        t0 = time.perf_counter()
                        await c.post(cid, spec_text(tokens))
                        t202 = time.perf_counter()
                        n, _first, end = await asyncio.wait_for(sse.read_turn(), 60)
                    finally:
                        sse.close()
                assert n == tokens, (n, tokens)
                return m.ns / 1e3, (end - t0) * 1e3, (t202 - t0) * 1e3

            for tokens in (1, 100, 1, 100, 1, 100):  # warm-up
                await turn(tokens)
            for tokens, n in ((1, 40), (100, 15), (1000, 3)):
                got = [await turn(tokens) for _ in range(n)]
                r[f"cpu_{tokens}"] = med([g[0] for g in got])
                r[f"wall_{tokens}"] = med([g[1] for g in got])
                r[f"t202_{tokens}"] = med([g[2] for g in got])
    finally:
        common.stop_all(server, fake)
    res["b4"] = r


def sample(tree: Path, out: Path) -> None:
    sys.path[:0] = [str(tree / "bench"), str(tree / "bench" / "floors")]
    import agentik

    assert Path(agentik.__file__).resolve().is_relative_to(tree), agentik.__file__
    res: dict[str, Any] = {"tree": str(tree), "start": time.time()}

    async def run() -> None:
        for part in (b3, b13, b4):
            await part(res)

    asyncio.run(run())
    res["end"] = time.time()
    out.write_text(json.dumps(res, indent=1))


# --- the pairs and their ratios ---------------------------------------------------------------


def pairs(before: Path, after: Path, out: Path, n: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    order = ("before", "after", "after", "before")  # ABBA: a linear drift cancels
    trees = {"before": before.resolve(), "after": after.resolve()}
    for i in range(2 * n):
        side = order[i % 4]
        tree = trees[side]
        print(time.strftime("%H:%M:%S"), f"pair {i // 2} {side}", flush=True)
        subprocess.run(
            [str(tree / ".venv/bin/python"), __file__, "sample", str(tree),
             str(out / f"p{i // 2}_{side}.json")],
            check=True,
        )  # fmt: skip


def ratios(out: Path) -> None:
    found: dict[str, list[tuple[float, float]]] = {}
    k = 0
    while (out / f"p{k}_before.json").exists() and (out / f"p{k}_after.json").exists():
        b = json.loads((out / f"p{k}_before.json").read_text())
        a = json.loads((out / f"p{k}_after.json").read_text())
        for part in ("b3", "b13", "b4"):
            for key, v in b.get(part, {}).items():
                if key in a.get(part, {}):
                    found.setdefault(f"{part} {key}", []).append((v, a[part][key]))
        k += 1
    print(f"{k} pairs\n{'metric':24} {'before':>10} {'after':>10} {'ratio':>6}  pairs' ratios")
    for key, v in found.items():
        rs = [a / b for b, a in v if b]
        print(
            f"{key:24} {med([b for b, _ in v]):10.1f} {med([a for _, a in v]):10.1f} "
            f"{med(rs):6.3f}  " + " ".join(f"{r:.2f}" for r in rs)
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample")
    s.add_argument("tree", type=Path)
    s.add_argument("out", type=Path)
    q = sub.add_parser("pairs")
    q.add_argument("before", type=Path)
    q.add_argument("after", type=Path)
    q.add_argument("out", type=Path)
    q.add_argument("--pairs", type=int, default=8)
    r = sub.add_parser("ratios")
    r.add_argument("out", type=Path)
    args = p.parse_args()
    if args.cmd == "sample":
        sample(args.tree.resolve(), args.out)
    elif args.cmd == "pairs":
        pairs(args.before, args.after, args.out, args.pairs)
    else:
        ratios(args.out)


if __name__ == "__main__":
    main()
