"""The stable API for plugins: every name a plugin may use, in one place (docs/api.md).

Plugins import from here only::

    from agentik.api import Setting, hookimpl, tool

What lives under ``agentik.core`` is private: modules move, split and get renamed between
releases, and these names stay (they are re-exported from wherever the core keeps them).
``API_VERSION`` is ``MAJOR.MINOR``: a minor release only adds names, a major one may remove or
change them. A plugin that needs a given version says so when it is imported::

    from agentik.api import require_api

    require_api("1.0")  # a clear load error on an agentik with another major API, or older

Names are loaded on first use, so ``from agentik.api import hookimpl`` stays as cheap as
``import agentik``: a plugin module imports in milliseconds.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from agentik.hookspecs import hookimpl

API_VERSION = "1.1"

if TYPE_CHECKING:  # what the lazy table below gives, for type checkers and editors
    from agentik.core.agent import ChatAgent, ChatConversation
    from agentik.core.app import create_app, running
    from agentik.core.embedding import EmbeddingBackend, EmbeddingError
    from agentik.core.llm import (
        CONTEXT_LENGTH,
        HistoryItem,
        LLMBackend,
        LLMChunk,
        LLMConversation,
        LLMError,
        LLMInput,
        ReasoningDelta,
        TextDelta,
        ToolCallRequest,
        ToolResultInput,
        Truncated,
        Usage,
        UserInput,
        fold_summaries,
        history_images,
    )
    from agentik.core.memory import (
        CATEGORIES,
        SOURCES,
        MemoryBackend,
        Note,
        NoteError,
        check_category,
    )
    from agentik.core.models import for_agent
    from agentik.core.observe import (
        Observer,
        Span,
        TurnScope,
        current_span,
        trace_headers,
        turn_scope,
    )
    from agentik.core.oneshot import BadAnswer, ask_json, parse_json_answer, render_transcript
    from agentik.core.plugins import StartupError
    from agentik.core.protocol import Agent, Conversation
    from agentik.core.registry import Register
    from agentik.core.security import own_content_type, public
    from agentik.core.settings import (
        Setting,
        SettingPrefix,
        Settings,
        SettingsError,
        parse_bool,
        parse_choice,
        parse_fraction,
        parse_int,
        parse_list,
        parse_non_negative_float,
        parse_non_negative_int,
        parse_path,
        parse_port,
        parse_positive_float,
        parse_positive_int,
        parse_url,
    )
    from agentik.core.testing import (
        EchoLLM,
        ScriptedLLM,
        Turn,
        make_app,
        run_turn,
        started_agent,
        temporary_plugin,
    )
    from agentik.core.tools import Tool, ToolError, ToolSpec, tool
    from agentik.core.turns import TurnRecord, TurnState, Wait
    from agentik.core.types import (
        AppendText,
        ApprovalRequested,
        ContentPart,
        End,
        Event,
        ImagePart,
        Message,
        MessageContext,
        TextPart,
        ToolCall,
        ToolResult,
        UserMessage,
        Via,
        Waiting,
    )

#: public name -> the module that holds it today (the only place that changes when it moves)
_WHERE = {
    "ChatAgent": "agentik.core.agent",
    "ChatConversation": "agentik.core.agent",
    "create_app": "agentik.core.app",
    "running": "agentik.core.app",
    "EmbeddingBackend": "agentik.core.embedding",
    "EmbeddingError": "agentik.core.embedding",
    **dict.fromkeys(
        [
            "CONTEXT_LENGTH",
            "HistoryItem",
            "LLMBackend",
            "LLMChunk",
            "LLMConversation",
            "LLMError",
            "LLMInput",
            "ReasoningDelta",
            "TextDelta",
            "ToolCallRequest",
            "ToolResultInput",
            "Truncated",
            "Usage",
            "UserInput",
            "fold_summaries",
            "history_images",
        ],
        "agentik.core.llm",
    ),
    **dict.fromkeys(
        ["CATEGORIES", "SOURCES", "MemoryBackend", "Note", "NoteError", "check_category"],
        "agentik.core.memory",
    ),
    "for_agent": "agentik.core.models",
    **dict.fromkeys(
        ["Observer", "Span", "TurnScope", "current_span", "trace_headers", "turn_scope"],
        "agentik.core.observe",
    ),
    **dict.fromkeys(
        ["BadAnswer", "ask_json", "parse_json_answer", "render_transcript"],
        "agentik.core.oneshot",
    ),
    "StartupError": "agentik.core.plugins",
    "Agent": "agentik.core.protocol",
    "Conversation": "agentik.core.protocol",
    "Register": "agentik.core.registry",
    "own_content_type": "agentik.core.security",
    "public": "agentik.core.security",
    **dict.fromkeys(
        [
            "Setting",
            "SettingPrefix",
            "Settings",
            "SettingsError",
            "parse_bool",
            "parse_choice",
            "parse_fraction",
            "parse_int",
            "parse_list",
            "parse_non_negative_float",
            "parse_non_negative_int",
            "parse_path",
            "parse_port",
            "parse_positive_float",
            "parse_positive_int",
            "parse_url",
        ],
        "agentik.core.settings",
    ),
    **dict.fromkeys(
        [
            "EchoLLM",
            "ScriptedLLM",
            "Turn",
            "make_app",
            "run_turn",
            "started_agent",
            "temporary_plugin",
        ],
        "agentik.core.testing",
    ),
    **dict.fromkeys(["Tool", "ToolError", "ToolSpec", "tool"], "agentik.core.tools"),
    **dict.fromkeys(["TurnRecord", "TurnState", "Wait"], "agentik.core.turns"),
    **dict.fromkeys(
        [
            "AppendText",
            "ApprovalRequested",
            "ContentPart",
            "End",
            "Event",
            "ImagePart",
            "Message",
            "MessageContext",
            "TextPart",
            "ToolCall",
            "ToolResult",
            "UserMessage",
            "Via",
            "Waiting",
        ],
        "agentik.core.types",
    ),
}


class APIVersionError(ImportError):
    """The plugin needs an API this agentik does not have; the message says both versions."""


def _parse(version: str) -> tuple[int, int]:
    major, _, minor = version.strip().partition(".")
    try:
        return int(major), int(minor or 0)
    except ValueError:
        raise ValueError(f"an API version is MAJOR.MINOR, e.g. '1.0', not {version!r}") from None


def require_api(version: str) -> None:
    """Stop the plugin's import unless this agentik has API ``version`` (``"MAJOR.MINOR"``):
    the same major, and this minor or a later one. The plugin is then reported as failing to
    import with both versions named, instead of breaking later on a missing name."""
    want, have = _parse(version), _parse(API_VERSION)
    if want[0] != have[0] or want[1] > have[1]:
        from agentik import DISTRIBUTION, __version__

        raise APIVersionError(
            f"needs the agentik plugin API {version}, but {DISTRIBUTION} {__version__} has API "
            f"{API_VERSION}"
            + (f"; upgrade {DISTRIBUTION}" if want > have else f"; use an older {DISTRIBUTION}")
        )


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"agentik.api has no {name!r} (the public names: docs/api.md)")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = sorted(["API_VERSION", "APIVersionError", "hookimpl", "require_api", *_WHERE])
