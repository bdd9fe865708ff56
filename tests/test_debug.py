"""Debug endpoints (F16): off by default (404), each one on, features off (409 naming the
variable), missing and unknown conversation ids."""

from __future__ import annotations

import json
from typing import Any

import pytest

import agentik_compaction
import agentik_reflection
from agentik.core.app import AGENT
from agentik.core.cli import banner
from agentik.core.testing import make_app
from agentik.core.types import TextPart
from tests.test_compaction import WindowLLM

FEATURES = [
    ("agentik_compaction", agentik_compaction),
    ("agentik_reflection", agentik_reflection),
]
BUILTINS = ["agentik_transport_http", "agentik_debug"]
POSTS = ["reflect", "skill-mine", "compact", "curate"]


class ReflectingLLM(WindowLLM):
    """Summaries for compaction, a score for reflection."""

    async def complete(self, prompt: str, *, system_prompt: str | None = None) -> str:
        if '"weakSpots"' in prompt:
            return '{"score": 4, "weakSpots": ["too terse"]}'
        return await super().complete(prompt, system_prompt=system_prompt)


async def client_for(aiohttp_client: Any, llm: Any, **env: str) -> Any:
    app = make_app(llm=llm, plugins=FEATURES, builtins=BUILTINS, env=env)
    return await aiohttp_client(app)


async def conversation_with_turns(client: Any, n: int) -> Any:
    conv = await client.server.app[AGENT].create_conversation()
    for i in range(n):
        await conv.send([TextPart(f"question {i}")])
        await conv.wait_idle()
    return conv


async def error_of(resp: Any, status: int) -> str:
    assert resp.status == status, await resp.text()
    body = await resp.json()
    assert set(body["error"]) == {"code", "message"}
    return str(body["error"]["message"])


async def test_off_by_default_they_do_not_exist(aiohttp_client):
    client = await client_for(aiohttp_client, WindowLLM())
    conv = await conversation_with_turns(client, 1)
    params = {"conversationId": conv.id}
    for action in POSTS:
        await error_of(await client.post(f"/debug/{action}", params=params), 404)
    await error_of(await client.get("/debug/tokens", params=params), 404)
    assert not any("debug" in line for line in await banner(client.server.app, "h", 1))


async def test_each_endpoint_on(aiohttp_client):
    llm = ReflectingLLM(window=100_000)
    client = await client_for(aiohttp_client, llm, AGENTIK_DEBUG_ENDPOINTS="1")
    agent = client.server.app[AGENT]
    conv = await conversation_with_turns(client, 6)
    params = {"conversationId": conv.id}

    r = await client.post("/debug/compact", params=params)
    compacted = await r.json()
    assert r.status == 200 and compacted["compacted"] is True
    assert compacted["dropped"] == 4 and compacted["tokensAfter"] < compacted["tokensBefore"]
    memory = await agent.store.list_memory(conv.id)
    assert memory[0].item.role == "summary" and memory[0].item.text == compacted["summary"]
    again = await (await client.post("/debug/compact", params=params)).json()
    assert again == {
        "conversationId": conv.id,
        "compacted": False,
        "reason": "nothing to summarise",
    }

    r = await client.post("/debug/reflect", params=params)
    assert r.status == 200
    assert await r.json() == {
        "conversationId": conv.id,
        "reflected": True,
        "turns": 6,
        "score": 4,
        "weakSpots": ["too terse"],
    }

    tokens = await (await client.get("/debug/tokens", params=params)).json()
    assert tokens["conversationId"] == conv.id and tokens["turns"] == 6
    assert tokens["contextWindow"] == 100_000 and tokens["compactions"] == 1
    assert isinstance(tokens["liveContextTokens"], int)

    # features no installed plugin offers: 409 naming the variable that turns them on
    message = await error_of(await client.post("/debug/skill-mine", params=params), 409)
    assert "AGENTIK_SKILL_MINING_INTERVAL" in message
    assert "AGENTIK_MEMORY_BACKEND" in await error_of(await client.post("/debug/curate"), 409)

    # bad ids, unknown actions
    for action in ("compact", "reflect"):
        await error_of(await client.post(f"/debug/{action}"), 400)
        await error_of(
            await client.post(f"/debug/{action}", params={"conversationId": "conv-nope"}), 404
        )
    await error_of(await client.get("/debug/tokens", params={"conversationId": "conv-nope"}), 404)
    await error_of(await client.post("/debug/nothing-like-this"), 404)
    lines = await banner(client.server.app, "h", 1)
    assert any(line.startswith("  WARNING: debug endpoints are on") for line in lines)
    assert "  GET  /debug/tokens?conversationId=                       -> 200" in lines


@pytest.mark.parametrize(
    ("action", "variable"),
    [("compact", "OPENAI_CONTEXT_WINDOW"), ("reflect", "AGENTIK_REFLECTION_INTERVAL")],
)
async def test_a_feature_that_is_off_answers_409(aiohttp_client, action, variable):
    llm = ReflectingLLM(window=None)  # no context window: compaction is off
    client = await client_for(
        aiohttp_client, llm, AGENTIK_DEBUG_ENDPOINTS="1", AGENTIK_REFLECTION_INTERVAL="0"
    )
    conv = await conversation_with_turns(client, 1)
    r = await client.post(f"/debug/{action}", params={"conversationId": conv.id})
    assert variable in await error_of(r, 409)


class MiningLLM(ReflectingLLM):
    """Answers the skill miner (its system prompt speaks of the skill library)."""

    async def complete(self, prompt: str, *, system_prompt: str | None = None) -> str:
        if system_prompt and "skill library" in system_prompt:
            skill = {"name": "say-hello", "description": "Greets.", "body": "Say hello."}
            return json.dumps({"skills": [skill]})
        return await super().complete(prompt, system_prompt=system_prompt)


async def test_skill_mining_and_the_curator_plug_into_the_debug_endpoints(aiohttp_client, tmp_path):
    import agentik_memory
    import agentik_memory_md
    import agentik_skills

    app = make_app(
        llm=MiningLLM(),
        plugins=[
            *FEATURES,
            ("agentik_skills", agentik_skills),
            ("agentik_memory", agentik_memory),
            ("agentik_memory_md", agentik_memory_md),
        ],
        builtins=BUILTINS,
        env={
            "AGENTIK_DEBUG_ENDPOINTS": "1",
            "AGENTIK_SKILLS_DIR": str(tmp_path / "skills"),
            "AGENTIK_MEMORY_BACKEND": "md",
            "AGENTIK_MEMORY_DIR": str(tmp_path / "memory"),
            "AGENTIK_MEMORY_REVIEW": "0",
        },
    )
    client = await aiohttp_client(app)
    conv = await conversation_with_turns(client, 2)
    r = await client.post("/debug/skill-mine", params={"conversationId": conv.id})
    assert r.status == 200, await r.text()
    assert (await r.json())["saved"] == ["say-hello"]
    assert (tmp_path / "skills" / "say-hello" / "SKILL.md").is_file()
    r = await client.post("/debug/curate")
    assert r.status == 200 and await r.json() == {"archived": 0, "maxAgeDays": 90.0}
