"""``agentik serve`` of this tree against the same server at a git ref, side by side in one
run: server CPU per turn (every thread, /proc schedstat), windows alternating between the two
servers (and, in each, between the kinds of turn).

    python bench/tools/ab_server.py --base HEAD~1 a2a     # B20: A2A streamed turn vs own SSE turn
    python bench/tools/ab_server.py --base HEAD~1 turn    # B4's 200-chunk turn, and the raw floor
    python bench/tools/ab_server.py --base HEAD~1 long    # turn 300 vs turn 10 of one conversation

The ref's tree is exported (``git archive``) to a temporary folder and its packages put first
on the base server's ``PYTHONPATH`` (``agentik`` and every ``plugins/*`` as ``agentik_*``), so
the installed entry points load the ref's code.
"""

from __future__ import annotations

import argparse
import asyncio
import configparser
import importlib.metadata
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import b20_a2a as b20
import common
from common import ROOT, TurnClient, stats

CHUNKS = 200
TURNS = 20


def export(ref: str, tmp: Path) -> str:
    """The ref's tree under ``tmp``; returns the PYTHONPATH that loads its packages."""
    tree = tmp / "tree"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "archive", ref], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    cfg = configparser.ConfigParser()
    cfg.read(tree / "setup.cfg")
    pkgs = tmp / "pkgs"
    pkgs.mkdir()
    (pkgs / "agentik").symlink_to(tree / "agentik")
    for line in cfg["options"]["package_dir"].strip().splitlines():
        name, _, folder = (p.strip() for p in line.partition("="))
        (pkgs / name).symlink_to(tree / folder)
    # a plugin installed here that the ref does not have yet: an empty package, so its entry
    # point loads nothing rather than this tree's code on the ref's core
    for ep in importlib.metadata.entry_points(group="agentik"):
        if not (pkgs / ep.value).exists():
            (pkgs / ep.value).mkdir()
            (pkgs / ep.value / "__init__.py").write_text("")
    return str(pkgs)


async def sse_window(c: TurnClient, proc: common.Proc, text: str) -> float:
    cid = await c.new_conversation()
    await c.turn(text, cid)
    with common.CpuMeter(proc.pid) as m:
        for _ in range(TURNS):
            got = await c.turn(text, cid)
            assert got["tokens"] == CHUNKS, got
    return m.ns / TURNS / 1e3


async def long_conversations(servers: dict[str, common.Proc], turns: int) -> dict[str, Any]:
    """One conversation per server, ``turns`` turns each, turn by turn in alternation: server
    CPU of each turn. Messages of ~600 characters both ways (the issue's 360 kB at turn 300)."""
    text = common.spec_text(20, chars=600) + " " + common.reply_text(0, chars=560)
    cpu: dict[str, list[float]] = {side: [] for side in servers}
    async with common.session() as s:
        clients = {side: TurnClient(p.port, s) for side, p in servers.items()}
        cids = {side: await c.new_conversation() for side, c in clients.items()}
        for i in range(turns):
            for side in list(servers)[i % 2 :] + list(servers)[: i % 2]:
                with common.CpuMeter(servers[side].pid) as m:
                    await clients[side].turn(text, cids[side])
                cpu[side].append(m.ns / 1e3)
    out: dict[str, Any] = {}
    for side, values in cpu.items():
        early = stats(values[5:16])["median"]
        late = stats(values[-11:])["median"]
        out[side] = {"turn_10_us": early, f"turn_{turns}_us": late, "ratio": late / early}
    return out


async def main(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="ab-server-"))
    path = export(args.base, tmp)
    fake = common.start_fake()
    servers: dict[str, common.Proc] = {}
    floor = None
    cpu: dict[str, list[float]] = {}
    text = common.spec_text(CHUNKS)
    try:
        servers["new"] = common.start_agentik(fake.port)
        servers["base"] = common.start_agentik(fake.port, PYTHONPATH=path)
        if args.mode == "long":
            return {
                "base": args.base,
                "mode": "long",
                "server_cpu": await long_conversations(servers, args.turns),
            }
        if args.mode == "turn":
            up = f"http://{common.HOST}:{fake.port}/v1"
            db = str(common.tmpdir() / "ab-floor.db")
            floor = common.start_floor("raw_turn_server.py", "--upstream", up, "--db", db)
        async with common.session() as s:
            windows: list[tuple[str, Any]] = []
            for side, proc in servers.items():
                c = TurnClient(proc.port, s)
                windows.append((f"{side}_sse", lambda c=c, p=proc: sse_window(c, p, text)))
                if args.mode == "a2a":
                    windows.append((f"{side}_a2a", lambda p=proc: b20.a2a_window(s, p)))
            if floor is not None:
                fc = TurnClient(floor.port, s)
                windows.append(("raw_floor", lambda: sse_window(fc, floor, text)))
            for _, run in windows:  # warm-up
                await run()
            for rep in range(args.reps):
                order = windows[rep % len(windows) :] + windows[: rep % len(windows)]
                for name, run in order:
                    value = await run()
                    if name.endswith("_a2a"):
                        value = value / b20.TURNS / 1e3
                    cpu.setdefault(name, []).append(value)
    finally:
        common.stop_all(*servers.values(), floor, fake)
        shutil.rmtree(tmp, ignore_errors=True)
    med = {k: stats(v)["median"] for k, v in cpu.items()}
    out: dict[str, Any] = {"base": args.base, "mode": args.mode, "reps": args.reps}
    out["server_cpu_us_per_turn"] = med
    if args.mode == "a2a":
        out["a2a_vs_own_sse"] = {s: med[f"{s}_a2a"] / med[f"{s}_sse"] for s in servers}
        out["a2a_new_vs_base"] = med["new_a2a"] / med["base_a2a"]
    else:
        out["sse_new_vs_base"] = med["new_sse"] / med["base_sse"]
        out["added_over_raw_floor_us"] = {s: med[f"{s}_sse"] - med["raw_floor"] for s in servers}
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("a2a", "turn", "long"))
    parser.add_argument("--turns", type=int, default=300, help="long: turns per conversation")
    parser.add_argument("--base", default="HEAD~1")
    parser.add_argument("--reps", type=int, default=5)
    print(json.dumps(asyncio.run(main(parser.parse_args())), indent=1))
