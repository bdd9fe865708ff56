"""B23: the two newer doors against the agent's own SSE turn, on the same ``agentik serve`` and
the same 200-chunk, 600-character fake reply: a streamed ``/v1/chat/completions`` turn (a bare
aiohttp client reading the chunks to ``data: [DONE]``) and an MCP ``chat`` call on ``/mcp`` (the
``mcp`` SDK's own client, 2026-07-28, asking for progress, so the reply streams as progress
notifications).

Reported: the server's CPU per turn (schedstat of the server process, all threads), each door
over the agent's SSE turn in the same run (goal ≤ 1.3x). Three cases: every turn a new
conversation; turns on one existing conversation (the OpenAI client resends the whole history,
the MCP client passes the conversation id); a paced reply (a chunk every 2 ms). Turns alternate
SSE, OpenAI, MCP.
"""

from __future__ import annotations

import json
import time
from typing import Any

import common
from common import CpuMeter, TurnClient, reply_text, row, spec_text, stats


class OpenAIClient:
    """A bare OpenAI-style client: POST a streamed completion, read the chunks to [DONE]."""

    def __init__(self, port: int, session: Any) -> None:
        self.url = f"http://{common.HOST}:{port}/v1/chat/completions"
        self.session = session

    async def turn(self, messages: list[dict[str, Any]]) -> str:
        body = {"model": "agentik", "messages": messages, "stream": True}
        async with self.session.post(self.url, json=body) as r:
            assert r.status == 200, (r.status, await r.text())
            data = await r.read()
        frames = [f.removeprefix(b"data: ") for f in data.split(b"\n\n") if f]
        assert frames[-1] == b"[DONE]", frames[-1]
        chunks = [json.loads(f) for f in frames[:-1]]
        return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])


class MCPClient:
    """The mcp SDK's client on one connection; ``chat`` with a progress callback."""

    def __init__(self, port: int) -> None:
        from mcp import Client

        self.client = Client(f"http://{common.HOST}:{port}/mcp")
        self.notes = 0  # progress notifications received

    async def __aenter__(self) -> MCPClient:
        await self.client.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.client.__aexit__(*exc)

    async def turn(self, text: str, cid: str | None = None) -> tuple[str, str]:
        async def progress(done: float, total: float | None, message: str | None) -> None:
            self.notes += 1

        args = {"text": text, **({"conversationId": cid} if cid else {})}
        result = await self.client.call_tool("chat", args, progress_callback=progress)
        assert not result.is_error, result.content
        return result.structured_content["reply"], result.structured_content["conversationId"]


async def main(args: Any) -> dict[str, Any]:
    n = 8 if args.quick else 30
    text, reply = spec_text(200, 600), reply_text(200, 600)
    paced = spec_text(200, 600, delay=0.002)
    fake = common.start_fake()
    agentik = common.start_agentik(fake.port)
    rows: list[dict[str, Any]] = []
    raw: dict[str, Any] = {}
    notes_per_turn: list[float] = []
    try:
        async with common.session() as s, MCPClient(agentik.port) as mcp:
            sse, oai = TurnClient(agentik.port, s), OpenAIClient(agentik.port, s)
            for _ in range(3):  # warm-up (the MCP SDK loads at the first call), whole replies
                assert (await sse.turn(text))["tokens"] == 200
                assert await oai.turn([{"role": "user", "content": text}]) == reply
                assert (await mcp.turn(text))[0] == reply

            async def measure(case: str, turns: int, one: Any) -> None:
                cpu: dict[str, list[float]] = {"sse": [], "openai": [], "mcp": []}
                for i in range(turns):
                    for door in cpu:
                        before = mcp.notes
                        with CpuMeter(agentik.pid) as m:
                            await one(door, i)
                        cpu[door].append(m.ns / 1e6)
                        if door == "mcp" and case == "new conversation":
                            notes_per_turn.append(mcp.notes - before)
                raw[case] = {door: stats(values) for door, values in cpu.items()}
                base = raw[case]["sse"]
                for door, label in (("openai", "OpenAI streamed"), ("mcp", "MCP chat")):
                    got = raw[case][door]
                    rows.append(
                        row(
                            f"server CPU per 200-chunk turn, {case}: {label} vs the agent's SSE",
                            got,
                            base,
                            unit="ms",
                            target="≤ 1.3x",
                            met=got["median"] / base["median"] <= 1.3,
                            note=f"{label} adds {got['median'] - base['median']:+.2f} ms CPU",
                        )
                    )

            async def new(door: str, i: int) -> None:
                if door == "sse":
                    assert (await sse.turn(text))["tokens"] == 200
                elif door == "openai":
                    assert await oai.turn([{"role": "user", "content": text}]) == reply
                else:
                    assert (await mcp.turn(text))[0] == reply

            await measure("new conversation", n, new)

            cid = await sse.new_conversation()
            history: list[dict[str, Any]] = []
            mcp_cid: list[str] = []

            async def existing(door: str, i: int) -> None:
                if door == "sse":
                    assert (await sse.turn(text, cid=cid))["tokens"] == 200
                elif door == "openai":  # the whole history, as chat front ends send it
                    history.append({"role": "user", "content": text})
                    assert await oai.turn(history) == reply
                    history.append({"role": "assistant", "content": reply})
                else:
                    said, mid = await mcp.turn(text, mcp_cid[0] if mcp_cid else None)
                    assert said == reply and mcp_cid in ([], [mid])
                    mcp_cid[:] = [mid]

            await measure("existing conversation", n, existing)

            async def slow(door: str, i: int) -> None:
                if door == "sse":
                    assert (await sse.turn(paced))["tokens"] == 200
                elif door == "openai":
                    assert await oai.turn([{"role": "user", "content": paced}]) == reply
                else:
                    assert (await mcp.turn(paced))[0] == reply

            await measure("new conversation, paced reply (2 ms a chunk)", max(2, n // 2), slow)
    finally:
        common.stop_all(agentik, fake)
    return {
        "id": "B23",
        "title": "OpenAI-compatible and MCP turns vs the agent's own SSE turn",
        "rows": rows,
        "notes": [
            f"{n} turns of each kind per case ({max(2, n // 2)} paced), alternating SSE, OpenAI, "
            "MCP; the load client (the mcp SDK's among them) and the fake LLM share the CPUs "
            "with the server",
            f"reply: {text!r} (200 content chunks, 600 characters), agentik's default settings",
            "MCP: the mcp SDK's Client (2026-07-28: one POST per call), chat with a progress "
            f"callback; median {stats(notes_per_turn)['median']:.0f} progress notifications per "
            "new-conversation turn at the fake's full speed",
            "OpenAI, existing conversation: the client resends the whole history (up to "
            f"{2 * n} messages), the server matches it by digest",
        ],
        "raw": raw,
        "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


if __name__ == "__main__":
    common.cli(main)
