"""B10: a 25-turn and a 1,000-turn persisted conversation, in process; cost vs turn index.

agentik: an agent built like ``create_app`` builds it, ScriptedLLM, SQLite file DB; a new
conversation then N turns (``send`` + ``wait_idle``). Floor: bench/floors/inproc_loop.py "fair"
(the same rows and commits, sqlite3 on the loop). "turn 10" is the median of turns 5-15 and
"turn 1,000" the median of turns 990-1,000, over every repeat.

With compaction on (issue 7): the same 1,000 turns with the compaction plugin and a 400-token
window (a compaction every ~25 turns; the summary call is scripted, so it costs ~nothing), the
server started as ``agentik serve`` starts it (services included). "turn 10" / "turn 1,000"
are the medians of the turns around them that did not compact; the compacting turns are
reported apart. And the price of the pre-send check (running token estimate + the
``compact_context`` hook) on a 100-message working memory, against re-scanning that memory.
"""

from __future__ import annotations

import os
import time
from typing import Any

import common
from common import row, stats
from inproc import HI, LeanScriptedLLM, agentik_turns, floor_turns, open_agent
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
    rows += await compaction_rows(tmp, pid, n_long, reps1k)
    notes = [f"25-turn: {reps25} alternating repeats; {n_long}-turn: {reps1k} alternating repeats"]
    return {
        "id": "B10",
        "title": "persisted conversations: 25 and 1,000 turns",
        "rows": rows,
        "notes": notes,
        "raw": {"st25": st25, "a10": a10, "a1k": a1k, "f10": f10, "f1k": f1k},
    }


class WindowLLM(LeanScriptedLLM):
    """No token usage reported (the chars/4 running estimate is used); short summaries."""

    def __init__(self, window: int) -> None:
        super().__init__()
        self.context_window = window

    def default(self, inputs: Any) -> Any:
        return ["echo: hi"]

    async def complete(self, prompt: str, *, system_prompt: str | None = None) -> str:
        return "Goal: bench. Active: none. Resolved: none. Blocked: none. Remaining: none."


async def started_agent(db: str, window: int) -> tuple[Any, Any]:
    """An agent with the compaction plugin, started as ``serve`` starts it (no socket)."""
    from aiohttp import web

    import agentik_compaction
    from agentik.core.app import AGENT, create_app, load_settings
    from agentik.core.testing import test_plugins

    pm = test_plugins([("agentik_compaction", agentik_compaction)])
    app = create_app(load_settings(pm, {"AGENTIK_DB_PATH": db}), pm, llm=WindowLLM(window))
    runner = web.AppRunner(app)
    await runner.setup()
    return app[AGENT], runner


async def compaction_rows(tmp: Any, pid: int, n_long: int, reps: int) -> list[dict[str, Any]]:
    agent, runner = await started_agent(str(tmp / f"b10-compact-{pid}.db"), 400)
    await agentik_turns(await agent.create_conversation(), 30, [], [])  # warm up
    plain: list[list[tuple[int, float]]] = []  # (turn index, CPU µs) of turns without one
    compacting: list[float] = []
    counts: list[float] = []
    pt = time.process_time
    for _ in range(reps):
        conv = await agent.create_conversation()
        run: list[tuple[int, float]] = []
        for i in range(1, n_long + 1):
            before, c0 = conv.compactions, pt()
            await conv.send(HI)
            await conv.wait_idle()
            cpu = (pt() - c0) * 1e6
            (compacting.append(cpu) if conv.compactions > before else run.append((i, cpu)))
        plain.append(run)
        counts.append(conv.compactions)
    await runner.cleanup()

    def near(lo: int, hi: int) -> dict[str, float]:
        return stats(cpu for run in plain for i, cpu in run if lo <= i <= hi)

    early, late = near(5, 15), near(n_long - 10, n_long)

    # the pre-send check on a 100-message working memory (50 turns, far below the window)
    from agentik.core.context import context_tokens
    from agentik.core.llm import UserInput

    agent, runner = await started_agent(str(tmp / f"b10-estimate-{pid}.db"), 10**9)
    conv = await agent.create_conversation()
    await agentik_turns(conv, 50, [], [])
    memory = [r.item for r in await agent.store.list_memory(conv.id)]
    assert len(memory) == 100, len(memory)
    inputs = [UserInput("hi")]
    prompt, specs = agent.system_prompt(), agent.tools.specs()
    check, rescan = [], []
    for _ in range(7):  # process CPU: the machine may be shared
        n = 20_000
        c0 = pt()
        for _ in range(n):
            await conv._compact_before_send(inputs, False)
        check.append((pt() - c0) / n * 1e6)
        c0 = pt()
        for _ in range(n // 10):
            context_tokens(prompt, memory, specs)
        rescan.append((pt() - c0) / (n // 10) * 1e6)
    await runner.cleanup()
    return [
        row(
            f"compaction on: turn {n_long} vs turn 10, CPU per turn without a compaction",
            late,
            early,
            unit="µs",
            target="≤ 1.1x",
            met=late["median"] / early["median"] <= 1.1,
        ),
        row(
            "compaction on: CPU of a compacting turn (scripted summary) vs a plain turn 10",
            stats(compacting),
            early,
            unit="µs",
            target="(info)",
        ),
        row(f"compaction on: compactions in {n_long} turns", stats(counts), target="(info)"),
        row(
            "pre-send check per send, 100-message memory (running estimate + hook) vs re-scan",
            stats(check),
            stats(rescan),
            unit="µs",
            target="≤ 50 µs",
            met=stats(check)["median"] <= 50,
        ),
    ]


if __name__ == "__main__":
    common.cli(main)
