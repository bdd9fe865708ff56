"""Observation points: what a turn does, told to plugins that trace, count or log it.

The core opens a :class:`Span` around each piece of work — a turn, a model call, a tool call,
a compaction, the ``before_turn`` hooks (memory prefetch), a background model call (memory
review, reflection, skill mining) — and tells each :class:`Observer` a plugin registered
(``register_observers``) when it starts, what happens in it (``first_token``) and how it ended.
An agent with no observer skips every point on one truthiness test of :class:`Observers`, so
observing costs nothing when it is off (bench/bench_observe.py).

Two context variables travel with the work (asyncio copies them into the tasks it starts):
:data:`turn_scope` holds the running turn's ids in the turn's task (set whether or not anyone
observes: JSON logs read it), and the current span, the parent of the next one
(:func:`current_span`). A plugin can open its own spans with ``agent.observers.start(...)``;
an outgoing HTTP request takes :func:`trace_headers` (W3C ``traceparent`` when tracing is on).

Attribute names follow the OpenTelemetry GenAI conventions where they have one
(``gen_ai.request.model``, ``gen_ai.usage.input_tokens``, ``gen_ai.tool.name``…).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentik.core.conversation import ChatConversation
    from agentik.core.types import Message

log = logging.getLogger(__name__)

# span kinds: the GenAI operation name where the conventions have one
TURN = "invoke_agent"  #: a turn, from its start to its end or its wait
CHAT = "chat"  #: one request to the model (a step; a retry after a compaction is another)
TOOL = "execute_tool"  #: one tool call
COMPACTION = "compaction"  #: working memory summarised (``conversation.compact``)
BEFORE_TURN = "before_turn"  #: one plugin's ``before_turn`` work (memory prefetch)
BACKGROUND = "background"  #: a background model call (memory review, reflection, mining)

# attributes the core sets (GenAI conventions, else agentik.*)
CONVERSATION_ID = "gen_ai.conversation.id"
TURN_ID = "agentik.turn.id"
TRANSPORT = "agentik.transport"
MODEL = "gen_ai.request.model"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
FINISH_REASON = "gen_ai.response.finish_reasons"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
OUTCOME = "agentik.outcome"  #: a turn's: done, failed, cancelled, waiting
ERROR_CODE = "error.type"  #: an LLMError's code, a failed turn's code, ``tool_error``
PLUGIN = "agentik.plugin"
FIRST_TOKEN = "gen_ai.first_token"  #: the event of a model call's first token
# the conversation's text, kept on the spans by reference (no copy): a plugin records it only
# when told to (OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT)
INPUT_TEXT = "agentik.input.text"  #: a turn's user text, as the model sees it
OUTPUT_TEXT = "agentik.output.text"  #: a turn's reply
TOOL_ARGUMENTS = "agentik.tool.arguments"  #: a tool call's arguments (JSON text)
TOOL_RESULT = "agentik.tool.result"  #: a tool call's result text


@dataclass(slots=True)
class TurnScope:
    """The running turn, in its task: for log lines and plugins. ``trace_id`` (32 hex digits)
    is set by a tracing plugin when it starts the turn's trace."""

    conversation_id: str
    turn_id: str
    transport: str | None = None
    trace_id: str | None = None


turn_scope: ContextVar[TurnScope | None] = ContextVar("agentik_turn", default=None)
_current: ContextVar[Span | None] = ContextVar("agentik_span", default=None)


def current_span() -> Span | None:
    """The innermost span open in this task (or the task that started it)."""
    return _current.get()


def trace_headers() -> dict[str, str]:
    """The headers an outgoing request of the current work carries (``traceparent``,
    ``tracestate`` when a tracing plugin is on); empty when nothing observes."""
    span = _current.get()
    if span is None:
        return {}
    headers: dict[str, str] = {}
    for observer in span.observers:
        _safely(observer.inject, span, headers)
    return headers


class Observer:
    """What a plugin implements to observe the core; every method is optional (a no-op here).
    They run on the turn's path, synchronously: keep them cheap, and never block. One that
    raises is logged and the work goes on. Keep per-span state in ``span.state[self]``."""

    def accepted(self, conversation: ChatConversation, message: Message) -> None:
        """A send was stored and its turn queued (in the task of the request that sent it; a
        request's trace headers for its turn come from :meth:`trace_context`)."""

    def start(self, span: Span) -> None:
        """``span`` started (its parent, if any, is ``span.parent``)."""

    def event(self, span: Span, name: str, attributes: dict[str, Any]) -> None:
        """Something happened in ``span`` (:data:`FIRST_TOKEN`)."""

    def end(self, span: Span) -> None:
        """``span`` ended: ``span.error`` (None: it succeeded), ``span.attributes`` final,
        ``span.duration`` in seconds."""

    def inject(self, span: Span, headers: dict[str, str]) -> None:
        """Add the propagation headers of an outgoing request made inside ``span``."""

    def trace_context(self) -> dict[str, str] | None:
        """The trace headers (W3C ``traceparent``, ``tracestate``) of the request being handled,
        in its task; None: none. The core keeps them with what the request asks for — a sent
        message's turn (stored with the message: they outlive a restart), an answer to a
        waiting turn — and hands them back on the turn's span (``span.trace_parent``,
        ``span.trace_links``), so that a turn that waited goes on in its trace."""
        return None


class Span:
    """A piece of work under observation (see the module's docstring). A context manager: the
    span ends on exit, with the exception's type as its error."""

    __slots__ = (
        "_current",
        "attributes",
        "ended",
        "error",
        "kind",
        "name",
        "observers",
        "parent",
        "started",
        "state",
        "trace_links",
        "trace_parent",
    )

    def __init__(
        self,
        observers: tuple[Observer, ...],
        kind: str,
        name: str,
        attributes: dict[str, Any],
        parent: Span | None,
        current: bool,
    ) -> None:
        self.kind, self.name, self.attributes = kind, name, attributes
        self.parent, self.observers = parent, observers
        self.state: dict[Any, Any] = {}  # each observer's own, by observer
        self.started = time.perf_counter()
        self.ended: float | None = None
        self.error: str | None = None
        self._current = current
        #: a root span's remote parent: the trace headers of the request that asked for it
        self.trace_parent: dict[str, str] | None = None
        #: the trace headers of other requests it follows from (the answers to a waiting turn)
        self.trace_links: tuple[dict[str, str], ...] = ()

    @property
    def duration(self) -> float:
        return (self.ended or time.perf_counter()) - self.started

    def set(self, **attributes: Any) -> None:
        self.attributes.update(attributes)

    def event(self, name: str, **attributes: Any) -> None:
        for observer in self.observers:
            _safely(observer.event, self, name, attributes)

    def end(self, error: str | None = None, **attributes: Any) -> None:
        """End it (once; later calls do nothing): ``error`` names what went wrong."""
        if self.ended is not None:
            return
        self.ended = time.perf_counter()
        self.attributes.update(attributes)
        self.error = error
        if self._current and _current.get() is self:
            _current.set(self.parent)
        for observer in reversed(self.observers):
            _safely(observer.end, self)

    def __enter__(self) -> Span:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.end(None if kind is None else getattr(e, "code", None) or kind.__name__)


class Observers:
    """An agent's observers. Falsy when there is none: the core's points test it first."""

    __slots__ = ("all",)

    def __init__(self, observers: Iterable[Observer] = ()) -> None:
        self.all: tuple[Observer, ...] = tuple(observers)

    def __bool__(self) -> bool:
        return bool(self.all)

    def add(self, observer: Observer) -> None:
        self.all = (*self.all, observer)

    def start(
        self,
        kind: str,
        name: str,
        attributes: dict[str, Any] | None = None,
        *,
        root: bool = False,
        current: bool = True,
        trace_parent: dict[str, str] | None = None,
        trace_links: Iterable[dict[str, str]] = (),
    ) -> Span:
        """Open a span, child of the current one (``root``: of none). ``current=False``: it does
        not become the parent of what this task opens next (work that runs beside it).
        ``trace_parent``, ``trace_links``: trace headers kept from requests (see
        :meth:`Observer.trace_context`)."""
        parent = None if root else _current.get()
        span = Span(self.all, kind, name, attributes or {}, parent, current)
        span.trace_parent, span.trace_links = trace_parent, tuple(trace_links)
        if current:
            _current.set(span)
        for observer in self.all:
            _safely(observer.start, span)
        return span

    def accepted(self, conversation: ChatConversation, message: Message) -> None:
        for observer in self.all:
            _safely(observer.accepted, conversation, message)

    def trace_context(self) -> dict[str, str] | None:
        """The current request's trace headers, as the observers tell them (None: none)."""
        headers: dict[str, str] = {}
        for observer in self.all:
            try:
                headers.update(observer.trace_context() or {})
            except Exception:
                log.exception("observer %s failed", type(observer).__name__)
        return headers or None


def _safely(method: Any, *args: Any) -> None:
    try:
        method(*args)
    except Exception:
        log.exception("observer %s failed", type(getattr(method, "__self__", method)).__name__)


__all__ = [
    "BACKGROUND",
    "BEFORE_TURN",
    "CHAT",
    "COMPACTION",
    "TOOL",
    "TURN",
    "Observer",
    "Observers",
    "Span",
    "TurnScope",
    "current_span",
    "trace_headers",
    "turn_scope",
]
