"""agentik-llm-redact: an LLM backend that wraps another one, chosen by name, and keeps e-mail
addresses and phone numbers from ever reaching it (the history and the audit log keep them).

``AGENTIK_LLM_BACKEND=redact REDACT_INNER=openai`` (the default inner backend).
"""

import re

from agentik.api import (
    HistoryItem,
    LLMBackend,
    LLMConversation,
    Setting,
    SettingPrefix,
    UserInput,
    hookimpl,
)

SENSITIVE = re.compile(r"[\w.+-]+@[\w-]+(\.[\w-]+)+|\+?\d[\d ()-]{6,}\d")


def redact(text: str) -> str:
    return SENSITIVE.sub("[redacted]", text)


class RedactingConversation(LLMConversation):
    def __init__(self, inner: LLMConversation) -> None:
        self.inner = inner

    def stream(self, inputs):
        clean = [
            UserInput(redact(i.text), i.images) if isinstance(i, UserInput) else i for i in inputs
        ]
        return self.inner.stream(clean)

    async def aclose(self) -> None:
        await self.inner.aclose()


class Redacting(LLMBackend):
    def __init__(self, inner: LLMBackend) -> None:
        self.inner = inner
        self.description = f"redact -> {inner.description or type(inner).__name__}"
        self.capabilities = inner.capabilities
        self.context_window = inner.context_window

    async def start(self) -> None:
        await self.inner.start()

    async def aclose(self) -> None:
        await self.inner.aclose()

    def create_conversation(self, system_prompt, history, tools):
        clean = [
            HistoryItem(h.role, redact(h.text), h.call_id, h.tool_name, h.args_json, h.extra)
            if h.role == "user"
            else h
            for h in history
        ]
        return RedactingConversation(self.inner.create_conversation(system_prompt, clean, tools))

    async def complete(self, prompt, *, system_prompt=None):
        return await self.inner.complete(redact(prompt), system_prompt=system_prompt)


@hookimpl
def register_settings(register):
    register(Setting("REDACT_INNER", "openai", str.lower, "The LLM backend `redact` wraps."))
    register(SettingPrefix("REDACT_"))


@hookimpl
def register_llm_backends(register):
    def make(settings, backends):
        inner = backends.create(settings["REDACT_INNER"], settings, variable="REDACT_INNER")
        return Redacting(inner)

    register("redact", make)
