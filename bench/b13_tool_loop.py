"""B13: the tool loop, 1 and 100 tool calls per turn; MCP calls over stdio; MCP start-up.

1. In process, an in-agent tool. agentik: an agent built like ``create_app`` builds it, with
   the tool ``count`` registered through ``register_tools`` (``agentik.core.tools.tool``), a
   ScriptedLLM that asks for it, SQLite file DB; ``send`` + ``wait_idle``. Floor
   (bench/floors/tool_loop.py): the same script, rows, payloads and commits written by hand
   with sqlite3 on the loop (2 commits per hop, the user message fsynced). Scripts: no tool call
   (the plain turn both have to do anyway), 1 call, 100 calls in one model step, 100 steps of
   one call. A *hop* is one tool call: the call's record, the tool, the result's record and
   the call's share of the model steps; µs per hop = (turn - the plain turn of the same repeat)
   / calls. Process CPU (all threads) is the measure; wall is shown too. The same on
   ``:memory:`` (no I/O at all) is info.
2. ``get_current_time`` of ``mcp-server-time`` over stdio: the same tool loop (1 and 100 calls
   per turn) through the tools_mcp plugin's service (``mcp_service``, as ``serve`` starts it)
   vs the floor loop calling it directly through the mcp ``Client`` (its own server process),
   alternating; and one call alone: the plugin's tool through ``ToolRegistry.invoke`` vs
   ``Client.call_tool``. Added time per MCP call = (agentik - direct) / calls, wall p50.
3. Start-up: ``MCPTools.start()`` of 3 stdio servers (mcp-server-time, server-everything on
   node, a second mcp-server-time) vs the slowest one alone, alternating.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import common
from common import row, stats
from inproc import LeanScriptedLLM
from tool_loop import FINAL, ToolLoop, count, plan

from agentik.core.app import build_agent, load_settings
from agentik.core.llm import LLMInput, ToolCallRequest, Usage, UserInput
from agentik.core.testing import test_plugins
from agentik.core.tools import tool
from agentik.core.types import TextPart
from agentik.hookspecs import hookimpl

TARGET_HOP_US = 100.0
TARGET_RATIO = 1.5
TARGET_MCP_ADDED_MS = 2.0
TARGET_START_RATIO = 1.25  # "close to the slowest one alone"
#: script -> (label, tool calls per turn)
SCRIPTS = {
    "0 1": ("no tool call (plain turn)", 0),
    "1 1": ("1 tool call", 1),
    "100 1": ("100 tool calls in one model step", 100),
    "1 100": ("100 model steps of 1 tool call", 100),
}
EVERYTHING = (
    common.ROOT / "tests/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
)
TIME_ARGS = {"timezone": "UTC"}


class LoopLLM(LeanScriptedLLM):
    """Plays bench/floors/tool_loop.py's script (:func:`plan`): ``"<calls per step> <steps>"``."""

    def __init__(self, tool_name: str = "count", args: Callable[[int], str] | None = None):
        super().__init__()
        self.tool_name = tool_name
        self.args = args or (lambda left: json.dumps({"n": left}))

    def default(self, inputs: Sequence[LLMInput]) -> Any:
        last = inputs[-1]
        if isinstance(last, UserInput):
            per, left = plan(last.text, [])
        else:
            per, left = plan(None, [i.text for i in inputs])  # type: ignore[union-attr]
        if per == 0:
            return [FINAL, Usage(10, 2)]
        calls = [
            ToolCallRequest(f"call-{left}-{i}", self.tool_name, self.args(left)) for i in range(per)
        ]
        return [*calls, Usage(10, 2)]


class CountTool:
    """A plugin with one in-agent tool."""

    @hookimpl
    def register_tools(self, register: Callable[[Any], None]) -> None:
        register(tool(count))


async def open_agent(db_path: str, llm: LoopLLM, **env: str) -> tuple[Any, Any, Any]:
    """(agent, settings, plugins): the agent ``create_app`` would build, opened."""
    import agentik_tools_mcp

    pm = test_plugins([("b13_tools", CountTool()), ("agentik_tools_mcp", agentik_tools_mcp)])
    # the "1 100" script's 100 rounds: past issue 23's default limit of 20, which ends the turn
    base = {
        "AGENTIK_DB_PATH": db_path,
        "AGENTIK_MCP_CONFIG": "off",
        "AGENTIK_MAX_TOOL_ROUNDS": "1000",
    }
    settings = load_settings(pm, {**base, **env})
    agent = build_agent(pm, settings, llm)
    await agent.open()
    return agent, settings, pm


async def agentik_turns(conv: Any, text: str, n: int, cpu: list[float], wall: list[float]) -> None:
    pt, pc = time.process_time, time.perf_counter
    msg = [TextPart(text)]
    for _ in range(n):
        c0, w0 = pt(), pc()
        await conv.send(msg)
        await conv.wait_idle()
        cpu.append((pt() - c0) * 1e6)
        wall.append((pc() - w0) * 1e6)


async def floor_turns(
    loop: ToolLoop, cid: str, text: str, n: int, cpu: list[float], wall: list[float], **kw: Any
) -> None:
    pt, pc = time.process_time, time.perf_counter
    for _ in range(n):
        c0, w0 = pt(), pc()
        await loop.turn(cid, text, **kw)
        cpu.append((pt() - c0) * 1e6)
        wall.append((pc() - w0) * 1e6)


def median(v: list[float]) -> float:
    return common.percentile(v, 50)


# --- 1. the in-process tool loop ------------------------------------------------------------


async def tool_loop(args: Any) -> dict[str, dict[str, dict[str, list[float]]]]:
    """samples[db][side][f"{script}/{cpu|wall|hop_cpu|hop_wall}"]: per-turn µs."""
    tmp, pid = common.tmpdir(), os.getpid()
    reps = common.repeats(args, 7, 2)
    turns = {"0 1": 100, "1 1": 100, "100 1": 4, "1 100": 4}
    if args.quick:
        turns = {"0 1": 40, "1 1": 40, "100 1": 2, "1 100": 2}
    out: dict[str, dict[str, dict[str, list[float]]]] = {}
    for db in ("file", "memory"):
        path = (lambda name: str(tmp / f"b13-{name}-{pid}.db")) if db == "file" else None
        agent, _, _ = await open_agent(path("agentik") if path else ":memory:", LoopLLM())
        loop = ToolLoop(path("floor") if path else ":memory:", {"count": count})
        samples: dict[str, dict[str, list[float]]] = {"agentik": {}, "floor": {}}
        for side in samples:
            for script in SCRIPTS:
                for m in ("cpu", "wall", "hop_cpu", "hop_wall"):
                    samples[side][f"{script}/{m}"] = []
        # warm-up: imports, statement caches, the first LLM conversation
        for script in SCRIPTS:
            await agentik_turns(await agent.create_conversation(), script, 3, [], [])
            await floor_turns(loop, await loop.new_conversation(), script, 3, [], [])
        for rep in range(reps):
            order = ("agentik", "floor") if rep % 2 == 0 else ("floor", "agentik")
            for side in order:  # alternate A/B every repeat
                s = samples[side]
                base: dict[str, float] = {}
                for script, (_, calls) in SCRIPTS.items():
                    cpu: list[float] = []
                    wall: list[float] = []
                    if side == "agentik":
                        conv = await agent.create_conversation()
                        await agentik_turns(conv, script, turns[script], cpu, wall)
                    else:
                        cid = await loop.new_conversation()
                        await floor_turns(loop, cid, script, turns[script], cpu, wall)
                    s[f"{script}/cpu"] += cpu
                    s[f"{script}/wall"] += wall
                    if not calls:
                        base = {"cpu": median(cpu), "wall": median(wall)}
                        continue
                    s[f"{script}/hop_cpu"] += [(c - base["cpu"]) / calls for c in cpu]
                    s[f"{script}/hop_wall"] += [(w - base["wall"]) / calls for w in wall]
        await agent.close()
        loop.close()
        out[db] = samples
    return out


async def loop_iterations(script: str = "100 1", n: int = 3) -> dict[str, float]:
    """Event-loop iterations (``_run_once`` calls) and tasks created per hop, :memory: DB."""
    import asyncio.base_events as be

    calls = SCRIPTS[script][1] * n
    agent, _, _ = await open_agent(":memory:", LoopLLM())
    loop = ToolLoop(":memory:", {"count": count})
    conv, cid = await agent.create_conversation(), await loop.new_conversation()
    await agentik_turns(conv, script, 1, [], [])
    await floor_turns(loop, cid, script, 1, [], [])
    counts = {"iterations": 0, "tasks": 0}
    run_once, create_task = be.BaseEventLoop._run_once, be.BaseEventLoop.create_task

    def counted_run_once(self: Any) -> None:
        counts["iterations"] += 1
        run_once(self)

    def counted_create_task(self: Any, *a: Any, **kw: Any) -> Any:
        counts["tasks"] += 1
        return create_task(self, *a, **kw)

    out: dict[str, float] = {}
    be.BaseEventLoop._run_once = counted_run_once  # type: ignore[method-assign]
    be.BaseEventLoop.create_task = counted_create_task  # type: ignore[method-assign]
    try:
        for side in ("agentik", "floor"):
            counts.update(iterations=0, tasks=0)
            if side == "agentik":
                await agentik_turns(conv, script, n, [], [])
            else:
                await floor_turns(loop, cid, script, n, [], [])
            out[f"{side}_iterations"] = counts["iterations"] / calls
            out[f"{side}_tasks"] = counts["tasks"] / calls
    finally:
        be.BaseEventLoop._run_once = run_once  # type: ignore[method-assign]
        be.BaseEventLoop.create_task = create_task  # type: ignore[method-assign]
    await agent.close()
    loop.close()
    return out


def tool_loop_rows(s: dict[str, dict[str, dict[str, list[float]]]]) -> list[dict[str, Any]]:
    rows = []
    st = {
        db: {side: {k: stats(v) for k, v in d.items()} for side, d in sides.items()}
        for db, sides in s.items()
    }
    a, f = st["file"]["agentik"], st["file"]["floor"]
    rows.append(
        row(
            "plain turn (no tool call) CPU, file DB, vs floor",
            a["0 1/cpu"],
            f["0 1/cpu"],
            unit="µs",
            target="(info: B3)",
        )
    )
    for script, (label, _) in list(SCRIPTS.items())[1:]:
        turn_ratio = a[f"{script}/cpu"]["median"] / f[f"{script}/cpu"]["median"]
        rows.append(
            row(
                f"{label} per turn: turn CPU, file DB, vs floor",
                a[f"{script}/cpu"],
                f[f"{script}/cpu"],
                unit="µs",
                target=f"≤ {TARGET_RATIO}x",
                met=turn_ratio <= TARGET_RATIO,
            )
        )
        hop, fhop = a[f"{script}/hop_cpu"], f[f"{script}/hop_cpu"]
        rows.append(
            row(
                f"{label} per turn: CPU per hop ((turn - plain turn) / calls), file DB, vs floor",
                hop,
                fhop,
                unit="µs",
                target=f"≤ {TARGET_RATIO}x; ≤ {TARGET_HOP_US:g} µs",
                met=hop["median"] / fhop["median"] <= TARGET_RATIO
                and hop["median"] <= TARGET_HOP_US,
            )
        )
    for script, (label, _) in list(SCRIPTS.items())[1:]:
        rows.append(
            row(
                f"{label} per turn: wall per hop, file DB, vs floor",
                a[f"{script}/hop_wall"],
                f[f"{script}/hop_wall"],
                unit="µs",
                target="(info)",
            )
        )
    am, fm = st["memory"]["agentik"], st["memory"]["floor"]
    for script, (label, _) in list(SCRIPTS.items())[1:]:
        rows.append(
            row(
                f"{label} per turn: CPU per hop, :memory: DB (no I/O), vs floor",
                am[f"{script}/hop_cpu"],
                fm[f"{script}/hop_cpu"],
                unit="µs",
                target="(info)",
            )
        )
    return rows


def iteration_rows(its: dict[str, float]) -> list[dict[str, Any]]:
    return [
        row(
            "100 tool calls in one model step: event-loop iterations per hop, vs floor",
            its["agentik_iterations"],
            its["floor_iterations"],
            unit="iterations",
            target="(info)",
            note=f"tasks created per hop: agentik {its['agentik_tasks']:.2f}, "
            f"floor {its['floor_tasks']:.2f}",
        )
    ]


# --- 2. MCP calls over stdio ----------------------------------------------------------------


def time_server() -> dict[str, Any]:
    return {"command": sys.executable, "args": ["-m", "mcp_server_time"]}


async def mcp_calls(args: Any) -> dict[str, list[float]]:
    from mcp import Client, StdioServerParameters

    import agentik_tools_mcp

    tmp, pid = common.tmpdir(), os.getpid()
    reps = common.repeats(args, 7, 2)
    config = tmp / f"b13-mcp-{pid}.json"
    config.write_text(json.dumps({"mcpServers": {"time": time_server()}}))
    llm = LoopLLM("time__get_current_time", lambda _left: json.dumps(TIME_ARGS))
    agent, settings, _ = await open_agent(str(tmp / f"b13-mcp-{pid}.db"), llm)
    loop: ToolLoop | None = None
    s: dict[str, list[float]] = {}
    service = agentik_tools_mcp.mcp_service(agent, settings, config)
    params = StdioServerParameters(command=sys.executable, args=["-m", "mcp_server_time"])
    async with service, Client(params) as client:

        async def direct(**kw: Any) -> str:
            result = await client.call_tool("get_current_time", kw)
            return str(result.content[0].text)  # type: ignore[union-attr]

        loop = ToolLoop(str(tmp / f"b13-mcp-floor-{pid}.db"), {"time__get_current_time": direct})
        fargs = {"tool": "time__get_current_time", "args": lambda _left: json.dumps(TIME_ARGS)}
        registry = agent.tools
        turns = {"1 1": 2 if args.quick else 20, "100 1": 1 if args.quick else 2}
        calls = 50 if args.quick else 200
        for k in ("one_agentik", "one_direct", "one_agentik_cpu", "one_direct_cpu"):
            s[k] = []
        for script in turns:
            for side in ("agentik", "floor"):
                s[f"{script}/{side}/wall"], s[f"{script}/{side}/cpu"] = [], []
            s[f"{script}/added_wall"], s[f"{script}/added_cpu"] = [], []
        # warm-up: both sessions, both loops
        for _ in range(20):
            await registry.invoke("time__get_current_time", json.dumps(TIME_ARGS))
            await direct(**TIME_ARGS)
        await agentik_turns(await agent.create_conversation(), "1 1", 3, [], [])
        await floor_turns(loop, await loop.new_conversation(), "1 1", 3, [], [], **fargs)
        pt, pc = time.process_time, time.perf_counter
        args_json = json.dumps(TIME_ARGS)
        for rep in range(reps):
            first = rep % 2 == 0
            for side in ("agentik", "direct") if first else ("direct", "agentik"):
                w, c = s[f"one_{side}"], s[f"one_{side}_cpu"]
                for _ in range(calls):  # one call alone
                    c0, w0 = pt(), pc()
                    if side == "agentik":
                        text, error = await registry.invoke("time__get_current_time", args_json)
                        assert not error, text
                    else:
                        await direct(**TIME_ARGS)
                    w.append((pc() - w0) * 1e3)
                    c.append((pt() - c0) * 1e3)
            for script, n in turns.items():  # the tool loop
                per = SCRIPTS[script][1]
                res: dict[str, tuple[list[float], list[float]]] = {}
                for side in ("agentik", "floor") if first else ("floor", "agentik"):
                    cpu: list[float] = []
                    wall: list[float] = []
                    if side == "agentik":
                        conv = await agent.create_conversation()
                        await agentik_turns(conv, script, n, cpu, wall)
                    else:
                        cid = await loop.new_conversation()
                        await floor_turns(loop, cid, script, n, cpu, wall, **fargs)
                    res[side] = (cpu, wall)
                    s[f"{script}/{side}/cpu"] += [x / 1e3 for x in cpu]
                    s[f"{script}/{side}/wall"] += [x / 1e3 for x in wall]
                fcpu, fwall = median(res["floor"][0]), median(res["floor"][1])
                s[f"{script}/added_cpu"] += [(x - fcpu) / per / 1e3 for x in res["agentik"][0]]
                s[f"{script}/added_wall"] += [(x - fwall) / per / 1e3 for x in res["agentik"][1]]
        # the loop really called the server: the last result is its JSON
        messages = await conv.get_messages(limit=500)
        last = [m for m in messages if m.kind == "tool_result"][-1].payload
        assert not last["isError"] and json.loads(last["text"])["timezone"] == "UTC", last
    await agent.close()
    loop.close()
    return s


def mcp_rows(s: dict[str, list[float]]) -> list[dict[str, Any]]:
    st = {k: stats(v) for k, v in s.items()}
    rows = []
    one_added = st["one_agentik"]["median"] - st["one_direct"]["median"]
    rows.append(
        row(
            "get_current_time, one call: the plugin's tool (ToolRegistry.invoke) vs "
            "Client.call_tool directly, wall",
            st["one_agentik"],
            st["one_direct"],
            unit="ms",
            target=f"≤ {TARGET_MCP_ADDED_MS:g} ms p50 added",
            met=one_added <= TARGET_MCP_ADDED_MS,
            note=f"added {one_added * 1e3:.0f} µs",
        )
    )
    rows.append(
        row(
            "get_current_time, one call: CPU of this process, plugin vs direct",
            st["one_agentik_cpu"],
            st["one_direct_cpu"],
            unit="ms",
            target="(info)",
        )
    )
    for script, label in (("1 1", "1 call"), ("100 1", "100 calls")):
        a, f = st[f"{script}/agentik/wall"], st[f"{script}/floor/wall"]
        added = st[f"{script}/added_wall"]
        rows.append(
            row(
                f"tool loop, {label} of get_current_time per turn: turn wall vs floor loop "
                "calling the Client directly",
                a,
                f,
                unit="ms",
                target="(info)",
            )
        )
        rows.append(
            row(
                f"tool loop, {label} per turn: agentik's added wall per MCP call "
                "((agentik - floor) / calls)",
                added,
                None,
                unit="ms",
                target=f"≤ {TARGET_MCP_ADDED_MS:g} ms p50",
                met=added["median"] <= TARGET_MCP_ADDED_MS,
            )
        )
        rows.append(
            row(
                f"tool loop, {label} per turn: agentik's added CPU per MCP call",
                st[f"{script}/added_cpu"],
                None,
                unit="ms",
                target="(info)",
            )
        )
    return rows


# --- 3. start-up of 3 stdio servers ---------------------------------------------------------


def start_configs() -> tuple[list[Any], str]:
    from agentik_tools_mcp.config import ServerConfig

    time_args = ("-m", "mcp_server_time")
    servers = [ServerConfig("time", "stdio", command=sys.executable, args=time_args)]
    if EVERYTHING.is_file() and shutil.which("node"):
        servers.append(
            ServerConfig("everything", "stdio", command="node", args=(str(EVERYTHING), "stdio"))
        )
        what = "mcp-server-time, server-everything (node), mcp-server-time again"
    else:
        servers.append(ServerConfig("time3", "stdio", command=sys.executable, args=time_args))
        what = "mcp-server-time 3 times (server-everything is not installed)"
    servers.append(ServerConfig("time2", "stdio", command=sys.executable, args=time_args))
    return servers, what


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


async def start_once(configs: list[Any]) -> tuple[float, float, float]:
    """(wall ms of MCPTools.start(), CPU ms the servers used from exec to closed, CPU ms of
    this process during the start)."""
    from agentik_tools_mcp.servers import MCPTools

    tools = MCPTools(configs, start_timeout=60)
    c0, own = children_cpu_s(), time.process_time()
    t0 = time.perf_counter()
    await tools.start()
    wall = (time.perf_counter() - t0) * 1e3
    own = (time.process_time() - own) * 1e3
    failed = dict(tools.failed)
    await tools.aclose()
    assert not failed, failed
    return wall, (children_cpu_s() - c0) * 1e3, own


async def direct_start(config: Any) -> float:
    """Wall ms to the listed tools through the mcp Client, without agentik."""
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=config.command, args=list(config.args))
    t0 = time.perf_counter()
    async with Client(params) as client:
        await client.list_tools()
        wall = (time.perf_counter() - t0) * 1e3
    return wall


def import_cost(n: int) -> list[float]:
    """Wall ms of importing the plugin's MCP half (the mcp SDK) in a fresh process: ``serve``
    pays it once, before the servers start."""
    code = (
        "import time; t = time.perf_counter(); import agentik_tools_mcp.servers; "
        "print((time.perf_counter() - t) * 1e3)"
    )
    out = []
    for _ in range(n):
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        out.append(float(done.stdout))
    return out


async def startup(args: Any) -> tuple[dict[str, list[float]], str, list[str]]:
    configs, what = start_configs()
    names = [c.name for c in configs]
    reps = common.repeats(args, 7, 2)
    s: dict[str, list[float]] = {"all": [], "all_cpu": [], "all_own": []}
    for c in configs:
        s[c.name], s[f"{c.name}_cpu"], s[f"{c.name}_own"], s[f"{c.name}_direct"] = [], [], [], []
    await start_once(configs)  # warm-up: the page cache, Python's bytecode, node's
    for rep in range(reps):
        runs: list[list[Any]] = [configs, *([c] for c in configs)]
        if rep % 2:
            runs.reverse()
        for run in runs:
            wall, cpu, own = await start_once(run)
            key = "all" if len(run) > 1 else run[0].name
            s[key].append(wall)
            s[f"{key}_cpu"].append(cpu)
            s[f"{key}_own"].append(own)
            if len(run) == 1:  # the same server through the mcp Client alone, right after
                s[f"{key}_direct"].append(await direct_start(run[0]))
    s["import"] = import_cost(common.repeats(args, 5, 2))
    slowest = max(names, key=lambda n: median(s[n]))
    return s, what, [slowest, *names]


def startup_rows(s: dict[str, list[float]], slowest: str, names: list[str]) -> list[dict[str, Any]]:
    st = {k: stats(v) for k, v in s.items()}
    cores = len(os.sched_getaffinity(0))
    cpu_all = st["all_cpu"]["median"] + st["all_own"]["median"]
    bound = max(st[slowest]["median"], cpu_all / cores)
    ratio = st["all"]["median"] / st[slowest]["median"]
    rows = [
        row(
            f"start-up of the 3 servers (MCPTools.start) vs the slowest alone ({slowest})",
            st["all"],
            st[slowest],
            unit="ms",
            target=f"close to the slowest (≤ {TARGET_START_RATIO}x)",
            met=ratio <= TARGET_START_RATIO,
        )
    ]
    for n in names:
        rows.append(
            row(
                f"start-up of {n} alone: agentik (MCPTools) vs the mcp Client directly",
                st[n],
                st[f"{n}_direct"],
                unit="ms",
                target="(info)",
                note=f"the server's CPU: {st[f'{n}_cpu']['median']:.0f} ms",
            )
        )
    rows.append(
        row(
            "start-up of the 3 vs one after the other (the sum of each alone)",
            st["all"],
            sum(st[n]["median"] for n in names),
            unit="ms",
            target="(info)",
        )
    )
    rows.append(
        row(
            f"start-up of the 3 vs max(slowest alone, all the CPU it takes / {cores} cores)",
            st["all"],
            bound,
            unit="ms",
            target="(info)",
            note=f"the 3 servers use {st['all_cpu']['median']:.0f} ms of CPU from exec to "
            f"closed, agentik {st['all_own']['median']:.0f} ms",
        )
    )
    rows.append(
        row(
            "importing the mcp SDK (agentik_tools_mcp.servers) in a fresh process",
            st["import"],
            None,
            unit="ms",
            target="(info)",
            note="paid once by `serve` with a config, before the servers start",
        )
    )
    return rows


async def main(args: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {}
    s1 = await tool_loop(args)
    rows = tool_loop_rows(s1)
    rows += iteration_rows(await loop_iterations())
    raw["tool_loop"] = {
        db: {side: {k: stats(v) for k, v in d.items()} for side, d in sides.items()}
        for db, sides in s1.items()
    }
    notes = [
        f"tool loop: {common.repeats(args, 7, 2)} alternating repeats; per repeat and side a new "
        "conversation per script, 100 turns (no call, 1 call) or 4 turns (100 calls); CPU is "
        "process_time (all threads); per-hop samples subtract the median plain turn of the "
        "same repeat and side",
    ]
    try:
        import mcp  # noqa: F401
    except ImportError:
        notes.append("MCP parts skipped: the mcp package is not installed (agentik[mcp])")
    else:
        s2 = await mcp_calls(args)
        rows += mcp_rows(s2)
        raw["mcp_calls"] = {k: stats(v) for k, v in s2.items()}
        s3, what, (slowest, *names) = await startup(args)
        rows += startup_rows(s3, slowest, names)
        raw["startup"] = {k: stats(v) for k, v in s3.items()}
        notes += [
            "MCP calls: one mcp-server-time per side (the plugin's, started by its service "
            "like `serve` does, and the direct Client's), both `python -m mcp_server_time` "
            f"over stdio; {common.repeats(args, 7, 2)} alternating repeats of "
            f"{50 if args.quick else 200} single calls and {2 if args.quick else 20} + "
            f"{1 if args.quick else 2} turns (1 / 100 calls)",
            f"start-up servers: {what}; {common.repeats(args, 7, 2)} alternating repeats; each "
            "start is timed from MCPTools.start() to its return (all tools listed), then "
            "closed; server CPU from RUSAGE_CHILDREN",
        ]
    drift = await common.schema_drift()
    notes.append(
        "floor schema = agentik's: "
        + ("yes (same tables, indexes, trigger)" if not drift else "NO: " + "; ".join(drift))
    )
    return {
        "id": "B13",
        "title": "tool loop (in-agent tool, MCP over stdio) and MCP start-up",
        "rows": rows,
        "notes": notes,
        "raw": raw,
    }


if __name__ == "__main__":
    common.cli(main)
