"""The LLM backend contract. A custom backend implements these two small classes.

A backend makes long-lived :class:`LLMConversation` objects. The turn engine creates one per
chat from working memory on the first send and reuses it for later turns (so a backend can keep
a KV cache); it is dropped and rebuilt after an error, an interrupt, a restart or a compaction,
and when the system prompt changed and the backend cannot swap it in
(:meth:`LLMConversation.set_system_prompt`).

Each step of a turn is one call to :meth:`LLMConversation.stream` with the new inputs (the
user's text, or the results of the tool calls the model asked for). The conversation keeps its
own history: it appends the inputs and its own reply before the next call.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from agentik.core.tools import ToolSpec
from agentik.core.types import ImagePart, content_from_json

#: ``LLMError.code`` of a request the endpoint refused because the context is too long; the
#: turn engine answers it with one compaction and one retry of the step (when compaction is on)
CONTEXT_LENGTH = "context_length"
#: ``LLMError.code`` of a request the server took and then answered with nothing (llama-cpp-python
#: ends a stream with no data on any refusal): one reason can be a context too long, so with a
#: known context window the turn engine treats it like :data:`CONTEXT_LENGTH`
SILENT_REFUSAL = "no_reply"


class LLMError(Exception):
    """A failed LLM call. ``code`` goes to the Error record (e.g. ``http_503``, ``timeout``,
    :data:`CONTEXT_LENGTH`)."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


# --- what the engine feeds a conversation -------------------------------------------------


@dataclass(frozen=True, slots=True)
class UserInput:
    """The user's text; ``images`` only for a backend whose ``capabilities["image_input"]``."""

    text: str
    images: tuple[ImagePart, ...] = ()


@dataclass(frozen=True, slots=True)
class ToolResultInput:
    call_id: str
    tool_name: str
    text: str


LLMInput: TypeAlias = UserInput | ToolResultInput


# --- what a conversation streams back ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallRequest:
    """A complete tool call (a backend accumulates streamed fragments before yielding it)."""

    call_id: str
    name: str
    args_json: str


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one step, when the backend knows them; ``estimated`` when the backend
    guessed them (e.g. from the characters sent and received) because the endpoint sent none.

    ``input_tokens``: the whole context the model read for this step (system prompt, history,
    tools and the step's new input: OpenAI's ``prompt_tokens``), so it never shrinks from one
    step of a turn to the next; ``output_tokens``: what the model generated in this step. Each
    is a whole number, 0 or more, or None when unknown. The turn's record gets ``input`` = the
    first step's input and ``output`` = the growth of the context over the turn (the last
    step's input + output - the first step's input). Counts that break this are refused with
    a warning naming the backend, and the turn's counts are recorded as unknown."""

    input_tokens: int | None
    output_tokens: int | None
    estimated: bool = False


def usage_problem(usage: Usage) -> str | None:
    """What breaks the :class:`Usage` contract in one step's counts (``"input_tokens=-3"``), or
    None."""
    for name in ("input_tokens", "output_tokens"):
        value = getattr(usage, name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 0
        ):
            return f"{name}={value!r} (a whole number, 0 or more, or None)"
    return None


@dataclass(frozen=True, slots=True)
class Completion:
    """The answer to a one-shot prompt (:meth:`LLMBackend.one_shot`): its text, the token
    counts when the backend knows them, and whether it stopped at the output cap."""

    text: str
    usage: Usage | None = None
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class Truncated:
    """The reply stopped at the output-token cap or the end of the context (OpenAI's
    ``finish_reason: "length"``), not where the model meant to stop."""


LLMChunk: TypeAlias = TextDelta | ReasoningDelta | ToolCallRequest | Usage | Truncated


# --- working memory, as handed to a backend when it builds a conversation -----------------


@dataclass(frozen=True, slots=True)
class HistoryItem:
    """One working-memory entry: ``role`` is user|assistant|tool_call|tool_result|summary.

    A user entry's ``extra["images"]`` holds its image parts as JSON (:func:`history_images`)."""

    role: str
    text: str = ""
    call_id: str | None = None
    tool_name: str | None = None
    args_json: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def history_images(item: HistoryItem) -> tuple[ImagePart, ...]:
    """The image parts a user's working-memory entry carries."""
    raw = item.extra.get("images")
    return tuple(p for p in content_from_json(raw) if isinstance(p, ImagePart)) if raw else ()


#: how backends without a summary role give the model a ``summary`` history item (compaction)
SUMMARY_PREFIX = "Summary of the earlier conversation:\n"


def fold_summaries(
    system_prompt: str, history: Sequence[HistoryItem]
) -> tuple[str, list[HistoryItem]]:
    """Move the ``summary`` entries that open working memory (compaction puts its summary
    first) into the system prompt. As a user message the summary would stand right before the
    first kept user message, and chat templates that require user and assistant turns to
    alternate refuse two user messages in a row."""
    rest = list(history)
    summaries = []
    while rest and rest[0].role == "summary":
        summaries.append(SUMMARY_PREFIX + rest.pop(0).text)
    return "\n\n".join([p for p in (system_prompt, *summaries) if p]), rest


class LLMConversation(abc.ABC):
    """A live, stateful conversation with the model."""

    @abc.abstractmethod
    def stream(self, inputs: Sequence[LLMInput]) -> AsyncIterator[LLMChunk]:
        """Send ``inputs`` and stream the reply; raise :class:`LLMError` on failure.

        ``inputs`` may be empty: the conversation was just built from working memory that
        already ends with this step's tool results (a compaction in the middle of a tool loop),
        and the model answers them."""

    async def set_system_prompt(self, system_prompt: str) -> bool:
        """Replace the system prompt, keeping the history (a prompt section changed since the
        conversation was built: a reflection, an edited persona, a skill saved). Return False
        when the backend cannot (the default): the turn engine then builds a new conversation
        from working memory instead. Called between turns only."""
        return False

    def stream_without_tools(self, inputs: Sequence[LLMInput]) -> AsyncIterator[LLMChunk]:
        """:meth:`stream`, offering the model no tools for this reply: the last step of a turn
        whose model kept calling tools (``AGENTIK_MAX_TOOL_ROUNDS``). This default offers them
        all the same (a backend that cannot withhold them): a tool call then ends the turn with
        an error."""
        return self.stream(inputs)

    async def aclose(self) -> None:  # noqa: B027 - optional hook with a no-op default
        """Release what the conversation holds (a KV cache, a native handle)."""


class LLMBackend(abc.ABC):
    """A model provider: makes conversations and answers one-shot prompts."""

    #: Shown in the start-up banner, e.g. ``openai gpt-4o-mini @ http://…``.
    description: str = ""
    #: The model's name (``gen_ai.request.model`` of the ``chat {model}`` spans), "" if unknown.
    model_name: str = ""
    #: What the model can do (modalities, thinking, function calling), or None if unknown.
    capabilities: dict[str, Any] | None = None
    #: Context window in tokens, if configured or read from the model (used by compaction).
    context_window: int | None = None

    async def start(self) -> None:  # noqa: B027 - optional hook with a no-op default
        """Open clients or load the model; called once before the server accepts requests."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook with a no-op default
        """Close clients or the engine; called once at shutdown."""

    @abc.abstractmethod
    def create_conversation(
        self, system_prompt: str, history: Sequence[HistoryItem], tools: Sequence[ToolSpec]
    ) -> LLMConversation:
        """Start a conversation that already holds ``history`` (from working memory)."""

    @abc.abstractmethod
    async def complete(self, prompt: str, *, system_prompt: str | None = None) -> str:
        """One-shot completion without tools (summaries, reflection, mining, memory review)."""

    async def one_shot(
        self, prompt: str, *, system_prompt: str | None = None, max_tokens: int | None = None
    ) -> Completion:
        """A one-shot completion capped at ``max_tokens`` output tokens, with its token counts:
        what :mod:`agentik.core.oneshot` calls for every background feature. A backend should
        override it to honour the cap (a small local model that does not stop otherwise
        generates until its context is full) and to report the server's ``usage``; this
        default calls :meth:`complete`, uncapped and uncounted."""
        return Completion(await self.complete(prompt, system_prompt=system_prompt))
