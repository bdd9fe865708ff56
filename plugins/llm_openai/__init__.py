"""The ``openai`` LLM backend: any OpenAI-compatible chat-completions endpoint.

Hooks only: the backend module is imported once this backend is chosen. It talks to the endpoint
with aiohttp (a core dependency), not the ``openai`` SDK, which measured as the bottleneck of a
turn (its per-request transform, its stream reader and its import; see ``backend.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentik.core import settings as cfg
from agentik.core.settings import Setting, Settings
from agentik.hookspecs import hookimpl

SETTINGS = (
    Setting(
        "OPENAI_BASE_URL",
        None,
        cfg.parse_url,
        "Required for `openai` and `http` embeddings: the endpoint, e.g. https://api.openai.com/v1",
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
def register_settings(register: Callable[[Setting], None]) -> None:
    for setting in SETTINGS:
        register(setting)


def make_backend(settings: Settings) -> Any:
    settings.require("OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL")
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
