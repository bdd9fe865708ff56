"""The metrics: counters and histograms an observer keeps from the spans, gauges read from
the agent when scraped. One registry per agent (never prometheus_client's global one)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agentik.core import observe
from agentik.core.observe import Observer, Span

# seconds: a turn or a model call takes from well under a second (a cached reply) to minutes
SLOW = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
FAST = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics(Observer):
    def __init__(self, agent: Any) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.turns = Counter(
            "agentik_turns",
            "Turns that ended (or started waiting), by outcome and transport",
            ["outcome", "transport"],
            registry=r,
        )
        self.turn_seconds = Histogram(
            "agentik_turn_duration_seconds",
            "Time a turn ran, from its start to its end or wait",
            ["outcome"],
            buckets=SLOW,
            registry=r,
        )
        self.first_token = Histogram(
            "agentik_time_to_first_token_seconds",
            "Time from a request to the model to its first streamed token",
            ["model"],
            buckets=FAST,
            registry=r,
        )
        self.model_calls = Counter(
            "agentik_model_calls",
            "Requests to the model, by model and outcome",
            ["model", "outcome"],
            registry=r,
        )
        self.tokens = Counter(
            "agentik_tokens",
            "Tokens the model read (input) and wrote (output), as it counted",
            ["model", "direction"],
            registry=r,
        )
        self.llm_errors = Counter(
            "agentik_llm_errors",
            "Failed requests to the model, by error code",
            ["code"],
            registry=r,
        )
        self.tool_calls = Counter(
            "agentik_tool_calls",
            "Tool calls, by tool and outcome (ok, error)",
            ["tool", "outcome"],
            registry=r,
        )
        self.tool_seconds = Histogram(
            "agentik_tool_call_duration_seconds",
            "Time a tool call took",
            ["tool"],
            buckets=FAST,
            registry=r,
        )
        self.background = Counter(
            "agentik_background_calls",
            "Background model calls (memory review, reflection, "
            "skill mining), by feature and outcome",
            ["feature", "outcome"],
            registry=r,
        )
        self.storage_errors = Counter(
            "agentik_storage_errors",
            "Turns whose end the database refused (a full disk)",
            registry=r,
        )
        self.sends = Counter("agentik_sends", "Messages accepted (each queues a turn)", registry=r)
        r.register(_AgentGauges(agent))

    def accepted(self, conversation: Any, message: Any) -> None:
        self.sends.inc()

    def event(self, span: Span, name: str, attributes: dict[str, Any]) -> None:
        if span.kind == observe.CHAT and name == observe.FIRST_TOKEN:
            self.first_token.labels(span.attributes[observe.MODEL]).observe(span.duration)

    def end(self, span: Span) -> None:
        a = span.attributes
        if span.kind == observe.TURN:
            outcome = a.get(observe.OUTCOME, "unknown")
            self.turns.labels(outcome, a.get(observe.TRANSPORT) or "in-process").inc()
            self.turn_seconds.labels(outcome).observe(span.duration)
            if span.error == "storage":
                self.storage_errors.inc()
        elif span.kind == observe.CHAT:
            model = a[observe.MODEL]
            self.model_calls.labels(model, "error" if span.error else "ok").inc()
            if span.error:
                self.llm_errors.labels(span.error).inc()
            for key, direction in (
                (observe.INPUT_TOKENS, "input"),
                (observe.OUTPUT_TOKENS, "output"),
            ):
                if key in a:
                    self.tokens.labels(model, direction).inc(a[key])
        elif span.kind == observe.TOOL:
            tool = a[observe.TOOL_NAME]
            self.tool_calls.labels(tool, "error" if span.error else "ok").inc()
            self.tool_seconds.labels(tool).observe(span.duration)
        elif span.kind == observe.BACKGROUND:
            self.background.labels(span.name, span.error or "ok").inc()


class _AgentGauges:
    """What is true now, read from the agent at each scrape."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent

    def describe(self) -> list[Metric]:
        return []  # collect() is cheap, but reads a live agent: nothing to check at register

    def collect(self) -> Iterator[Metric]:
        convs = self.agent.conversations_in_memory()
        yield GaugeMetricFamily(
            "agentik_live_conversations",
            "Conversations held in memory",
            value=len(convs),
        )
        yield GaugeMetricFamily(
            "agentik_queued_sends",
            "Sent messages whose turn has not started yet",
            value=sum(len(c.inbox.queue) for c in convs),
        )
        yield GaugeMetricFamily(
            "agentik_running_turns",
            "Turns running now",
            value=sum(1 for c in convs if c.runner.task is not None),
        )
        streams = GaugeMetricFamily(
            "agentik_open_event_streams",
            "Readers of event streams (SSE and the like) open now, by stream",
            labels=["stream"],
        )
        streams.add_metric(["conversation"], sum(c.log.readers for c in convs))
        streams.add_metric(["agent"], self.agent.event_readers)
        yield streams
        yield CounterMetricFamily(
            "agentik_event_gaps",
            "Gaps given to event-stream readers that fell behind the buffer (AGENTIK_EVENT_BUFFER)",
            value=self.agent.event_ids.gaps,
        )


def handler(agent: Any) -> Callable[[web.Request], Any]:
    async def metrics(request: web.Request) -> web.Response:
        body = generate_latest(agent.state["agentik_metrics"].registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    return metrics
