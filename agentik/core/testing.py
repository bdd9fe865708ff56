"""Helpers for testing agentik and its plugins (docs/writing_plugins.md, "Test it").

``make_app`` builds a server from exactly the plugins you name (installed entry points are not
loaded unless asked), ``started_agent`` starts its agent as ``agentik serve`` would,
``run_turn`` sends one message and returns the turn's events and the history,
``temporary_plugin`` registers a plugin around a block, and :class:`ScriptedLLM` /
:class:`EchoLLM` are in-process LLM backends::

    async def test_my_tool(agentik_agent, scripted_llm):  # fixtures of the pytest plugin
        scripted_llm.steps = [[ToolCallRequest("c1", "my_tool", "{}")], ["done"]]
        agent = await agentik_agent(plugins=[("my_plugin", my_plugin)])
        turn = await run_turn(agent, "use my tool")
        assert turn.text == "done"

The fixtures (``agentik_agent``, ``scripted_llm``) come from :mod:`agentik.core.pytest_plugin`,
which pytest loads by itself wherever agentik is installed (entry point ``pytest11``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from agentik.core.agent import ChatAgent, ChatConversation
from agentik.core.app import create_app, load_settings, running
from agentik.core.llm import (
    HistoryItem,
    LLMBackend,
    LLMChunk,
    LLMConversation,
    LLMError,
    LLMInput,
    TextDelta,
    ToolResultInput,
    Usage,
    UserInput,
)
from agentik.core.plugins import Plugins, make_plugins
from agentik.core.registry import Register
from agentik.core.tools import ToolSpec
from agentik.core.types import AppendText, Event, Message, TextPart
from agentik.hookspecs import hookimpl

Step = Sequence[LLMChunk | str] | LLMError


class ScriptedConversation(LLMConversation):
    def __init__(self, backend: ScriptedLLM, history: Sequence[HistoryItem]) -> None:
        self.backend = backend
        self.history = list(history)

    async def stream(self, inputs: Sequence[LLMInput]) -> AsyncIterator[LLMChunk]:
        self.backend.received.append(list(inputs))
        step = self.backend.steps.pop(0) if self.backend.steps else self.backend.default(inputs)
        if isinstance(step, LLMError):
            raise step
        for chunk in step:
            # like a network stream, yield to the loop between chunks
            await asyncio.sleep(self.backend.delay)
            yield TextDelta(chunk) if isinstance(chunk, str) else chunk

    async def aclose(self) -> None:
        self.backend.closed += 1


class ScriptedLLM(LLMBackend):
    """Plays back scripted steps: each step is a list of chunks (a str is a text delta) or an
    :class:`LLMError` to raise. When the script runs out it echoes the last input."""

    description = "scripted"

    def __init__(self, *steps: Step, delay: float = 0.0) -> None:
        self.steps: list[Step] = list(steps)
        self.delay = delay
        self.received: list[list[LLMInput]] = []
        self.conversations: list[ScriptedConversation] = []
        self.closed = 0
        self.prompts: list[str] = []
        #: the names of the tools each conversation was made with, in order
        self.offered: list[list[str]] = []

    def default(self, inputs: Sequence[LLMInput]) -> Step:
        last = inputs[-1] if inputs else UserInput("")
        text = last.text if isinstance(last, UserInput | ToolResultInput) else ""
        return [f"echo: {text}", Usage(len(text), 2)]

    def create_conversation(
        self, system_prompt: str, history: Sequence[HistoryItem], tools: Sequence[ToolSpec]
    ) -> LLMConversation:
        self.prompts.append(system_prompt)
        self.offered.append([t.name for t in tools])
        conv = ScriptedConversation(self, history)
        self.conversations.append(conv)
        return conv

    async def complete(self, prompt: str, *, system_prompt: str | None = None) -> str:
        return f"echo: {prompt}"


class EchoLLM(ScriptedLLM):
    """Answers every turn with ``echo: <the user's text>``."""

    description = "echo"


def test_plugins(
    plugins: Iterable[tuple[str, Any]] = (),
    *,
    builtins: Iterable[str] = ("agentik_transport_http",),
    load_entrypoints: bool = False,
) -> Plugins:
    """A fresh plugin manager with the core, the named built-ins and ``plugins``."""
    extra = [(name, importlib.import_module(name)) for name in builtins]
    return make_plugins(load_entrypoints=load_entrypoints, extra=[*extra, *plugins], env={})


#: the name the test's own LLM (``llm=``, the ``scripted_llm`` fixture) is registered under
SCRIPTED = "scripted"


class _TestLLM:
    """Registers the test's LLM as the backend ``scripted``: a backend chosen by name
    (``AGENTIK_LLM_BACKEND``) can wrap it (``backends.create("scripted", settings)``)."""

    def __init__(self, llm: LLMBackend) -> None:
        self.llm = llm

    @hookimpl
    def register_llm_backends(self, register: Register) -> None:
        register(SCRIPTED, lambda settings: self.llm)


def make_app(
    *,
    llm: LLMBackend | None = None,
    plugins: Iterable[tuple[str, Any]] = (),
    env: Mapping[str, str] | None = None,
    builtins: Iterable[str] = ("agentik_transport_http",),
    load_entrypoints: bool = False,
) -> web.Application:
    """A server for tests: an in-memory database, ``EchoLLM``, no long-term memory and
    background model calls at once (``AGENTIK_BACKGROUND_IDLE=0``) unless told otherwise
    (``env={"AGENTIK_MEMORY_BACKEND": ...}``).

    ``llm`` (default an :class:`EchoLLM`) is the agent's LLM, and is registered as the backend
    ``scripted``. With ``AGENTIK_LLM_BACKEND`` in ``env`` the backend of that name is built as
    ``agentik serve`` builds it, from the plugins given: a plugin's own backend, or one that
    wraps ``scripted``."""
    env = {
        "AGENTIK_DB_PATH": ":memory:",
        "AGENTIK_MEMORY_BACKEND": "off",
        "AGENTIK_BACKGROUND_IDLE": "0",
        **(env or {}),
    }
    llm = llm if llm is not None else EchoLLM()
    own = [*plugins, ("agentik.testing", _TestLLM(llm))]
    pm = test_plugins(own, builtins=builtins, load_entrypoints=load_entrypoints)
    by_name = bool(env.get("AGENTIK_LLM_BACKEND", "").strip())
    return create_app(load_settings(pm, env), pm, llm=None if by_name else llm)


@contextlib.asynccontextmanager
async def started_agent(
    *,
    llm: LLMBackend | None = None,
    plugins: Iterable[tuple[str, Any]] = (),
    env: Mapping[str, str] | None = None,
    builtins: Iterable[str] = (),
) -> AsyncIterator[ChatAgent]:
    """The agent of :func:`make_app`, started as ``agentik serve`` starts it (services, jobs)
    and stopped on exit. No transport is loaded unless ``builtins`` names it."""
    async with running(make_app(llm=llm, plugins=plugins, env=env, builtins=builtins)) as agent:
        yield agent


@dataclass
class Turn:
    """What :func:`run_turn` saw: the turn's events and the conversation's history after it."""

    conversation: ChatConversation
    events: list[Event]
    history: list[Message]

    @property
    def text(self) -> str:
        """The assistant's reply text (reasoning left out)."""
        return "".join(e.text for e in self.events if isinstance(e, AppendText) and not e.reasoning)

    @property
    def types(self) -> list[str]:
        return [e.type for e in self.events]

    @property
    def waiting(self) -> bool:
        """The turn waits for answers from outside (its last event is ``Waiting``)."""
        return self.events[-1].type == "Waiting"


TURN_TIMEOUT = 10.0  # seconds run_turn waits for a turn's End (or its Waiting)


async def run_turn(target: ChatAgent | ChatConversation, text: str) -> Turn:
    """Send ``text`` (to a new conversation when given the agent), wait for the turn's ``End``
    (at most ``TURN_TIMEOUT`` seconds) and return its events and the history, oldest first.
    Turns already running or queued in the conversation finish first; the events are this
    turn's own (not the conversation's ``UserMessage`` that announced it). A turn that waits
    (a tool call held for approval, a front end's tool) returns at its ``Waiting`` event
    (``turn.waiting``): answer it (``conversation.approve``), then read on."""
    conv = await target.create_conversation() if isinstance(target, ChatAgent) else target
    await asyncio.wait_for(conv.wait_idle(), TURN_TIMEOUT)
    after = conv.last_event_id
    sent = await conv.send([TextPart(text)])
    items = conv.turn_events(sent.id, after)
    seen: list[Event] = []

    async def read() -> None:
        async for item in items:
            seen.append(item.event)
            if item.event.type in ("End", "Waiting"):
                return

    try:
        await asyncio.wait_for(read(), TURN_TIMEOUT)
    finally:
        await items.aclose()
    if seen[-1].type == "End":
        await conv.wait_idle()
    return Turn(conv, seen, await conv.get_messages(limit=10_000))


@contextlib.contextmanager
def temporary_plugin(plugins: Plugins, plugin: Any, name: str) -> Iterator[Any]:
    """Register ``plugin`` for the duration of a block."""
    plugins.add(plugin, name)
    try:
        yield plugin
    finally:
        plugins.remove(name)


__all__ = [
    "SCRIPTED",
    "EchoLLM",
    "ScriptedLLM",
    "Turn",
    "make_app",
    "run_turn",
    "started_agent",
    "temporary_plugin",
    "test_plugins",
]
test_plugins.__test__ = False  # type: ignore[attr-defined]  # not a pytest test
