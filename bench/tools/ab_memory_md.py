"""The md memory backend of this tree against the one of a git ref, side by side in one run:
B11's in-process turns (memory on with N notes, review off) on three apps — this tree's md,
the ref's md, memory off — turn after turn in rotation, and the prefetch search of both on
the same notes in alternating blocks.

    python bench/tools/ab_memory_md.py --base HEAD~1 --notes 1000 --turns 200

The ref's ``plugins/memory_md/backend.py`` is loaded from ``git show`` as a second module and
registered as the backend ``md-base``; every other module is this tree's.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import b11_memory as b11
from aiohttp.test_utils import TestServer
from common import ROOT, stats

import agentik_memory
import agentik_memory_md
from agentik.core.app import AGENT
from agentik.core.memory import CATEGORIES
from agentik.core.testing import ScriptedLLM, make_app
from agentik.hookspecs import hookimpl
from agentik_memory_md.backend import MdMemory


def base_backend(ref: str, tmp: Path) -> type:
    source = subprocess.run(
        ["git", "show", f"{ref}:plugins/memory_md/backend.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = tmp / "backend_base.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("agentik_memory_md.backend_base", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.MdMemory


class BasePlugin:
    def __init__(self, cls: type) -> None:
        self.cls = cls

    @hookimpl
    def register_memory_backends(self, register: Any) -> None:
        register("md-base", lambda settings: self.cls(Path(settings["AGENTIK_MEMORY_DIR"])))


async def start_app(folder: Path | None, backend: str, base: BasePlugin) -> tuple[Any, Any]:
    env = {
        "AGENTIK_MEMORY_BACKEND": backend if folder else "off",
        "AGENTIK_MEMORY_DIR": str(folder or "/nonexistent"),
        "AGENTIK_MEMORY_REVIEW": "0",
        "AGENTIK_DB_PATH": ":memory:",
    }
    plugins = [
        ("agentik_memory", agentik_memory),
        ("agentik_memory_md", agentik_memory_md),
        ("md_base", base),
    ]
    app = make_app(llm=ScriptedLLM(delay=0.001), plugins=plugins, env=env)
    server = TestServer(app)
    await server.start_server()
    return server, app[AGENT]


async def searches(tmp: Path, notes: int, base: type, blocks: int) -> dict[str, Any]:
    out: dict[str, list[float]] = {"new": [], "base": []}
    memories = {}
    for side, cls in (("new", MdMemory), ("base", base)):
        folder = tmp / f"search-{side}"
        shutil.copytree(tmp / "notes", folder)
        memories[side] = cls(folder)
        await memories[side].start()
    queries = [b11.sentence(8, common=False) for _ in range(100)]
    for block in range(blocks + 1):
        for side, memory in memories.items():
            for q in queries:
                t0 = time.perf_counter()
                await memory.search(q, 5)
                if block:
                    out[side].append((time.perf_counter() - t0) * 1e6)
    for memory in memories.values():
        await memory.close()
    return {k: stats(v) for k, v in out.items()}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="ab-md-"))
    base = BasePlugin(base_backend(args.base, tmp))
    b11.write_notes(tmp / "notes", args.notes)
    sides = {"new": "md", "base": "md-base", "off": ""}
    apps = {}
    for side, backend in sides.items():
        folder = None
        if backend:
            folder = tmp / side
            shutil.copytree(tmp / "notes", folder)
        apps[side] = await start_app(folder, backend, base)
    convs = {side: await agent.create_conversation() for side, (_, agent) in apps.items()}
    # messages that hit: the words of a note (B11's random ones rarely reach the min score, so
    # no note is given and no use counted)
    # (without the vocabulary's most frequent words, as B11's queries: what stopwords remove)
    common = {w.capitalize() for w in b11.VOCAB[: b11.COMMON]} | set(b11.VOCAB[: b11.COMMON])
    notes = []
    for c in CATEGORIES:
        for n in await apps["new"][1].memory.list(c, 0, 10**6):
            words = [w for w in n.text.rstrip(".").split() if w not in common]
            if len(words) >= 3:
                notes.append(" ".join(words) + ".")
    times: dict[str, list[float]] = {f"{s}{k}": [] for s in sides for k in ("", "_cpu", "_turn")}
    try:
        for i in range(args.turns + 5):
            text = b11.rng.choice(notes) if args.hits else b11.sentence(8, common=False)
            order = list(sides)[i % 3 :] + list(sides)[: i % 3]  # rotated
            for side in order:
                wall, cpu, turn = await b11.first_token_ms(apps[side][1], convs[side], text)
                if i >= 5:
                    times[side].append(wall)
                    times[f"{side}_cpu"].append(cpu)
                    times[f"{side}_turn"].append(turn)
    finally:
        for server, _ in apps.values():
            await server.close()
    result = {
        "base": args.base,
        "notes": args.notes,
        "turns": args.turns,
        "hits": args.hits,
        "ttft_ms": {k: stats(v)["median"] for k, v in times.items()},
        "search_us": {
            k: v["median"] for k, v in (await searches(tmp, args.notes, base.cls, 3)).items()
        },
    }
    t = result["ttft_ms"]
    result["added_over_off_ms"] = {
        side: {
            "ttft_wall": t[side] - t["off"],
            "ttft_cpu": t[f"{side}_cpu"] - t["off_cpu"],
            "turn_cpu": t[f"{side}_turn"] - t["off_turn"],
        }
        for side in ("new", "base")
    }
    shutil.rmtree(tmp, ignore_errors=True)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", default="HEAD~1")
    parser.add_argument("--notes", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument(
        "--hits",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="each message is a note's text, so notes are given and their uses counted",
    )
    print(json.dumps(asyncio.run(main(parser.parse_args())), indent=1))
