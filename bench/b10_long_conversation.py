"""B10: a 25-turn and a 1,000-turn persisted conversation, in process; cost vs turn index.

agentik: an agent built like ``create_app`` builds it, ScriptedLLM, SQLite file DB; a new
conversation then N turns (``send`` + ``wait_idle``). Floor: bench/floors/inproc_loop.py "fair"
(the same rows and commits, sqlite3 on the loop). "turn 10" is the median of turns 5-15 and
"turn 1,000" the median of turns 990-1,000, over every repeat.
"""

from __future__ import annotations

import os
import time
from typing import Any

import common
from common import row, stats
from inproc import agentik_turns, floor_turns, open_agent
from inproc_loop import Loop


async def main(args: Any) -> dict[str, Any]:
    tmp = common.tmpdir()
    pid = os.getpid()
    reps25 = common.repeats(args, 9, 2)
    reps1k = common.repeats(args, 5, 1)
    n_long = 300 if args.quick else 1000
    agent = await open_agent(str(tmp / f"b10-{pid}.db"))
    floor = Loop(str(tmp / f"b10-floor-{pid}.db"))
    warm = await agent.create_conversation()
    await agentik_turns(warm, 20, [], [])
    await floor_turns(floor, await floor.new_conversation(), 20, [], [])
    pc, pt = time.perf_counter, time.process_time
    s: dict[str, list[float]] = {k: [] for k in ("a25_wall", "a25_cpu", "f25_wall", "f25_cpu")}
    for _ in range(reps25):  # the 25-turn conversation, new conversation included
        w0, c0 = pc(), pt()
        conv = await agent.create_conversation()
        await agentik_turns(conv, 25, [], [])
        s["a25_wall"].append((pc() - w0) * 1e3)
        s["a25_cpu"].append((pt() - c0) * 1e3)
        w0, c0 = pc(), pt()
        cid = await floor.new_conversation()
        await floor_turns(floor, cid, 25, [], [])
        s["f25_wall"].append((pc() - w0) * 1e3)
        s["f25_cpu"].append((pt() - c0) * 1e3)
    by_index: dict[str, list[list[float]]] = {"agentik": [], "floor": []}
    total: dict[str, list[float]] = {"agentik": [], "floor": []}
    for _ in range(reps1k):  # the long conversation: per-turn CPU by turn index
        cpu: list[float] = []
        w0 = pc()
        conv = await agent.create_conversation()
        await agentik_turns(conv, n_long, cpu, [])
        total["agentik"].append(pc() - w0)
        by_index["agentik"].append(cpu)
        cpu = []
        w0 = pc()
        cid = await floor.new_conversation()
        await floor_turns(floor, cid, n_long, cpu, [])
        total["floor"].append(pc() - w0)
        by_index["floor"].append(cpu)
    await agent.close()
    floor.close()

    def window(name: str, lo: int, hi: int) -> dict[str, float]:
        return stats(v for run in by_index[name] for v in run[lo - 1 : hi])

    early, late = (5, 15), (n_long - 10, n_long)
    a10, a1k = window("agentik", *early), window("agentik", *late)
    f10, f1k = window("floor", *early), window("floor", *late)
    st25 = {k: stats(v) for k, v in s.items()}
    rows = [
        row(
            "25-turn conversation, wall (create + 25 turns)",
            st25["a25_wall"],
            st25["f25_wall"],
            unit="ms",
            target="≤ 15 ms",
            met=st25["a25_wall"]["median"] <= 15,
        ),
        row(
            "25-turn conversation, process CPU",
            st25["a25_cpu"],
            st25["f25_cpu"],
            unit="ms",
            target="(info)",
        ),
        row(
            f"turn {n_long} vs turn 10, agentik CPU per turn (ratio = late/early)",
            a1k,
            a10,
            unit="µs",
            target="≤ 1.1x",
            met=a1k["median"] / a10["median"] <= 1.1,
        ),
        row(
            f"turn {n_long} vs turn 10, floor CPU per turn (ratio = late/early)",
            f1k,
            f10,
            unit="µs",
            target="(info)",
        ),
        row(f"turn {n_long}, agentik vs floor", a1k, f1k, unit="µs", target="(info)"),
        row(
            f"{n_long}-turn conversation total wall",
            stats(total["agentik"]),
            stats(total["floor"]),
            unit="s",
            target="(info)",
        ),
    ]
    notes = [f"25-turn: {reps25} alternating repeats; {n_long}-turn: {reps1k} alternating repeats"]
    return {
        "id": "B10",
        "title": "persisted conversations: 25 and 1,000 turns",
        "rows": rows,
        "notes": notes,
        "raw": {"st25": st25, "a10": a10, "a1k": a1k, "f10": f10, "f1k": f1k},
    }


if __name__ == "__main__":
    common.cli(main)
