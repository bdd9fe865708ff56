"""The JSON memory under agentik's memory feature: the tools save into the file, the next
turn's prefetch finds the note, a restart reads it back."""

import json

import agentik_memory_json
from agentik.api import ToolCallRequest, run_turn

PLUGIN = [("agentik_memory_json", agentik_memory_json)]


def env(tmp_path):
    return {
        "AGENTIK_MEMORY_BACKEND": "json",
        "JSON_MEMORY_PATH": str(tmp_path / "memory.json"),
        "AGENTIK_MEMORY_REVIEW": "0",  # the scripted model answers no review
    }


async def test_saved_by_the_tool_found_by_the_prefetch(agentik_agent, scripted_llm, tmp_path):
    save = '{"category": "user", "text": "The user\'s dog is named Bruno."}'
    scripted_llm.steps = [[ToolCallRequest("c1", "memory_save", save)], ["Noted."]]
    agent = await agentik_agent(plugins=PLUGIN, env=env(tmp_path), builtins=["agentik_memory"])
    turn = await run_turn(agent, "remember my dog Bruno")
    assert not next(e for e in turn.events if e.type == "ToolResult").is_error
    stored = json.loads((tmp_path / "memory.json").read_text())["notes"]
    assert [n["text"] for n in stored] == ["The user's dog is named Bruno."]
    await run_turn(agent, "what do you know about my dogs?")
    sent = scripted_llm.received[-1][0].text
    assert "[Memory context" in sent and "Bruno" in sent


async def test_a_restart_reads_the_file_back(tmp_path):
    first = agentik_memory_json.JsonMemory(tmp_path / "memory.json")
    await first.start()
    note = await first.save("world", "Oslo is the capital of Norway.", "USER")
    assert await first.delete(note.id) and await first.count() == 0
    await first.save("world", "The Danube flows through Vienna.", "USER")
    again = agentik_memory_json.JsonMemory(tmp_path / "memory.json")
    await again.start()
    assert [n.text for n in await again.search("Vienna", 3)] == ["The Danube flows through Vienna."]
    assert note.id in again.archived  # deleted notes stay restorable
