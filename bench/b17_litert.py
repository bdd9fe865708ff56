"""B17: on-device LiteRT-LM (the tiny model, tests/models/tiny.litertlm) through agentik vs
calling ``litert_lm`` directly, in the same process and run, alternating A/B every repeat.

agentik: ``LiteRtConversation.stream([UserInput("hi")])`` on a ``LiteRtBackend`` built by the
plugin's ``make_backend`` (its engine settings: CPU backend, ``AGENTIK_GOOGLE_THREADS`` 1 and 4,
a cache dir), consumed on the event loop. Direct (the floor): the same engine, the same
``create_conversation`` / ``send_message_async`` calls, iterated synchronously on the calling
thread. Two shapes: a fresh conversation every turn (creation timed, close not), and a reused
conversation (its first turn untimed, then 4 timed turns: the tiny model's context is 128
tokens, 5 turns fit). Measured: time to first text chunk (TTFT) and wall µs per turn (also per
streamed token: the reply is 8 text chunks, "Hello from the tiny model.").

Event-loop lag: a 1 ms sleeper's overshoot while agentik turns generate back to back; floor:
the same while direct turns run on a plain thread (``asyncio.to_thread``: what any threaded
design pays on this machine, GIL and CPU included); also an idle loop for reference.

Full turn: ``ChatAgent`` (built as ``create_app`` builds it, ``:memory:`` DB) ``send`` +
``wait_idle`` on a fresh agentik conversation per turn, vs a fresh direct turn.
"""

from __future__ import annotations

import asyncio
import gc
import time
from pathlib import Path
from typing import Any

import common
import litert_lm
from common import row, stats

import agentik_llm_litert as plugin
from agentik.core.llm import TextDelta, UserInput
from agentik.core.settings import Settings

MODEL = common.ROOT / "tests" / "models" / "tiny.litertlm"
TURNS_REUSED = 4  # timed turns per reused conversation (after one untimed)
BLOCK = 8  # turns per A/B block (the noise here drifts within seconds)
LAG_TARGET_MS = 5.0
RATIO_TARGET = 1.10
HI = {"role": "user", "content": "hi"}
pc = time.perf_counter_ns


def make_backend(threads: int, cache: Path) -> Any:
    return plugin.make_backend(
        Settings(
            plugin.SETTINGS,
            {
                "AGENTIK_GOOGLE_MODEL_PATH": str(MODEL),
                "AGENTIK_GOOGLE_THREADS": str(threads),
                "AGENTIK_GOOGLE_CACHE_DIR": str(cache),
            },
        )
    )


# --- direct (the floor) -------------------------------------------------------------------


def direct_create(engine: Any) -> Any:
    return engine.create_conversation(
        messages=None, system_message=None, tools=None, automatic_tool_calling=False
    )


def direct_send(conv: Any, t0: int) -> tuple[int, int, int]:
    """One turn on ``conv``; (ttft ns, total ns, text chunks) from ``t0``."""
    first = 0
    n = 0
    for msg in conv.send_message_async(HI):
        for c in msg.contents or ():
            if getattr(c, "text", None):
                n += 1
                if not first:
                    first = pc()
    return first - t0, pc() - t0, n


def direct_fresh(engine: Any, n: int, out: dict[str, list[float]]) -> None:
    for _ in range(n):
        t0 = pc()
        conv = direct_create(engine)
        ttft, total, k = direct_send(conv, t0)
        conv.close()
        record(out, ttft, total, k)


def direct_reused(engine: Any, n: int, out: dict[str, list[float]]) -> None:
    for _ in range(max(1, n // TURNS_REUSED)):
        conv = direct_create(engine)
        direct_send(conv, pc())  # untimed first turn
        for _ in range(TURNS_REUSED):
            ttft, total, k = direct_send(conv, pc())
            record(out, ttft, total, k)
        conv.close()


# --- agentik --------------------------------------------------------------------------------


async def agentik_send(conv: Any, t0: int) -> tuple[int, int, int]:
    first = 0
    n = 0
    async for chunk in conv.stream([UserInput("hi")]):
        if isinstance(chunk, TextDelta):
            n += 1
            if not first:
                first = pc()
    return first - t0, pc() - t0, n


async def agentik_fresh(backend: Any, n: int, out: dict[str, list[float]]) -> None:
    for _ in range(n):
        t0 = pc()
        conv = backend.create_conversation("", [], [])
        ttft, total, k = await agentik_send(conv, t0)
        await conv.aclose()
        record(out, ttft, total, k)


async def agentik_reused(backend: Any, n: int, out: dict[str, list[float]]) -> None:
    for _ in range(max(1, n // TURNS_REUSED)):
        conv = backend.create_conversation("", [], [])
        await agentik_send(conv, pc())
        for _ in range(TURNS_REUSED):
            ttft, total, k = await agentik_send(conv, pc())
            record(out, ttft, total, k)
        await conv.aclose()


def record(out: dict[str, list[float]], ttft: int, total: int, k: int) -> None:
    out["ttft"].append(ttft / 1e3)
    out["turn"].append(total / 1e3)
    out["token"].append(total / 1e3 / max(k, 1))
    out["chunks"].append(k)


def bucket() -> dict[str, list[float]]:
    return {"ttft": [], "turn": [], "token": [], "chunks": []}


# --- event-loop lag -------------------------------------------------------------------------


async def sleeper(lags: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        t0 = pc()
        await asyncio.sleep(0.001)
        lags.append((pc() - t0) / 1e6 - 1.0)  # ms over the 1 ms asked for


async def lag_while(coro: Any) -> list[float]:
    lags: list[float] = []
    stop = asyncio.Event()
    task = asyncio.create_task(sleeper(lags, stop))
    await asyncio.sleep(0)
    try:
        await coro
    finally:
        stop.set()
        await task
    return lags


# --- full agentik turn ----------------------------------------------------------------------


async def open_agent(backend: Any) -> Any:
    from agentik.core.app import build_agent, load_settings
    from agentik.core.testing import test_plugins

    pm = test_plugins()
    agent = build_agent(pm, load_settings(pm, {"AGENTIK_DB_PATH": ":memory:"}), backend)
    await agent.open()
    return agent


async def full_turns(agent: Any, n: int, out: list[float]) -> None:
    from agentik.core.types import TextPart

    for _ in range(n):
        conv = await agent.create_conversation()
        t0 = pc()
        await conv.send([TextPart("hi")])
        await conv.wait_idle()
        out.append((pc() - t0) / 1e3)


# --- the run --------------------------------------------------------------------------------


async def main(args: Any) -> dict[str, Any]:
    reps = common.repeats(args, 7, 2)
    n = 20 if args.quick else 40
    thread_counts = [int(t) for t in args.threads.split(",")]
    tmp = common.tmpdir()
    rows: list[dict[str, Any]] = []
    raw: dict[str, Any] = {}
    notes: list[str] = []
    gc.freeze()
    for threads in thread_counts:
        backend = make_backend(threads, tmp / f"cache-{threads}")
        await backend.start()
        engine = backend.engine  # direct calls use the very same engine (from this thread)
        s = {k: bucket() for k in ("a_fresh", "d_fresh", "a_reused", "d_reused")}
        full: dict[str, list[float]] = {"agentik": [], "direct": []}
        lags: list[float] = []
        floor_lags: list[float] = []
        # warm-up
        direct_fresh(engine, 5, bucket())
        await agentik_fresh(backend, 5, bucket())
        agent = await open_agent(backend) if not args.no_full else None
        if agent is not None:
            await full_turns(agent, 3, [])
        for r in range(reps):  # alternate A/B in blocks of BLOCK turns, and which goes first
            for b in range(n // BLOCK):
                order = [0, 1] if (r + b) % 2 == 0 else [1, 0]
                for which in order:
                    if which == 0:
                        direct_fresh(engine, BLOCK, s["d_fresh"])
                        direct_reused(engine, BLOCK, s["d_reused"])
                    else:
                        await agentik_fresh(backend, BLOCK, s["a_fresh"])
                        await agentik_reused(backend, BLOCK, s["a_reused"])
            if agent is not None:
                direct_fresh(engine, n // 2, (b := bucket()))
                full["direct"] += b["turn"]
                await full_turns(agent, n // 2, full["agentik"])
            lags += await lag_while(agentik_fresh(backend, n, bucket()))
            # the lag floor of any threaded design: direct turns on a plain thread
            floor_lags += await lag_while(asyncio.to_thread(direct_fresh, engine, n, bucket()))
        idle = await lag_while(asyncio.sleep(0.3))
        if agent is not None:
            await agent.close()
        await backend.aclose()
        st = {k: {m: stats(v) for m, v in d.items()} for k, d in s.items()}
        raw[f"threads={threads}"] = {
            **st,
            "lag_ms": stats(lags),
            "thread_floor_lag_ms": stats(floor_lags),
            "idle_lag_ms": stats(idle),
            "full_turn": {k: stats(v) for k, v in full.items()},
        }
        tag = f"{threads} thread{'s' if threads > 1 else ''}"
        for shape in ("fresh", "reused"):
            a, d = st[f"a_{shape}"], st[f"d_{shape}"]
            what = "fresh conversation" if shape == "fresh" else "reused conversation"
            for metric, label in (
                ("ttft", "time to first token"),
                ("turn", "turn wall"),
                ("token", "wall per streamed token"),
            ):
                ratio = a[metric]["median"] / d[metric]["median"]
                rows.append(
                    row(
                        f"{label}, {what}, {tag}, vs direct litert_lm",
                        a[metric],
                        d[metric],
                        unit="µs",
                        target="≤ 1.10x" if metric != "token" else "(info)",
                        met=ratio <= RATIO_TARGET if metric != "token" else None,
                        note=(
                            f"{1e6 / a[metric]['median']:.0f} vs "
                            f"{1e6 / d[metric]['median']:.0f} tok/s"
                            if metric == "token"
                            else ""
                        ),
                    )
                )
        ls, fl, il = stats(lags), stats(floor_lags), stats(idle)
        over = sum(x > LAG_TARGET_MS for x in lags)
        fover = sum(x > LAG_TARGET_MS for x in floor_lags)
        rows.append(
            row(
                f"event-loop lag (1 ms sleeper overshoot) while turns generate, {tag}, "
                "vs direct turns on a plain thread",
                ls,
                fl,
                unit="ms",
                target="max ≤ 5 ms",
                met=ls["max"] <= LAG_TARGET_MS,
                note=(
                    f"max {ls['max']:.2f} ms, {over} of {ls['n']} sleeps > 5 ms; floor max "
                    f"{fl['max']:.2f} ms, {fover} of {fl['n']} > 5 ms; idle loop: p99 "
                    f"{il['p99']:.2f}, max {il['max']:.2f} ms"
                ),
            )
        )
        if agent is not None:
            rows.append(
                row(
                    f"full agentik turn (ChatAgent send+wait_idle), {tag}, vs direct fresh turn",
                    stats(full["agentik"]),
                    stats(full["direct"]),
                    unit="µs",
                    target="(info)",
                    note=":memory: DB; includes the store and the turn engine",
                )
            )
        chunks = st["a_fresh"]["chunks"]["median"], st["d_fresh"]["chunks"]["median"]
        notes.append(
            f"{tag}: text chunks per reply agentik {chunks[0]:.0f}, direct {chunks[1]:.0f}"
        )
    notes.append(
        f"{reps} repeats x {n} turns per shape, A/B alternating every {BLOCK} turns "
        f"(reused: 1 untimed + {TURNS_REUSED} timed turns per conversation); same engine "
        "for both sides; "
        "stats over all turns"
    )
    notes.append("direct = synchronous iteration on the calling thread (it blocks its caller)")
    return {
        "id": "B17",
        "title": "on-device LiteRT-LM",
        "rows": rows,
        "notes": notes,
        "raw": raw,
        "litert_lm": getattr(litert_lm, "__version__", "?"),
    }


def add_args(p: Any) -> None:
    p.add_argument("--threads", default="1,4", help="engine thread counts, comma list")
    p.add_argument("--no-full", action="store_true", help="skip the full ChatAgent turn rows")


if __name__ == "__main__":
    common.cli(main, add_args)
