"""The redacting backend wraps the test's scripted model, chosen by name like any backend."""

import pytest

import agentik_llm_redact
from agentik.api import StartupError, run_turn

PLUGIN = [("agentik_llm_redact", agentik_llm_redact)]
ENV = {"AGENTIK_LLM_BACKEND": "redact", "REDACT_INNER": "scripted"}


async def test_the_inner_model_never_sees_an_address(agentik_agent, scripted_llm):
    agent = await agentik_agent(plugins=PLUGIN, env=ENV)
    turn = await run_turn(agent, "write to ada@example.com or call +44 20 7946 0958")
    assert scripted_llm.received[0][0].text == "write to [redacted] or call [redacted]"
    assert agent.llm.description == "redact -> scripted"
    # what the user wrote is kept as written
    assert "ada@example.com" in turn.history[0].payload["content"][0]["body"]
    assert turn.text == "echo: write to [redacted] or call [redacted]"


async def test_an_unknown_inner_backend_names_the_variable(agentik_agent):
    with pytest.raises(StartupError, match=r"REDACT_INNER='nope': unknown llm backend"):
        await agentik_agent(plugins=PLUGIN, env={**ENV, "REDACT_INNER": "nope"})
