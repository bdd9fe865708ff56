"""Skill mining end to end with the fake LLM: after the interval a new SKILL.md appears (valid
for skills-ref) and is in the next system prompt; the same name updates; near-duplicates
update the skill they are near; malformed answers save nothing; one run at a time, never in
a turn's way. The last test runs it all through ``agentik serve``."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import skills_ref

import agentik_skills
from agentik.core.app import AGENT, SETTINGS
from agentik_skills.mining import SYSTEM_PROMPT
from tests.conftest import script_fake, wait_until
from tests.fake_openai import FakeOpenAI, Reply
from tests.test_skills import (
    app_env,
    build_app,
    fake_server,  # noqa: F401 - the `fake` fixture
    new_conversation,
    run_turn,
    skill_md,
    system_prompt,
    write,
)

MATCH = "skill library"  # in the miner's system prompt: the fake answers mining calls only
assert MATCH in SYSTEM_PROMPT

DEPLOY = {
    "name": "deploy-app",
    "description": "Deploy the app to staging with the blue-green script.",
    "body": "1. Run `make build`.\n2. Run `./deploy.sh staging`.",
}


def mined(*skills: dict[str, Any], delay: float = 0.0) -> Reply:
    return Reply(json.dumps({"skills": list(skills)}), match=MATCH, delay=delay)


def mining_calls(fake: FakeOpenAI) -> list[dict[str, Any]]:
    return [r for r in fake.requests if MATCH in json.dumps(r["messages"])]


@pytest.fixture
def skills_dir(tmp_path: Path) -> Path:
    root = tmp_path / "skills"
    write(root / "git-rebase/SKILL.md", skill_md("git-rebase", "Rebase a branch onto main."))
    return root


@pytest.fixture
async def client(fake, skills_dir, tmp_path, aiohttp_client) -> Any:
    env = app_env(
        fake, tmp_path, AGENTIK_SKILLS_DIR=str(skills_dir), AGENTIK_SKILL_MINING_INTERVAL="2"
    )
    return await aiohttp_client(build_app(env))


async def turns(client: Any, cid: str, *texts: str) -> None:
    for text in texts:
        await run_turn(client, cid, text)
    await client.app[AGENT].jobs.wait_idle()  # the mining job, if one was started


async def test_after_the_interval_a_mined_skill_is_saved_and_in_the_next_prompt(
    client, fake, skills_dir, caplog
):
    caplog.set_level(logging.INFO, "agentik.skills")
    fake.script(mined(DEPLOY))
    cid = await new_conversation(client)
    await turns(client, cid, "how do I deploy?")
    assert mining_calls(fake) == []  # one turn: not yet
    await turns(client, cid, "deploy worked, thanks")
    [call] = mining_calls(fake)
    asked = call["messages"][-1]["content"]
    assert "User: how do I deploy?" in asked and "User: deploy worked, thanks" in asked
    assert "- git-rebase: Rebase a branch onto main." in asked  # the catalogue
    folder = skills_dir / "deploy-app"
    assert skills_ref.validate(folder) == []
    assert skills_ref.read_properties(folder).description == DEPLOY["description"]
    assert "[SkillMiner] saved 1 skill: deploy-app" in caplog.text
    await turns(client, await new_conversation(client), "next chat")
    assert f"- **deploy-app**: {DEPLOY['description']}" in system_prompt(fake.requests[-1])


async def test_the_same_name_updates_and_near_duplicates_update_what_they_are_near(
    client, fake, skills_dir, caplog
):
    caplog.set_level(logging.INFO, "agentik.skills")
    cid = await new_conversation(client)
    fake.script(mined(DEPLOY))
    await turns(client, cid, "one", "two")
    better = {**DEPLOY, "description": "Deploy the app to staging or prod.", "body": "v2"}
    near = {"name": "git-rebase-2", "description": "Rebase onto main, then push.", "body": "v2"}
    bad = {"name": "Not Valid", "description": "Bad name.", "body": "x"}
    fake.script(mined(better, near, bad))
    await turns(client, cid, "three", "four")
    assert sorted(p.name for p in skills_dir.iterdir()) == ["deploy-app", "git-rebase"]
    for name in ("deploy-app", "git-rebase"):
        assert skills_ref.validate(skills_dir / name) == []
    assert skills_ref.read_properties(skills_dir / "deploy-app").description == (
        "Deploy the app to staging or prod."
    )
    assert skills_ref.read_properties(skills_dir / "git-rebase").description == (
        "Rebase onto main, then push."
    )
    assert "[SkillMiner] saved 2 skills: deploy-app, git-rebase" in caplog.text
    assert "[SkillMiner] dropped 'Not Valid'" in caplog.text


@pytest.mark.parametrize(
    "answer",
    [
        "I found a skill about deploying!",
        '{"skills": "deploy-app"}',
        '{"skills": [], "note": "extra keys are not the shape"}',
        '[{"name": "deploy-app", "description": "d", "body": "b"}]',
        '{"skills": [{"name": "deploy-app", "description": "", "body": "b"}, 7, '
        '{"name": "x", "description": "d"}]}',
    ],
)
async def test_malformed_answers_save_nothing(client, fake, skills_dir, answer):
    conv = await client.app[AGENT].create_conversation()
    await turns(client, conv.id, "something reusable")
    before = sorted(str(p) for p in skills_dir.rglob("*"))
    fake.script(Reply(answer, match=MATCH))
    report = await agentik_skills.miner(client.app[SETTINGS]).mine(conv)
    assert report.saved == []
    assert report.error is not None or len(report.dropped) == 3
    assert sorted(str(p) for p in skills_dir.rglob("*")) == before


async def test_never_twice_at_once_and_never_in_a_turns_way(client, fake, skills_dir):
    """Mining waits for no turn, and no turn waits for it: a turn that starts cuts it short,
    and it runs again once the turn is over."""
    miner = agentik_skills.miner(client.app[SETTINGS])
    agent = client.app[AGENT]
    cid = await new_conversation(client)
    fake.script(mined(DEPLOY, delay=1.0), mined(DEPLOY, delay=1.0))
    await run_turn(client, cid, "one")
    await run_turn(client, cid, "two")  # starts a slow mining run in the background
    await wait_until(lambda: len(mining_calls(fake)) == 1)  # it waits on the model
    await run_turn(client, cid, "three")  # cuts it short, then it runs again
    assert agent.background.counts["preempted"] == 1
    await wait_until(lambda: miner.running)
    conv = await agent.get_conversation(cid)
    busy = await miner.mine(conv)  # the debug endpoint's way in
    assert busy.busy and busy.saved == []
    await agent.jobs.wait_idle()
    assert not miner.running and (skills_dir / "deploy-app/SKILL.md").is_file()
    assert len(mining_calls(fake)) == 2  # the one cut short, then the whole one


async def test_turns_are_counted_in_the_store_across_a_restart(
    fake, skills_dir, tmp_path, aiohttp_client
):
    env = app_env(
        fake, tmp_path, AGENTIK_SKILLS_DIR=str(skills_dir), AGENTIK_SKILL_MINING_INTERVAL="2"
    )
    first = await aiohttp_client(build_app(env))
    cid = await new_conversation(first)
    await turns(first, cid, "one")
    await first.close()
    fake.script(mined(DEPLOY))
    second = await aiohttp_client(build_app(env))  # the same database: turn two mines
    await turns(second, cid, "two")
    assert len(mining_calls(fake)) == 1
    assert (skills_dir / "deploy-app/SKILL.md").is_file()


async def test_interval_zero_is_off(fake, skills_dir, tmp_path, aiohttp_client):
    env = app_env(
        fake, tmp_path, AGENTIK_SKILLS_DIR=str(skills_dir), AGENTIK_SKILL_MINING_INTERVAL="0"
    )
    client = await aiohttp_client(build_app(env))
    await turns(client, await new_conversation(client), "a", "b", "c")
    assert mining_calls(fake) == []


async def test_mining_through_agentik_serve(serve, fake_openai_proc, tmp_path):
    skills = tmp_path / "skills"
    env = {
        "OPENAI_BASE_URL": fake_openai_proc,
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_MODEL": "fake-model",
        "AGENTIK_SKILLS_DIR": str(skills),
        "AGENTIK_SKILL_MINING_INTERVAL": "1",
    }
    proc, base = serve(env)
    assert f"skills: 0 from {skills} (0 skipped)" in proc.wait_output("skills:")
    await script_fake(fake_openai_proc, {"text": json.dumps({"skills": [DEPLOY]}), "match": MATCH})
    root = fake_openai_proc.removesuffix("/v1")
    async with aiohttp.ClientSession() as s:

        async def send(text: str) -> None:
            async with s.post(f"{base}/agentik/conversations") as r:
                cid = (await r.json())["id"]
            body = [{"type": "text", "body": text}]
            async with s.post(f"{base}/agentik/conversations/{cid}/messages", json=body) as r:
                assert r.status == 202

        async def chat_request(text: str) -> dict[str, Any]:
            for _ in range(500):
                async with s.get(f"{root}/_fake/requests") as r:
                    for sent in await r.json():
                        if sent.get("stream") and sent["messages"][-1]["content"] == text:
                            return dict(sent)
                await asyncio.sleep(0.02)
            raise AssertionError(f"no request for {text!r}")

        await send("how do I deploy?")
        proc.wait_output("[SkillMiner] saved 1 skill: deploy-app")
        assert skills_ref.validate(skills / "deploy-app") == []
        await send("next chat")
        prompt = (await chat_request("next chat"))["messages"][0]["content"]
    assert f"- **deploy-app**: {DEPLOY['description']}" in prompt
    assert proc.stop() == 0
