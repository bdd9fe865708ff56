"""The observer that turns agentik's spans into OpenTelemetry spans (GenAI conventions), and
the middleware that keeps a request's ``traceparent`` for the turn it queues (the core stores
it with the message: every part of the turn, even after a wait or a restart, joins its trace)."""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

from aiohttp import web
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, format_trace_id
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from agentik import __version__
from agentik.core import observe
from agentik.core.observe import Observer, Span

CAPTURE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
#: what the core's spans carry of the conversation's text: kept only with CAPTURE=true
CONTENT = {
    observe.INPUT_TEXT: "gen_ai.input.messages",
    observe.OUTPUT_TEXT: "gen_ai.output.messages",
    observe.TOOL_ARGUMENTS: "gen_ai.tool.call.arguments",
    observe.TOOL_RESULT: "gen_ai.tool.call.result",
}
KINDS = {observe.CHAT: SpanKind.CLIENT}  # the others run in this process: INTERNAL

#: the W3C trace headers of the request being handled (set by :func:`keep_traceparent`)
_incoming: ContextVar[dict[str, str] | None] = ContextVar("agentik_traceparent", default=None)
_propagator = TraceContextTextMapPropagator()


@web.middleware
async def keep_traceparent(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    parent = request.headers.get("traceparent")
    if parent is not None:
        carrier = {"traceparent": parent}
        if (state := request.headers.get("tracestate")) is not None:
            carrier["tracestate"] = state
        _incoming.set(carrier)  # the handler's task is this request's own
    return await handler(request)


def resource() -> Resource:
    """The SDK's resource from OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; the service is
    ``agentik`` unless they name it."""
    named = "OTEL_SERVICE_NAME" in os.environ or "service.name=" in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    return Resource.create({} if named else {"service.name": "agentik"})


class Tracing(Observer):
    def __init__(self, provider: TracerProvider, capture: bool = False) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("agentik", __version__)
        self.capture = capture

    @classmethod
    def from_environment(cls) -> Tracing:
        """The standard OTEL_* variables: service name and resource, sampler, the exporters
        (``OTEL_TRACES_EXPORTER``: ``otlp``, ``console``, ``none``), the OTLP endpoint, headers
        and timeout (the SDK and the exporter read them)."""
        provider = TracerProvider(resource=resource())
        exporters = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").replace(" ", "").split(",")
        if "otlp" in exporters:
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        if "console" in exporters:
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        capture = os.environ.get(CAPTURE, "").strip().lower() == "true"
        return cls(provider, capture)

    # --- the observer -----------------------------------------------------------------------

    def trace_context(self) -> dict[str, str] | None:
        return _incoming.get()

    def start(self, span: Span) -> None:
        parent = span.parent.state.get(self) if span.parent is not None else None
        if parent is not None:
            context = trace.set_span_in_context(parent[0])
        elif span.trace_parent:  # the request that sent the turn's message
            context = _propagator.extract(span.trace_parent)
        else:
            context = None
        attributes = self._attributes(span.attributes)
        if span.kind in (observe.TURN, observe.CHAT, observe.TOOL):
            attributes["gen_ai.operation.name"] = span.kind
        if span.kind == observe.TURN:
            attributes["gen_ai.agent.name"] = "agentik"
        otel = self.tracer.start_span(
            span.name,
            context=context or trace.set_span_in_context(trace.INVALID_SPAN),
            kind=KINDS.get(span.kind, SpanKind.INTERNAL),
            attributes=attributes,
            links=_links(span.trace_links),
        )
        span.state[self] = (otel, len(span.attributes))  # those it has now are set
        if span.kind == observe.TURN and (scope := observe.turn_scope.get()) is not None:
            scope.trace_id = format_trace_id(otel.get_span_context().trace_id)

    def event(self, span: Span, name: str, attributes: dict[str, Any]) -> None:
        if self in span.state:
            span.state[self][0].add_event(name, self._attributes(attributes))

    def end(self, span: Span) -> None:
        otel, known = span.state.pop(self, (None, 0))
        if otel is None:
            return
        added = dict(list(span.attributes.items())[known:])  # set since it started
        if added:
            otel.set_attributes(self._attributes(added))
        if span.error is not None:
            otel.set_attribute("error.type", span.error)
            otel.set_status(Status(StatusCode.ERROR, span.error))
        otel.end()

    def inject(self, span: Span, headers: dict[str, str]) -> None:
        if self in span.state:
            _propagator.inject(headers, context=trace.set_span_in_context(span.state[self][0]))

    # --- helpers ----------------------------------------------------------------------------

    def _attributes(self, attributes: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in attributes.items():
            if value is None:
                continue
            if key in CONTENT:
                if self.capture:
                    out[CONTENT[key]] = _messages(key, value)
                continue
            out[key] = list(value) if isinstance(value, tuple) else value
        return out


def _links(carriers: tuple[dict[str, str], ...]) -> list[Link]:
    """Links to the requests a span follows from too (those that answered a waiting turn)."""
    links = []
    for carrier in carriers:
        context = trace.get_current_span(_propagator.extract(carrier)).get_span_context()
        if context.is_valid:
            links.append(Link(context))
    return links


def _messages(key: str, text: str) -> str:
    """The conventions' message JSON for a turn's text; tool arguments and results as they are."""
    if key == observe.INPUT_TEXT:
        return json.dumps([{"role": "user", "parts": [{"type": "text", "content": text}]}])
    if key == observe.OUTPUT_TEXT:
        return json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": text}]}])
    return text
