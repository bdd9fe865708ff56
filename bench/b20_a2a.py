"""B20: an A2A streamed turn (SendStreamingMessage, 200-chunk fake reply) against the agent's own
SSE turn on the same ``agentik serve`` and the same reply: server CPU per turn, in the same run;
and against a2a-sdk's reference server (Starlette + uvicorn, bench/floors/a2a_reference.py) with
a trivial executor doing the same relay.

Each window is K sequential turns in one conversation (A2A: one context) that had one turn
before the window; CPU is the server process's (the fake LLM runs in its own process).
"""

from __future__ import annotations

import uuid
from typing import Any

import common
from common import CpuMeter, TurnClient, row, spec_text, stats

CHUNKS = 200
TURNS = 20  # per window


def a2a_body(text: str, context_id: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": str(uuid.uuid4()),
        "method": "SendStreamingMessage",
        "params": {
            "message": {
                "role": "ROLE_USER",
                "messageId": str(uuid.uuid4()),
                "contextId": context_id,
                "parts": [{"text": text}],
            }
        },
    }


async def a2a_turn(s: Any, port: int, context_id: str, text: str) -> None:
    url = f"http://{common.HOST}:{port}/a2a/"
    async with s.post(url, json=a2a_body(text, context_id), headers={"A2A-Version": "1.0"}) as r:
        assert r.status == 200, r.status
        body = await r.read()
    chunks = body.count(b'"artifactUpdate"')
    # one update per chunk, or fewer: chunks the task's follower reads together are joined
    assert 1 <= chunks <= CHUNKS, (chunks, body[-300:])
    assert b"TASK_STATE_COMPLETED" in body[-400:], body[-400:]


async def a2a_window(s: Any, proc: common.Proc) -> int:
    context = str(uuid.uuid4())
    text = spec_text(CHUNKS)
    await a2a_turn(s, proc.port, context, text)  # the context exists before the window
    with CpuMeter(proc.pid) as m:
        for _ in range(TURNS):
            await a2a_turn(s, proc.port, context, text)
    return m.ns


async def sse_window(c: TurnClient, proc: common.Proc) -> int:
    cid = await c.new_conversation()
    text = spec_text(CHUNKS)
    await c.turn(text, cid)
    with CpuMeter(proc.pid) as m:
        for _ in range(TURNS):
            got = await c.turn(text, cid)
            assert got["tokens"] == CHUNKS, got
    return m.ns


async def main(args: Any) -> dict[str, Any]:
    reps = common.repeats(args, 5, 2)
    fake = common.start_fake()
    up = f"http://{common.HOST}:{fake.port}/v1"
    agentik = reference = None
    a2a: list[float] = []
    own: list[float] = []
    ref: list[float] = []
    try:
        agentik = common.start_agentik(fake.port)
        reference = common.start_floor("a2a_reference.py", "--upstream", up)
        async with common.session() as s:
            c = TurnClient(agentik.port, s)
            await a2a_window(s, agentik)  # warm-up
            await sse_window(c, agentik)
            await a2a_window(s, reference)
            for _ in range(reps):
                a2a.append(await a2a_window(s, agentik) / TURNS / 1e3)
                own.append(await sse_window(c, agentik) / TURNS / 1e3)
                ref.append(await a2a_window(s, reference) / TURNS / 1e3)
    finally:
        common.stop_all(agentik, reference, fake)
    sa, so, sr = stats(a2a), stats(own), stats(ref)
    rows = [
        row(
            f"server CPU per A2A streamed turn ({CHUNKS} chunks) vs the agent's own SSE turn",
            sa,
            so,
            unit="µs",
            target="≤ 1.3x",
            met=sa["median"] / so["median"] <= 1.3,
        ),
        row(
            f"server CPU per A2A streamed turn ({CHUNKS} chunks) vs a2a-sdk's reference server",
            sa,
            sr,
            unit="µs",
            target="< 1x (faster)",
            met=sa["median"] < sr["median"],
        ),
    ]
    notes = [
        f"{reps} alternating repeats; each is a window of {TURNS} sequential turns in one "
        "conversation (A2A: one context) that had one turn before it",
        "reference: a2a-sdk DefaultRequestHandler + InMemoryTaskStore + JSON-RPC routes on "
        "Starlette/uvicorn, an executor relaying the fake's deltas with TaskUpdater.add_artifact",
        "agentik's A2A turn also writes its task in SQLite (committed at accept, durably at "
        "the end with its status history); the reference keeps tasks in memory",
    ]
    return {"id": "B20", "title": "A2A streamed turn", "rows": rows, "notes": notes}


if __name__ == "__main__":
    common.cli(main)
