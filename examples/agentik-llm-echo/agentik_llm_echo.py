"""An example third-party agentik plugin: a tiny LLM backend and a tool.

Install it next to agentik-runtime (``pip install ./examples/agentik-llm-echo``) and select it with
``AGENTIK_LLM_BACKEND=echo``. It replies with the user's text reversed and streams it word by
word; a message that starts with ``shout `` makes it call its ``shout`` tool first.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence

from agentik.api import (
    HistoryItem,
    LLMBackend,
    LLMChunk,
    LLMConversation,
    LLMInput,
    Setting,
    TextDelta,
    ToolCallRequest,
    ToolResultInput,
    ToolSpec,
    hookimpl,
    tool,
)


class EchoConversation(LLMConversation):
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    async def stream(self, inputs: Sequence[LLMInput]) -> AsyncIterator[LLMChunk]:
        last = inputs[-1]
        if isinstance(last, ToolResultInput):
            yield TextDelta(f"{self.prefix}{last.text}")
            return
        if last.text.startswith("shout "):
            yield ToolCallRequest("call-1", "shout", json.dumps({"text": last.text[6:]}))
            return
        for word in last.text[::-1].split(" "):
            yield TextDelta(f"{self.prefix}{word} ")


class EchoBackend(LLMBackend):
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.description = f"echo (prefix {prefix!r})"

    def create_conversation(
        self, system_prompt: str, history: Sequence[HistoryItem], tools: Sequence[ToolSpec]
    ) -> LLMConversation:
        return EchoConversation(self.prefix)

    async def complete(self, prompt: str, *, system_prompt: str | None = None) -> str:
        return prompt[::-1]


@hookimpl
def register_settings(register):
    register(Setting("ECHO_PREFIX", "", str, "Text put before every echoed word."))


@hookimpl
def register_llm_backends(register):
    register("echo", lambda settings: EchoBackend(settings["ECHO_PREFIX"]), aliases=("reverse",))


@hookimpl
def register_tools(register):
    @tool
    def shout(text: str) -> str:
        """Upper-case a text."""
        return text.upper()

    register(shout)
