"""The metrics of the GenAI conventions, exported through OpenTelemetry beside the traces:
``gen_ai.client.operation.duration`` (turns, model calls, tool calls) and
``gen_ai.client.token.usage``, plus turns and tool calls by outcome. The same numbers as the
Prometheus plugin's, for a backend that takes OTLP metrics."""

from __future__ import annotations

import os
from typing import Any

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from agentik import __version__
from agentik.core import observe
from agentik.core.observe import Observer, Span

OPERATIONS = (observe.TURN, observe.CHAT, observe.TOOL)
# the conventions' advice for these histograms
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                    40.96, 81.92)  # fmt: skip
TOKEN_BUCKETS = tuple(4**i for i in range(14))


class Metrics(Observer):
    def __init__(self, provider: MeterProvider) -> None:
        self.provider = provider
        meter = provider.get_meter("agentik", __version__)
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
        )
        self.turns = meter.create_counter(
            "agentik.turns", unit="{turn}", description="Turns by outcome and transport"
        )
        self.tool_calls = meter.create_counter(
            "agentik.tool_calls", unit="{call}", description="Tool calls by tool and outcome"
        )

    @classmethod
    def from_environment(cls, resource: Resource) -> Metrics | None:
        """``OTEL_METRICS_EXPORTER`` (``otlp``, the default, or ``none``), the OTLP variables and
        ``OTEL_METRIC_EXPORT_INTERVAL`` (ms, 60 s by default); None when it says none."""
        if "otlp" not in os.environ.get("OTEL_METRICS_EXPORTER", "otlp"):
            return None
        return cls.with_reader(PeriodicExportingMetricReader(OTLPMetricExporter()), resource)

    @classmethod
    def with_reader(cls, reader: MetricReader, resource: Resource | None = None) -> Metrics:
        return cls(MeterProvider(resource=resource or Resource.create(), metric_readers=[reader]))

    def end(self, span: Span) -> None:
        if span.kind not in OPERATIONS:
            return
        a = span.attributes
        common: dict[str, Any] = {"gen_ai.operation.name": span.kind}
        if span.error is not None:
            common["error.type"] = span.error
        if span.kind == observe.CHAT:
            common[observe.MODEL] = a[observe.MODEL]
            for key, kind in ((observe.INPUT_TOKENS, "input"), (observe.OUTPUT_TOKENS, "output")):
                if key in a:
                    usage = {**common, "gen_ai.token.type": kind}
                    usage.pop("error.type", None)
                    self.tokens.record(a[key], usage)
        elif span.kind == observe.TOOL:
            common[observe.TOOL_NAME] = a[observe.TOOL_NAME]
            outcome = "error" if span.error else "ok"
            self.tool_calls.add(1, {observe.TOOL_NAME: a[observe.TOOL_NAME], "outcome": outcome})
        else:
            transport = a.get(observe.TRANSPORT) or "in-process"
            outcome = a.get(observe.OUTCOME, "unknown")
            self.turns.add(1, {observe.OUTCOME: outcome, observe.TRANSPORT: transport})
        self.duration.record(span.duration, common)
