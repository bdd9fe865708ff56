"""B22: an AG-UI streamed turn (``POST /agui`` -> ``RUN_FINISHED``) vs the agent's own SSE turn
(``POST /agentik/conversations``, ``GET …/events``, ``POST …/messages`` -> ``event: End``) on
the same ``agentik serve`` and the same 200-chunk, 600-character fake reply.

Reported: the server's CPU per turn (schedstat of the server process, all threads) and the
wall time per turn, AG-UI over the agent's SSE turn in the same run (goal ≤ 1.3x CPU). Two
cases: every turn a new conversation (AG-UI: a new thread), and turns on one existing
conversation (AG-UI: a client in step, sending its history, so no snapshot). Turns alternate.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import common
from common import CpuMeter, TurnClient, reply_text, row, spec_text, stats


class AguiClient:
    """A bare AG-UI client: POST a RunAgentInput, read the SSE body to its end."""

    def __init__(self, port: int, session: Any) -> None:
        self.url = f"http://{common.HOST}:{port}/agui"
        self.session = session

    async def turn(self, thread: str, messages: list[dict[str, Any]]) -> tuple[str, bytes]:
        """One run; the reply's text and the raw body."""
        body = {
            "threadId": thread,
            "runId": uuid.uuid4().hex,
            "messages": messages,
            "tools": [],
            "context": [],
            "state": {},
            "forwardedProps": {},
        }
        headers = {"Accept": "text/event-stream"}
        async with self.session.post(self.url, json=body, headers=headers) as r:
            assert r.status == 200, (r.status, await r.text())
            data = await r.read()
        events = [json.loads(f.removeprefix(b"data: ")) for f in data.split(b"\n\n") if f]
        assert events[-1]["type"] == "RUN_FINISHED", events[-1]
        text = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
        return text, data


def user(text: str) -> dict[str, Any]:
    return {"id": uuid.uuid4().hex, "role": "user", "content": text}


async def main(args: Any) -> dict[str, Any]:
    n = 8 if args.quick else 40
    text, reply = spec_text(200, 600), reply_text(200, 600)
    fake = common.start_fake()
    agentik = common.start_agentik(fake.port)
    rows: list[dict[str, Any]] = []
    raw: dict[str, Any] = {}
    try:
        async with common.session() as s:
            sse, agui = TurnClient(agentik.port, s), AguiClient(agentik.port, s)
            for _ in range(3):  # warm-up, and both see the whole reply
                assert (await sse.turn(text))["tokens"] == 200
                assert (await agui.turn(uuid.uuid4().hex, [user(text)]))[0] == reply
            # case 1: a new conversation / a new thread per turn
            cpu: dict[str, list[float]] = {"agui": [], "sse": []}
            deltas: list[float] = []  # TEXT_MESSAGE_CONTENT events per AG-UI turn
            paced_deltas: list[float] = []
            wall: dict[str, list[float]] = {"agui": [], "sse": []}
            for _ in range(n):
                with CpuMeter(agentik.pid) as m:
                    await sse.turn(text)
                cpu["sse"].append(m.ns / 1e6)
                wall["sse"].append(m.wall * 1e3)
                with CpuMeter(agentik.pid) as m:
                    said, data = await agui.turn(uuid.uuid4().hex, [user(text)])
                assert said == reply
                deltas.append(data.count(b'"type":"TEXT_MESSAGE_CONTENT"'))
                cpu["agui"].append(m.ns / 1e6)
                wall["agui"].append(m.wall * 1e3)
            # case 2: turns on one conversation; the AG-UI client sends its history (in step)
            cid, thread = await sse.new_conversation(), uuid.uuid4().hex
            history: list[dict[str, Any]] = []
            cpu2: dict[str, list[float]] = {"agui": [], "sse": []}
            for _ in range(n):
                with CpuMeter(agentik.pid) as m:
                    await sse.turn(text, cid=cid)
                cpu2["sse"].append(m.ns / 1e6)
                message = user(text)
                with CpuMeter(agentik.pid) as m:
                    said, data = await agui.turn(thread, [*history, message])
                assert said == reply and b"MESSAGES_SNAPSHOT" not in data
                cpu2["agui"].append(m.ns / 1e6)
                history += [message, {"id": uuid.uuid4().hex, "role": "assistant", "content": "…"}]
            # case 3: a paced reply (a chunk every 2 ms, 500 tokens/s): the stream keeps up, so
            # every chunk is its own TEXT_MESSAGE_CONTENT event, encoded and written alone
            paced = spec_text(200, 600, delay=0.002)
            cpu3: dict[str, list[float]] = {"agui": [], "sse": []}
            for _ in range(max(2, n // 2)):
                with CpuMeter(agentik.pid) as m:
                    await sse.turn(paced)
                cpu3["sse"].append(m.ns / 1e6)
                with CpuMeter(agentik.pid) as m:
                    said, data = await agui.turn(uuid.uuid4().hex, [user(paced)])
                assert said == reply
                cpu3["agui"].append(m.ns / 1e6)
                paced_deltas.append(data.count(b'"type":"TEXT_MESSAGE_CONTENT"'))
    finally:
        common.stop_all(agentik, fake)
    for name, (c, w) in {
        "new conversation": (cpu, wall),
        "existing conversation": (cpu2, None),
        "new conversation, paced reply (2 ms a chunk)": (cpu3, None),
    }.items():
        a, f = stats(c["agui"]), stats(c["sse"])
        raw[name] = {"cpu_agui": a, "cpu_sse": f}
        rows.append(
            row(
                f"server CPU per 200-chunk turn, {name}: AG-UI vs the agent's SSE",
                a,
                f,
                unit="ms",
                target="≤ 1.3x",
                met=a["median"] / f["median"] <= 1.3,
                note=f"AG-UI adds {a['median'] - f['median']:+.2f} ms CPU",
            )
        )
        if w is not None:
            wa, wf = stats(w["agui"]), stats(w["sse"])
            raw[name] |= {"wall_agui": wa, "wall_sse": wf}
            rows.append(
                row(
                    f"wall per 200-chunk turn, {name}: AG-UI (1 request) vs the agent's SSE "
                    "(create + SSE + POST)",
                    wa,
                    wf,
                    unit="ms",
                    target="(info; Pydantic AI's AG-UI endpoint: +44 ms per turn)",
                    note=f"AG-UI {wa['median'] - wf['median']:+.1f} ms",
                )
            )
    return {
        "id": "B22",
        "title": "AG-UI turn vs the agent's own SSE turn",
        "rows": rows,
        "notes": [
            f"{n} turns of each kind per case, alternating; the load client and the fake LLM "
            "share the CPUs with the server",
            f"reply: {text!r} (200 content chunks, 600 characters), agentik's default settings",
            "the AG-UI stream joins the deltas that arrive while it writes: median "
            f"{stats(deltas)['median']:.0f} TEXT_MESSAGE_CONTENT events per 200-chunk turn "
            f"(min {min(deltas):.0f}, max {max(deltas):.0f}) at the fake's full speed; "
            f"median {stats(paced_deltas)['median']:.0f} with the paced reply",
        ],
        "raw": raw,
        "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


if __name__ == "__main__":
    common.cli(main)
