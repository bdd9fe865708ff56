"""Token stats (F12) over HTTP: per conversation (temporary ones too) and the agent's totals."""

from __future__ import annotations

import asyncio

import agentik_memory
import agentik_memory_md
from agentik.core.app import AGENT
from agentik.core.cli import banner
from agentik.core.llm import Completion, Usage
from agentik.core.testing import ScriptedLLM, make_app

TEXT = [{"type": "text", "body": "hi"}]


async def turn(client, cid: str) -> None:
    assert (await client.post(f"/agentik/conversations/{cid}/messages", json=TEXT)).status == 202
    for _ in range(500):
        if not (await (await client.get(f"/agentik/conversations/{cid}")).json())["busy"]:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the turn never ended")


async def test_stats_per_conversation_and_for_the_agent(aiohttp_client):
    llm = ScriptedLLM(
        ["a", Usage(100, 10)],
        ["b", Usage(130, 5)],
        ["c"],  # no count
        ["d", Usage(40, 2)],  # in a temporary conversation
    )
    client = await aiohttp_client(make_app(llm=llm))
    cid = (await (await client.post("/agentik/conversations")).json())["id"]
    temp = (await (await client.post("/agentik/conversations", json={"temp": True})).json())["id"]
    await turn(client, cid)
    await turn(client, cid)
    stats = await (await client.get(f"/agentik/conversations/{cid}/stats")).json()
    assert stats == {
        "conversationId": cid,
        "turns": 2,
        "input": 230,
        "output": 15,
        "total": 245,
        "contextTokens": 135,  # the last turn: 130 in, 5 more
    }
    await turn(client, cid)
    stats = await (await client.get(f"/agentik/conversations/{cid}/stats")).json()
    assert stats["turns"] == 3 and stats["input"] == 230 and stats["contextTokens"] is None
    await turn(client, temp)
    temp_stats = await (await client.get(f"/agentik/conversations/{temp}/stats")).json()
    assert temp_stats["turns"] == 1 and temp_stats["contextTokens"] == 42
    totals = await (await client.get("/agentik/stats")).json()
    # temporary conversations are not in the agent's totals
    assert totals == {
        "conversations": 1,
        "turns": 3,
        "input": 230,
        "output": 15,
        "total": 245,
        "background": {},
    }


class Counted(ScriptedLLM):
    """Its one-shot calls (the memory reviews) report their counts, as a server would."""

    async def one_shot(self, prompt, *, system_prompt=None, max_tokens=None):
        return Completion('{"facts": []}', Usage(300, 20))


async def test_background_calls_are_counted_apart_per_feature(aiohttp_client, tmp_path):
    """Token stats left the background calls out (+54% of the real usage in one run): they
    are counted per feature, apart from the turns'."""
    plugins = [("agentik_memory", agentik_memory), ("agentik_memory_md", agentik_memory_md)]
    env = {"AGENTIK_MEMORY_BACKEND": "md", "AGENTIK_MEMORY_DIR": str(tmp_path / "mem"),
           "AGENTIK_DB_PATH": str(tmp_path / "a.db"),
           "AGENTIK_MEMORY_REVIEW_EVERY": "1"}  # fmt: skip
    app = make_app(
        llm=Counted(["a", Usage(100, 10)], ["b", Usage(130, 5)]), plugins=plugins, env=env
    )
    client = await aiohttp_client(app)
    cid = (await (await client.post("/agentik/conversations")).json())["id"]
    await turn(client, cid)
    await app[AGENT].jobs.wait_idle()  # its review
    await turn(client, cid)
    await app[AGENT].jobs.wait_idle()
    totals = await (await client.get("/agentik/stats")).json()
    assert (totals["input"], totals["output"]) == (230, 15)  # the turns' own
    tokens = [x for x in await banner(app, "127.0.0.1", 8080) if x.startswith("  tokens:")]
    assert tokens == [
        "  tokens: 1 convs, 2 turns, in=230, out=15, total=245; background: 2 calls, total=640"
    ]
    assert totals["background"] == {
        "memory_review": {
            "calls": 2, "input": 600, "output": 40, "total": 640, "estimatedCalls": 0
        }
    }  # fmt: skip
