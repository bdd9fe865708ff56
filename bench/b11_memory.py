"""B11: long-term memory (the md backend) — prefetch search over 1k / 10k / 100k notes vs a bare
FTS5 bm25 query on the same notes, the turn's added TTFT with memory on vs off, a save while
10k notes exist, and start-up.

Notes are sentences of words drawn (Zipf) from a 20,000-word vocabulary of random letter
strings, spread over the three files, written by the backend's own renderer. Queries are 8-word
sentences from the same vocabulary without its 300 most frequent words (what the stopwords
remove from real text). agentik: ``MdMemory.search(q, 5)`` (the stat of the three files, the
query's terms, the FTS5 query, the relevance of the notes found). Floor: the same
``SELECT rowid, text … MATCH … ORDER BY rank LIMIT 5`` with the match expression prepared
beforehand, on a raw sqlite3 connection to a copy of the same index, in the same process,
alternating blocks.
TTFT: in-process turns through the memory plugin and a ScriptedLLM (send to StartResponse),
review off, an in-memory database, alternating with the same turns on an app with memory off.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import shutil
import sqlite3
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import common
from aiohttp.test_utils import TestServer
from common import row, stats

import agentik_memory
import agentik_memory_md
from agentik.core.app import AGENT
from agentik.core.memory import CATEGORIES, Note
from agentik.core.testing import ScriptedLLM, make_app
from agentik.core.types import TextPart
from agentik_memory_md import notefile, terms
from agentik_memory_md.backend import INDEX, MdMemory

VOCAB_SIZE = 20_000
COMMON = 300  # the most frequent words: they are in notes, but a query's stopwords drop them
rng = random.Random(11)
LETTERS = "abcdefghijklmnopqrstuvwxyz"
VOCAB = sorted({"".join(rng.choices(LETTERS, k=rng.randint(4, 10))) for _ in range(VOCAB_SIZE)})
rng.shuffle(VOCAB)
WEIGHTS = list(itertools.accumulate(1 / (i + 1) for i in range(len(VOCAB))))  # Zipf
RARE = [w - WEIGHTS[COMMON - 1] for w in WEIGHTS[COMMON:]]


def sentence(n: int, common: bool = True) -> str:
    words, weights = (VOCAB, WEIGHTS) if common else (VOCAB[COMMON:], RARE)
    return " ".join(rng.choices(words, cum_weights=weights, k=n)).capitalize() + "."


def write_notes(folder: Path, count: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC).replace(microsecond=0)
    for c, category in enumerate(CATEGORIES):
        notes = [
            Note(f"n{c}x{i:06d}", category, sentence(rng.randint(6, 16)), "AUTO_REVIEW", now)
            for i in range(c, count, len(CATEGORIES))
        ]
        chunks = [notefile.note_chunk(n) for n in notes]
        (folder / f"{category}.md").write_text(notefile.render(chunks))


def floor_query(db: sqlite3.Connection, expression: str) -> list[Any]:
    return db.execute(
        "SELECT rowid, text FROM notes WHERE notes MATCH ? ORDER BY rank LIMIT 5", (expression,)
    ).fetchall()


async def search_vs_floor(tmp: Path, count: int, reps: int, n: int) -> dict[str, Any]:
    folder = tmp / f"mem{count}"
    write_notes(folder, count)
    memory = MdMemory(folder)
    t0 = time.perf_counter()
    await memory.start()
    cold = time.perf_counter() - t0
    await memory.close()
    memory = MdMemory(folder)
    t0 = time.perf_counter()
    await memory.start()
    warm = time.perf_counter() - t0
    memory._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # type: ignore[union-attr]
    shutil.copy(folder / INDEX, tmp / f"floor{count}.sqlite3")
    raw = sqlite3.connect(tmp / f"floor{count}.sqlite3")
    queries = [sentence(8, common=False) for _ in range(n)]
    expressions = [terms.match_expression(terms.query_terms(q)) for q in queries]
    pc = time.perf_counter
    ours: list[float] = []
    floor: list[float] = []
    hits = 0
    for rep in range(reps + 1):
        keep = rep > 0  # the first block warms the caches
        for q in queries:
            t0 = pc()
            found = await memory.search(q, 5)
            if keep:
                ours.append((pc() - t0) * 1e6)
                hits += bool(found)
        for e in expressions:
            t0 = pc()
            floor_query(raw, e)
            if keep:
                floor.append((pc() - t0) * 1e6)
    raw.close()
    await memory.close()
    return {
        "ours": stats(ours),
        "floor": stats(floor),
        "cold_start_s": cold,
        "warm_start_s": warm,
        "hit_rate": hits / len(ours),
    }


async def save_with(tmp: Path, count: int, n: int) -> dict[str, float]:
    folder = tmp / f"save{count}"
    write_notes(folder, count)
    memory = MdMemory(folder)
    await memory.start()
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        await memory.save(CATEGORIES[i % 3], sentence(10), "USER")
        times.append((time.perf_counter() - t0) * 1e3)
    await memory.close()
    return stats(times)


async def start_app(tmp: Path, memory: int | None) -> tuple[TestServer, Any]:
    """An app with memory on the ``memory``-note folder (None: memory off), review off."""
    env = {
        "AGENTIK_MEMORY_BACKEND": "md" if memory else "off",
        "AGENTIK_MEMORY_DIR": str(tmp / f"mem{memory}"),
        "AGENTIK_MEMORY_REVIEW": "0",
        "AGENTIK_DB_PATH": ":memory:",  # no fsync in the measured path: only memory differs
    }
    plugins = [("agentik_memory", agentik_memory), ("agentik_memory_md", agentik_memory_md)]
    # chunks 1 ms apart, as from a network: TTFT ends at the first token, before the turn ends
    app = make_app(llm=ScriptedLLM(delay=0.001), plugins=plugins, env=env)
    server = TestServer(app)
    await server.start_server()
    return server, app[AGENT]


async def first_token_ms(agent: Any, conv: Any, text: str) -> tuple[float, float, float]:
    """(wall, process CPU) from send to StartResponse, in ms; then wait until the turn and its
    background jobs end: the third is the process CPU of the whole turn, jobs included (every
    thread's: the uses bump's file writes ran on one)."""
    events = conv.events()
    first = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0)
    t0, c0 = time.perf_counter(), time.process_time()
    await conv.send([TextPart(text)])
    while (await first).type != "StartResponse":
        first = asyncio.ensure_future(anext(events))
    took = ((time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3)
    await events.aclose()
    await conv.wait_idle()
    await agent.jobs.wait_idle()  # the uses bump runs in the background, not in TTFT
    return (*took, (time.process_time() - c0) * 1e3)


async def ttft(tmp: Path, notes: int, n: int) -> dict[str, dict[str, float]]:
    """TTFT (wall and CPU) with memory on (``notes`` notes) and off, alternating turns."""
    apps = [await start_app(tmp, notes), await start_app(tmp, None)]
    convs = [await agent.create_conversation() for _, agent in apps]
    times: dict[str, list[float]] = {
        f"{side}{kind}": [] for side in ("on", "off") for kind in ("", "_cpu", "_turn")
    }
    try:
        for i in range(n + 5):
            text = sentence(8, common=False)
            for side, (_, agent), conv in zip(("on", "off"), apps, convs, strict=True):
                wall, cpu, turn = await first_token_ms(agent, conv, text)
                if i >= 5:
                    times[side].append(wall)
                    times[f"{side}_cpu"].append(cpu)
                    times[f"{side}_turn"].append(turn)
    finally:
        for server, _ in apps:
            await server.close()
    return {k: stats(v) for k, v in times.items()}


async def main(args: Any) -> dict[str, Any]:
    tmp = common.tmpdir() / f"b11-{os.getpid()}"
    reps = common.repeats(args, 5, 2)
    sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    searches = {n: await search_vs_floor(tmp, n, reps, 100) for n in sizes}
    turns = 30 if args.quick else 100
    ttfts = {n: await ttft(tmp, n, turns) for n in (1_000, 10_000)}
    saves = await save_with(tmp, 10_000, 30 if args.quick else 100)
    rows = []
    for n, r in searches.items():
        ratio = r["ours"]["median"] / r["floor"]["median"]
        rows.append(
            row(
                f"prefetch search, {n:,} notes",
                r["ours"],
                r["floor"],
                unit="µs",
                target="≤ 1.2x",
                met=ratio <= 1.2,
            )
        )
    for n, t in ttfts.items():
        for kind, what in (
            ("", "TTFT in process (wall)"),
            ("_cpu", "TTFT in process (process CPU)"),
            ("_turn", "CPU per turn in process, background jobs included"),
        ):
            on, off = t[f"on{kind}"], t[f"off{kind}"]
            added = on["median"] - off["median"]
            rows.append(
                row(
                    f"{what}, memory on ({n:,} notes) vs off",
                    on,
                    off,
                    unit="ms",
                    target="≤ +1 ms p50",
                    met=added <= 1.0,
                    note=f"added {added:.3f} ms",
                )
            )
    rows.append(
        row(
            "save while 10k notes exist",
            saves,
            unit="ms",
            target="≤ 5 ms p50",
            met=saves["median"] <= 5.0,
        )
    )
    for n, r in searches.items():
        for key, what in (("cold_start_s", "no index yet"), ("warm_start_s", "index present")):
            rows.append(
                row(f"start-up with {n:,} notes, {what}", r[key] * 1e3, unit="ms", target="(info)")
            )
    notes = [
        f"{reps} alternating blocks x 100 queries per size after a warm-up block; share of "
        "queries with a hit: "
        + ", ".join(f"{n:,}: {r['hit_rate']:.0%}" for n, r in searches.items()),
        "the floor gets the match expression built in advance; agentik builds it from the text",
        f"TTFT: {turns} turns per app, alternating; the database in memory on both sides",
        "save: the whole category file (a third of the notes) rewritten to a temporary file, "
        "fsynced and renamed, then the index row inserted",
    ]
    shutil.rmtree(tmp, ignore_errors=True)
    return {"id": "B11", "title": "long-term memory (md)", "rows": rows, "notes": notes}


if __name__ == "__main__":
    common.cli(main)
