"""The job runs on its schedule while the agent runs, and stops with it."""

import asyncio
import json

import agentik_heartbeat
from agentik.api import run_turn

PLUGIN = [("agentik_heartbeat", agentik_heartbeat)]


async def test_beats_on_schedule(agentik_agent, tmp_path):
    path = tmp_path / "beats.jsonl"
    env = {"HEARTBEAT_INTERVAL": "0.05", "HEARTBEAT_FILE": str(path)}
    agent = await agentik_agent(plugins=PLUGIN, env=env)
    await run_turn(agent, "hello")
    for _ in range(100):  # at most 5 s
        if agent.state.get("agentik_heartbeat", 0) >= 3:
            break
        await asyncio.sleep(0.05)
    beats = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(beats) >= 3 and beats[-1]["conversations"] == 1


async def test_off_without_a_file(agentik_agent):
    agent = await agentik_agent(plugins=PLUGIN, env={"HEARTBEAT_INTERVAL": "0.01"})
    await asyncio.sleep(0.05)
    assert "agentik_heartbeat" not in agent.state
