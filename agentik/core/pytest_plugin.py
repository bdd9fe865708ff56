"""agentik's pytest plugin: fixtures for testing agentik plugins.

Loaded by pytest wherever agentik is installed (entry point ``pytest11``), so a plugin's tests
just ask for them::

    async def test_dice(agentik_agent, scripted_llm):
        scripted_llm.steps = [[ToolCallRequest("c1", "roll", '{"sides": 6}')], ["You rolled."]]
        agent = await agentik_agent(plugins=[("dice", dice)], env={"DICE_MAX_SIDES": "6"})
        turn = await run_turn(agent, "roll a die")

Async fixtures need pytest-asyncio (``asyncio_mode = "auto"``, or mark the tests), which
pytest-aiohttp brings.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any

import pytest

from agentik.core.agent import ChatAgent
from agentik.core.llm import LLMBackend
from agentik.core.testing import ScriptedLLM, started_agent

async_fixture: Callable[[Callable[..., Any]], Any]
try:  # an async fixture must be marked for pytest-asyncio's strict mode too
    from pytest_asyncio import fixture as async_fixture
except ImportError:  # without pytest-asyncio only the plain fixtures are usable
    async_fixture = pytest.fixture


@pytest.fixture
def scripted_llm() -> ScriptedLLM:
    """A :class:`~agentik.core.testing.ScriptedLLM` with an empty script (it echoes); set
    ``.steps`` and read ``.received`` / ``.prompts``. ``agentik_agent`` uses it by default."""
    return ScriptedLLM()


AgentFactory = Callable[..., Awaitable[ChatAgent]]


@async_fixture
async def agentik_agent(scripted_llm: ScriptedLLM) -> AsyncIterator[AgentFactory]:
    """``await agentik_agent(plugins=[(name, module)], env={...}, llm=None, builtins=())``: a
    started agent with exactly those plugins and settings, an in-memory database and the
    ``scripted_llm`` (or ``llm``), which is also the backend named ``scripted``: with
    ``env={"AGENTIK_LLM_BACKEND": name}`` the backend of that name is used instead, as
    ``agentik serve`` would build it (one that wraps ``scripted`` wraps the script). Every
    agent it made is stopped after the test."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(
            *,
            plugins: Iterable[tuple[str, Any]] = (),
            env: Mapping[str, str] | None = None,
            llm: LLMBackend | None = None,
            builtins: Iterable[str] = (),
        ) -> ChatAgent:
            return await stack.enter_async_context(
                started_agent(
                    llm=llm if llm is not None else scripted_llm,
                    plugins=plugins,
                    env=env,
                    builtins=builtins,
                )
            )

        yield start
