"""The example plugin's own tests, written with agentik's pytest plugin (the ``agentik_agent``
and ``scripted_llm`` fixtures) and ``run_turn``."""

import agentik_llm_echo
from agentik.api import ToolCallRequest, run_turn

PLUGIN = [("agentik_llm_echo", agentik_llm_echo)]


async def test_the_shout_tool_as_the_model_calls_it(agentik_agent, scripted_llm):
    scripted_llm.steps = [[ToolCallRequest("c1", "shout", '{"text": "hi"}')], ["Done."]]
    agent = await agentik_agent(plugins=PLUGIN)
    turn = await run_turn(agent, "shout hi")
    assert turn.types == ["ToolCall", "ToolResult", "StartResponse", "AppendText", "End"]
    assert scripted_llm.received[1][0].text == "HI"  # what the tool gave the model
    assert [m.kind for m in turn.history] == ["user", "tool_call", "tool_result", "assistant"]


async def test_bad_arguments_never_reach_the_tool(agentik_agent, scripted_llm):
    scripted_llm.steps = [[ToolCallRequest("c1", "shout", '{"text": 3}')], ["Sorry."]]
    agent = await agentik_agent(plugins=PLUGIN)
    turn = await run_turn(agent, "shout 3")
    result = next(e for e in turn.events if e.type == "ToolResult")
    assert result.is_error and "3 is not of type 'string'" in result.text


async def test_the_echo_backend_reverses_and_prefixes(agentik_agent):
    agent = await agentik_agent(plugins=PLUGIN, llm=agentik_llm_echo.EchoBackend("> "))
    turn = await run_turn(agent, "hello world")
    assert turn.text == "> dlrow > olleh "
    assert turn.history[-1].payload["text"] == turn.text


async def test_the_backend_is_selected_by_name_with_its_setting(agentik_agent):
    agent = await agentik_agent(
        plugins=PLUGIN, env={"AGENTIK_LLM_BACKEND": "reverse", "ECHO_PREFIX": "~"}
    )
    assert isinstance(agent.llm, agentik_llm_echo.EchoBackend) and agent.llm.prefix == "~"
    turn = await run_turn(agent, "ab cd")
    assert turn.text == "~dc ~ba "
