"""B3: an in-process turn with a fake model at the backend boundary, no HTTP.

agentik: ``conv.send([TextPart("hi")])`` + ``conv.wait_idle()`` on an agent built like
``create_app`` builds it, ScriptedLLM (one text delta + usage), SQLite file DB (and ``:memory:``).
Floors (bench/floors/inproc_loop.py): the same rows and the same 2 commits written by hand with
sqlite3 on the loop, the user message's commit fsynced inline ("fair", THE floor; also on a
``:memory:`` DB), the same with that fsync on a one-thread pool as agentik's db.py does it
("fsync_thread", info) and no persistence at all ("nopersist"). Measured: process CPU µs per turn
(all threads) and wall µs. ``--pinned`` runs everything on one CPU (shows what the cross-core
thread hop of the fsync costs).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import common
from common import row, stats
from inproc import agentik_turns, floor_turns, open_agent
from inproc_loop import Loop

TARGET_US = 70.0


async def measure(args: Any) -> dict[str, dict[str, list[float]]]:
    tmp = common.tmpdir()
    reps = common.repeats(args, 7, 2)
    n = 150 if args.quick else 300
    agent_file = await open_agent(str(tmp / f"b3-{os.getpid()}.db"))
    agent_mem = await open_agent(":memory:")
    floors = {
        "fair": Loop(str(tmp / f"b3-fair-{os.getpid()}.db")),
        "fair_memory": Loop(":memory:"),
        "fsync_thread": Loop(str(tmp / f"b3-thr-{os.getpid()}.db"), fsync_thread=True),
        "nopersist": Loop(None),
    }
    paired = {  # which floors run after which agentik
        "agentik": ("fair", "fsync_thread", "nopersist"),
        "agentik_memory": ("fair_memory",),
    }
    samples: dict[str, dict[str, list[float]]] = {
        k: {"cpu": [], "wall": [], "main": [], "other": []}
        for k in ("agentik", "agentik_memory", *floors)
    }
    me = threading.get_native_id()

    def split() -> tuple[int, int]:  # (main thread, other threads) CPU ns of this process
        main = other = 0
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
            if int(tid) == me:
                main += ns
            else:
                other += ns
        return main, other

    def record(name: str, before: tuple[int, int]) -> None:
        after = split()
        samples[name]["main"].append((after[0] - before[0]) / n / 1e3)
        samples[name]["other"].append((after[1] - before[1]) / n / 1e3)

    # warm-up (imports, first LLM conversation, statement cache)
    for agent in (agent_file, agent_mem):
        conv = await agent.create_conversation()
        await agentik_turns(conv, 20, [], [])
    for loop in floors.values():
        await floor_turns(loop, await loop.new_conversation(), 20, [], [])
    for _ in range(reps):  # alternate A/B every repeat
        for name, agent in (("agentik", agent_file), ("agentik_memory", agent_mem)):
            conv = await agent.create_conversation()
            t0 = split()
            await agentik_turns(conv, n, samples[name]["cpu"], samples[name]["wall"])
            record(name, t0)
            for fname in paired[name]:
                loop = floors[fname]
                cid = await loop.new_conversation()
                t0 = split()
                await floor_turns(loop, cid, n, samples[fname]["cpu"], samples[fname]["wall"])
                record(fname, t0)
    await agent_file.close()
    await agent_mem.close()
    for loop in floors.values():
        loop.close()
    return samples


async def hop_cost(n: int = 2000) -> float:
    """CPU µs of one ``run_in_executor`` round trip to a one-thread pool doing nothing: what
    agentik's fsync of the user message pays on top of the fsync itself."""
    pool = ThreadPoolExecutor(1)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(pool, int)
    c0 = time.process_time()
    for _ in range(n):
        await loop.run_in_executor(pool, int)
    cpu = (time.process_time() - c0) / n * 1e6
    pool.shutdown()
    return cpu


async def loop_iterations(n: int = 100) -> dict[str, float]:
    """Event-loop iterations (``_run_once`` calls) per turn: agentik, the fair floor and the
    fsync-on-a-thread floor."""
    import asyncio.base_events as be

    tmp = common.tmpdir()
    count = 0
    orig = be.BaseEventLoop._run_once

    def counted(self: Any) -> None:
        nonlocal count
        count += 1
        orig(self)

    agent = await open_agent(str(tmp / f"b3-it-{os.getpid()}.db"))
    floors = {
        "fair": Loop(str(tmp / f"b3-it-fair-{os.getpid()}.db")),
        "fsync_thread": Loop(str(tmp / f"b3-it-thr-{os.getpid()}.db"), fsync_thread=True),
    }
    conv = await agent.create_conversation()
    cids = {k: await f.new_conversation() for k, f in floors.items()}
    await agentik_turns(conv, 10, [], [])
    for k, f in floors.items():
        await floor_turns(f, cids[k], 10, [], [])
    out = {}
    be.BaseEventLoop._run_once = counted  # type: ignore[method-assign]
    try:
        count = 0
        await agentik_turns(conv, n, [], [])
        out["agentik"] = count / n
        for k, f in floors.items():
            count = 0
            await floor_turns(f, cids[k], n, [], [])
            out[k] = count / n
    finally:
        be.BaseEventLoop._run_once = orig  # type: ignore[method-assign]
    await agent.close()
    for f in floors.values():
        f.close()
    return out


async def main(args: Any) -> dict[str, Any]:
    if args.pinned:
        os.sched_setaffinity(0, {0})
    s = await measure(args)
    st = {k: {m: stats(v) for m, v in d.items()} for k, d in s.items()}
    hops = stats([await hop_cost() for _ in range(common.repeats(args, 5, 2))])
    if args.pinned:
        return {"samples": st, "hop": hops}
    rows = []
    a, fair = st["agentik"]["cpu"], st["fair"]["cpu"]
    ratio = a["median"] / fair["median"]
    rows.append(
        row(
            "turn CPU, file DB, vs fair floor (same 2 commits, sqlite3 on the loop)",
            a,
            fair,
            unit="µs",
            target="≤ 1.5x and ≤ 70 µs",
            met=ratio <= 1.5 and a["median"] <= TARGET_US,
        )
    )
    am, fm = st["agentik_memory"]["cpu"], st["fair_memory"]["cpu"]
    rows.append(
        row(
            "turn CPU, :memory: DB (no fsync), vs fair floor on :memory:",
            am,
            fm,
            unit="µs",
            target="≤ 1.5x and ≤ 70 µs",
            met=am["median"] / fm["median"] <= 1.5 and am["median"] <= TARGET_US,
        )
    )
    rows.append(
        row(
            "turn CPU, file DB, vs floor that fsyncs on a thread like agentik",
            a,
            st["fsync_thread"]["cpu"],
            unit="µs",
            target="(info)",
        )
    )
    rows.append(
        row(
            "turn CPU, file DB, vs no-persistence loop",
            a,
            st["nopersist"]["cpu"],
            unit="µs",
            target="(info)",
        )
    )
    rows.append(
        row(
            "turn wall, file DB, vs fair floor",
            st["agentik"]["wall"],
            st["fair"]["wall"],
            unit="µs",
            target="(info)",
        )
    )
    for part, label in (("main", "event-loop thread"), ("other", "fsync thread")):
        rows.append(
            row(
                f"turn CPU on the {label}, vs the fsync-on-a-thread floor",
                st["agentik"][part],
                st["fsync_thread"][part],
                unit="µs",
                target="(info)",
                note="per-repeat means",
            )
        )
    rows.append(
        row(
            "one run_in_executor round trip to a 1-thread pool, no work (CPU)",
            hops,
            None,
            unit="µs",
            target="(info)",
            note="agentik makes 1 per turn: the WAL fsync of the user message",
        )
    )
    its = await loop_iterations()
    rows.append(
        row(
            "event-loop iterations per turn, vs fair floor",
            its["agentik"],
            its["fair"],
            unit="iterations",
            target="(info)",
            note=f"fsync-on-a-thread floor: {its['fsync_thread']:.1f}",
        )
    )
    drift = await common.schema_drift()
    notes = [
        "floor schema = agentik's: "
        + ("yes (same tables, indexes, trigger)" if not drift else "NO: " + "; ".join(drift))
    ]
    if not args.quick:  # the same on one CPU: the fsync's thread hop without a cross-core wake
        out = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, __file__, "--pinned", "--quick"],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        pinned_doc = json.loads(out.stdout)
        pinned = pinned_doc["samples"]
        pa, pf, pt = (pinned[k]["cpu"] for k in ("agentik", "fair", "fsync_thread"))
        rows.append(
            row(
                "turn CPU pinned to one CPU, vs fair floor",
                pa,
                pf,
                unit="µs",
                target="(info)",
            )
        )
        rows.append(
            row(
                "turn CPU pinned to one CPU, vs fsync-on-a-thread floor",
                pa,
                pt,
                unit="µs",
                target="(info)",
            )
        )
        rows.append(
            row(
                "one run_in_executor round trip, pinned to one CPU (CPU)",
                pinned_doc["hop"],
                None,
                unit="µs",
                target="(info)",
            )
        )
        notes.append("pinned rows: a second process with sched_setaffinity({0}) (2 repeats)")
    notes.append(
        f"{common.repeats(args, 7, 2)} alternating repeats x {150 if args.quick else 300} "
        "turns each; stats are over all turns (per-turn process_time, all threads)"
    )
    return {
        "id": "B3",
        "title": "in-process turn, fake model at the backend boundary",
        "rows": rows,
        "notes": notes,
        "raw": st,
    }


def add_args(p: Any) -> None:
    p.add_argument("--pinned", action="store_true")


if __name__ == "__main__":
    common.cli(main, add_args)
