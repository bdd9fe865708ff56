"""The ``openai`` LLM backend: any OpenAI-compatible chat-completions endpoint.

Hooks only: the backend module is imported once this backend is chosen. It talks to the endpoint
with aiohttp (a core dependency), not the ``openai`` SDK, which measured as the bottleneck of a
turn (its per-request transform, its stream reader and its import; see ``backend.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentik.core import settings as cfg
from agentik.core.settings import Setting, SettingPrefix, Settings
from agentik.hookspecs import hookimpl

OPENAI_API = "https://api.openai.com/v1"  # the openai SDK's default base URL
OPENAI_SDK_VARIABLES = (
    "OPENAI_ORG_ID",
    "OPENAI_PROJECT_ID",
    "OPENAI_WEBHOOK_SECRET",
    "OPENAI_LOG",
    "OPENAI_ADMIN_KEY",
)

SETTINGS = (
    Setting(
        "OPENAI_BASE_URL",
        OPENAI_API,
        cfg.parse_url,
        "The OpenAI-compatible endpoint of `openai` and `http` embeddings (default: OpenAI's "
        "own, as the openai SDK), e.g. http://localhost:11434/v1 for a local Ollama.",
    ),
    Setting(
        "OPENAI_API_KEY",
        None,
        str,
        "Required for `openai` and `http` embeddings: its API key.",
        secret=True,
    ),
    Setting("OPENAI_MODEL", None, str, "Required for `openai`: the model, e.g. gpt-4o-mini."),
    Setting(
        "OPENAI_CONTEXT_WINDOW",
        None,
        cfg.parse_positive_int,
        "Context window in tokens; turns on context compaction (AGENTIK_COMPRESSION_THRESHOLD).",
    ),
    Setting(
        "OPENAI_MAX_TOKENS",
        None,
        cfg.parse_positive_int,
        "Output-token cap of one reply (`max_tokens`); unset: the server's own.",
    ),
    Setting(
        "OPENAI_IMAGE_INPUT",
        False,
        cfg.parse_bool,
        "true: the model takes images (sent as `image_url` data URLs); else images get a 400.",
    ),
    Setting(
        "OPENAI_TOOL_STREAMING",
        True,
        cfg.parse_bool,
        "false: replies that may call tools are not streamed (servers that cannot stream tools).",
    ),
    Setting(
        "OPENAI_TIMEOUT",
        60.0,
        cfg.parse_positive_float,
        "Seconds to wait for the endpoint (chat and embeddings).",
    ),
    Setting(
        "OPENAI_MAX_RETRIES",
        2,
        cfg.parse_non_negative_int,
        "Retries on 429, 5xx, no reply (chat and embeddings).",
    ),
)


@hookimpl
def register_settings(register: Callable[[Setting | SettingPrefix], None]) -> None:
    for setting in SETTINGS:
        register(setting)
    # an OPENAI_* typo gets the same warning as an AGENTIK_* one; the variables the openai SDK
    # itself reads (a shell may export them for other tools) are not typos
    register(SettingPrefix("OPENAI_", others=OPENAI_SDK_VARIABLES))


def make_backend(settings: Settings) -> Any:
    if settings["OPENAI_API_KEY"] and not settings["OPENAI_MODEL"]:  # a shell's key alone
        where = settings["OPENAI_BASE_URL"]
        settings.require("OPENAI_MODEL", hint=f"the model to ask at {where}, e.g. gpt-4o-mini")
    settings.require("OPENAI_API_KEY", "OPENAI_MODEL")
    from agentik_llm_openai.backend import OpenAIBackend

    return OpenAIBackend(
        base_url=settings["OPENAI_BASE_URL"],
        api_key=settings["OPENAI_API_KEY"],
        model=settings["OPENAI_MODEL"],
        timeout=settings["OPENAI_TIMEOUT"],
        max_retries=settings["OPENAI_MAX_RETRIES"],
        context_window=settings["OPENAI_CONTEXT_WINDOW"],
        max_tokens=settings["OPENAI_MAX_TOKENS"],
        tool_streaming=settings["OPENAI_TOOL_STREAMING"],
        image_input=settings["OPENAI_IMAGE_INPUT"],
    )


@hookimpl
def register_llm_backends(register: Callable[..., None]) -> None:
    register("openai", make_backend)  # aiohttp only: nothing extra to install
