"""The typed tool as the model sees it and calls it, and the prompt section."""

import json

import agentik_tools_units
from agentik.api import ToolCallRequest, run_turn

PLUGIN = [("agentik_tools_units", agentik_tools_units)]


def test_the_schema_comes_from_the_type_hints():
    params = agentik_tools_units.convert_length.spec.parameters
    assert params["required"] == ["length", "to"]
    assert params["properties"]["to"]["enum"] == ["m", "km", "ft", "mi"]
    length = params["properties"]["length"]
    assert length["properties"]["unit"]["enum"] == ["m", "km", "ft", "mi"]
    assert length["description"] == "The length to convert."
    assert params["properties"]["digits"] == {
        "type": "integer",
        "enum": [0, 1, 2, 3],
        "description": "Decimal places in the answer.",
        "default": 2,
    }


async def test_the_model_converts_and_the_prompt_says_how(agentik_agent, scripted_llm):
    args = json.dumps({"length": {"value": 3, "unit": "mi"}, "to": "km", "digits": 1})
    scripted_llm.steps = [
        [ToolCallRequest("c1", "convert_length", args)],
        [ToolCallRequest("c2", "convert_length", '{"length": {"value": 1}, "to": "yd"}')],
        ["About 4.8 km."],
    ]
    agent = await agentik_agent(plugins=PLUGIN, env={"UNITS_SYSTEM": "imperial"})
    turn = await run_turn(agent, "3 miles in km?")
    results = [e.text for e in turn.events if e.type == "ToolResult"]
    assert results[0] == "4.8 km"
    assert "'yd' is not one of" in results[1] and "'unit' is a required property" in results[1]
    assert "answer in imperial units" in scripted_llm.prompts[0]
