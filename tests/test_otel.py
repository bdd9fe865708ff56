"""The traces plugin: the span tree of turns (the SDK's in-memory exporter), the W3C
traceparent in and out (the fake OpenAI server sees it), message content only when asked, and
a real OTLP/HTTP export to a receiver in the test, decoded with opentelemetry-proto."""

from __future__ import annotations

import asyncio
import gzip

import pytest
from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode, format_span_id, format_trace_id

from agentik import hookimpl
from agentik.core import observe
from agentik.core.app import AGENT
from agentik.core.llm import LLMError, ToolCallRequest, Usage
from agentik.core.testing import ScriptedLLM, make_app, run_turn, started_agent
from agentik_llm_openai.backend import OpenAIBackend
from tests.fake_openai import FakeOpenAI, Reply
from tests.sample_tools import Tools

TRACES = ("agentik_transport_http", "agentik_otel")
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


class Compactor:
    """Compacts before every send once there is something to compact."""

    @hookimpl
    def compact_context(self, conversation, context_tokens, forced):
        async def summarize(items):
            return "what was said before"

        return conversation.compact(summarize, keep_turns=1)


@pytest.fixture
def no_export(monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.delenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", raising=False)


def in_memory(app) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    app[AGENT].state["agentik_otel"].provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


async def send(client, cid: str, text: str, headers=None) -> str:
    body = [{"type": "text", "body": text}]
    r = await client.post(f"/agentik/conversations/{cid}/messages", json=body, headers=headers)
    assert r.status == 202, await r.text()
    return (await r.json())["id"]


async def new_conversation(client):
    r = await client.post("/agentik/conversations")
    return (await r.json())["id"]


async def test_a_turn_with_two_tool_calls_and_a_compaction(aiohttp_client, no_export):
    llm = ScriptedLLM(
        ["one"],
        ["two"],
        [ToolCallRequest("c1", "add", '{"a": 1, "b": 2}'), Usage(30, 3)],
        [ToolCallRequest("c2", "boom", "{}"), Usage(40, 2)],
        ["secret answer", Usage(50, 4)],
    )
    plugins = [("t", Tools()), ("c", Compactor())]
    app = make_app(llm=llm, plugins=plugins, builtins=TRACES, env={"AGENTIK_OTEL": "1"})
    exporter = in_memory(app)
    client = await aiohttp_client(app)
    cid = await new_conversation(client)
    conv = await app[AGENT].get_conversation(cid)
    for text in ("first", "second"):
        await send(client, cid, text)
        await conv.wait_idle()
    exporter.clear()
    tid = await send(client, cid, "a secret question")
    await conv.wait_idle()

    spans = exporter.get_finished_spans()
    (root,) = [s for s in spans if s.parent is None]
    assert root.name == "invoke_agent agentik"
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}
    children = sorted(
        (s.start_time, s.name)
        for s in spans
        if s is not root and s.parent.span_id == root.context.span_id
    )
    assert [name for _, name in children] == [
        "compaction",
        "chat scripted",
        "execute_tool add",
        "chat scripted",
        "execute_tool boom",
        "chat scripted",
    ]
    a = root.attributes
    assert a["gen_ai.operation.name"] == "invoke_agent"
    assert a["gen_ai.conversation.id"] == cid and a["agentik.turn.id"] == tid
    assert a["agentik.transport"] == "http" and a["agentik.outcome"] == "done"
    assert root.status.status_code is StatusCode.UNSET
    by_name = {s.name: s for s in spans}
    chat = [s for s in spans if s.name == "chat scripted"][-1]
    assert chat.attributes["gen_ai.request.model"] == "scripted"
    assert chat.attributes["gen_ai.usage.input_tokens"] == 50
    assert chat.attributes["gen_ai.usage.output_tokens"] == 4
    assert tuple(chat.attributes["gen_ai.response.finish_reasons"]) == ("stop",)
    assert [e.name for e in chat.events] == ["gen_ai.first_token"]
    assert by_name["execute_tool add"].attributes["gen_ai.tool.name"] == "add"
    assert by_name["execute_tool add"].status.status_code is StatusCode.UNSET
    failed = by_name["execute_tool boom"]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes["error.type"] == "tool_error"
    assert by_name["compaction"].attributes["agentik.compaction.dropped"] >= 2
    # no message text unless OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true
    values = [str(v) for s in spans for v in s.attributes.values()]
    assert not any("secret" in v for v in values)
    assert not any(k.startswith("agentik.input") for s in spans for k in s.attributes)


async def test_an_error_turn_has_error_status(aiohttp_client, no_export):
    llm = ScriptedLLM(LLMError("the model server failed (HTTP 500)", "http_500"))
    app = make_app(llm=llm, builtins=TRACES, env={"AGENTIK_OTEL": "1"})
    exporter = in_memory(app)
    await aiohttp_client(app)
    await run_turn(app[AGENT], "hello")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    root, chat = spans["invoke_agent agentik"], spans["chat scripted"]
    for span in (root, chat):
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes["error.type"] == "http_500"
    assert root.attributes["agentik.outcome"] == "failed"


async def test_traceparent_in_is_the_turns_parent_and_goes_out_to_the_model(
    aiohttp_client, no_export
):
    scopes = []

    class Peek:
        @hookimpl
        def before_turn(self, conversation, text):
            scopes.append(observe.turn_scope.get())

    fake = FakeOpenAI()
    await fake.start()
    fake.script(Reply("hi there", usage=(12, 3)))
    llm = OpenAIBackend(base_url=fake.base_url, api_key="sk", model="fake-model", max_retries=0)
    app = make_app(llm=llm, plugins=[("p", Peek())], builtins=TRACES, env={"AGENTIK_OTEL": "1"})
    exporter = in_memory(app)
    try:
        client = await aiohttp_client(app)
        cid = await new_conversation(client)
        header = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
        await send(client, cid, "hello", headers=header)
        await (await app[AGENT].get_conversation(cid)).wait_idle()
    finally:
        await fake.close()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    root, chat = spans["invoke_agent agentik"], spans["chat fake-model"]
    assert format_trace_id(root.context.trace_id) == TRACE_ID
    assert format_span_id(root.parent.span_id) == PARENT_ID and root.parent.is_remote
    assert chat.parent.span_id == root.context.span_id
    assert chat.attributes["gen_ai.usage.input_tokens"] == 12
    # the model's request carried the chat span as its parent
    (sent,) = fake.request_headers
    _, trace_id, span_id, _ = sent["traceparent"].split("-")
    assert (trace_id, span_id) == (TRACE_ID, format_span_id(chat.context.span_id))
    assert scopes[0].trace_id == TRACE_ID  # what JSON log lines of the turn carry


async def test_message_content_only_when_asked(aiohttp_client, no_export, monkeypatch):
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    llm = ScriptedLLM([ToolCallRequest("c1", "add", '{"a": 1, "b": 2}')], ["the sum is 3"])
    app = make_app(llm=llm, plugins=[("t", Tools())], builtins=TRACES, env={"AGENTIK_OTEL": "1"})
    exporter = in_memory(app)
    await aiohttp_client(app)
    await run_turn(app[AGENT], "add one and two")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    root = spans["invoke_agent agentik"]
    assert "add one and two" in root.attributes["gen_ai.input.messages"]
    assert "the sum is 3" in root.attributes["gen_ai.output.messages"]
    tool_span = spans["execute_tool add"]
    assert tool_span.attributes["gen_ai.tool.call.arguments"] == '{"a": 1, "b": 2}'
    assert tool_span.attributes["gen_ai.tool.call.result"] == "3"


async def test_off_by_default_and_on_with_the_otlp_endpoint(monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    assert not make_app(builtins=TRACES)[AGENT].observers
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    assert make_app(builtins=TRACES)[AGENT].observers
    assert not make_app(builtins=TRACES, env={"AGENTIK_OTEL": "0"})[AGENT].observers


async def test_a_real_otlp_http_export(monkeypatch):
    """The exporter's own wire format, to a receiver in the test: the spans arrive, decoded
    with opentelemetry-proto, with the service name and the turn's tree."""
    received: list[ExportTraceServiceRequest] = []
    paths: list[str] = []

    async def traces(request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        paths.append(request.path)
        received.append(ExportTraceServiceRequest.FromString(body))
        return web.Response(body=b"", content_type="application/x-protobuf")

    metrics: list[ExportMetricsServiceRequest] = []

    async def metrics_in(request: web.Request) -> web.Response:
        metrics.append(ExportMetricsServiceRequest.FromString(await request.read()))
        return web.Response(body=b"", content_type="application/x-protobuf")

    receiver = web.Application()
    receiver.router.add_post("/v1/traces", traces)
    receiver.router.add_post("/v1/metrics", metrics_in)
    runner = web.AppRunner(receiver)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    monkeypatch.delenv("OTEL_METRICS_EXPORTER", raising=False)
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    llm = ScriptedLLM([ToolCallRequest("c1", "add", '{"a": 2, "b": 2}')], ["four"])
    try:
        async with started_agent(llm=llm, plugins=[("t", Tools())], builtins=TRACES) as agent:
            turn = await run_turn(agent, "two and two")
        # leaving flushed the batch (the exporter posts from its own thread)
        for _ in range(100):
            if received:
                break
            await asyncio.sleep(0.05)
    finally:
        await runner.cleanup()
    assert paths and set(paths) == {"/v1/traces"}
    spans, services = [], set()
    for request in received:
        for rs in request.resource_spans:
            for kv in rs.resource.attributes:
                if kv.key == "service.name":
                    services.add(kv.value.string_value)
            for ss in rs.scope_spans:
                assert ss.scope.name == "agentik"
                spans.extend(ss.spans)
    assert services == {"agentik"}
    names = sorted(s.name for s in spans)
    assert names == ["chat scripted", "chat scripted", "execute_tool add", "invoke_agent agentik"]
    (root,) = [s for s in spans if s.name == "invoke_agent agentik"]
    assert all(s.trace_id == root.trace_id for s in spans)
    assert all(s.parent_span_id == root.span_id for s in spans if s is not root)
    attributes = {kv.key: kv.value for kv in root.attributes}
    assert attributes["gen_ai.conversation.id"].string_value == turn.conversation.id
    assert attributes["agentik.outcome"].string_value == "done"
    # and the metrics, through the metrics exporter's last collection at shutdown
    exported = {
        m.name: m
        for request in metrics
        for rm in request.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert {"gen_ai.client.operation.duration", "agentik.turns", "agentik.tool_calls"} <= set(
        exported
    )
    durations = exported["gen_ai.client.operation.duration"].histogram.data_points
    operations = {
        kv.value.string_value
        for p in durations
        for kv in p.attributes
        if kv.key == "gen_ai.operation.name"
    }
    assert operations == {"invoke_agent", "chat", "execute_tool"}


async def test_a_tool_call_to_an_mcp_server_carries_the_traceparent_in_meta(no_export):
    """SEP-414: the tools/call request's ``_meta`` holds the traceparent of the tool's span
    (a stdio server of the mcp SDK answers what it got)."""
    import json
    import sys
    from pathlib import Path

    from agentik.core.observe import Observers
    from agentik_otel.tracing import Tracing
    from agentik_tools_mcp.config import ServerConfig
    from agentik_tools_mcp.servers import MCPTools

    server = Path(__file__).parent / "mcp_meta_server.py"
    tools = MCPTools([ServerConfig("meta", "stdio", command=sys.executable, args=(str(server),))])
    await tools.start()
    exporter = InMemorySpanExporter()
    tracing = Tracing.from_environment()
    tracing.provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        (meta_tool,) = tools.tools
        observers = Observers([tracing])
        with (
            observers.start(observe.TURN, "invoke_agent agentik", root=True),
            observers.start(observe.TOOL, f"execute_tool {meta_tool.spec.name}"),
        ):
            text = await meta_tool.fn()
        got, _ = json.JSONDecoder().raw_decode(text)  # the result text: the JSON, then more
    finally:
        await tools.aclose()
    (tool_span,) = [s for s in exporter.get_finished_spans() if s.name.startswith("execute")]
    _, trace_id, span_id, _ = got["traceparent"].split("-")
    assert trace_id == format_trace_id(tool_span.context.trace_id)
    assert span_id == format_span_id(tool_span.context.span_id)


async def test_the_genai_client_metrics(aiohttp_client, no_export):
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from agentik_otel.metrics import Metrics

    llm = ScriptedLLM(
        [ToolCallRequest("c1", "add", '{"a": 1, "b": 2}'), Usage(30, 3)],
        ["three", Usage(40, 5)],
    )
    app = make_app(llm=llm, plugins=[("t", Tools())], builtins=TRACES, env={"AGENTIK_OTEL": "1"})
    reader = InMemoryMetricReader()
    app[AGENT].observers.add(Metrics.with_reader(reader))
    await aiohttp_client(app)
    await run_turn(app[AGENT], "add")
    points = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    points.setdefault(m.name, []).append((dict(p.attributes), p))
    usage = {a["gen_ai.token.type"]: p.sum for a, p in points["gen_ai.client.token.usage"]}
    assert usage == {"input": 70, "output": 8}
    ops = {
        a["gen_ai.operation.name"]: p.count for a, p in points["gen_ai.client.operation.duration"]
    }
    assert ops == {"invoke_agent": 1, "chat": 2, "execute_tool": 1}
    ((turn, count),) = [(a, p.value) for a, p in points["agentik.turns"]]
    assert turn == {"agentik.outcome": "done", "agentik.transport": "in-process"} and count == 1


@pytest.mark.parametrize(
    ("transport", "path", "body"),
    [
        (
            "agui",
            "/agui",
            {
                "threadId": "t-1",
                "runId": "run-1",
                "messages": [{"id": "u-1", "role": "user", "content": "hi"}],
                "tools": [],
                "context": [],
                "state": {},
                "forwardedProps": {},
            },
        ),
        (
            "openai",
            "/v1/chat/completions",
            {"model": "agentik", "messages": [{"role": "user", "content": "hi"}]},
        ),
    ],
)
async def test_other_transports_hand_the_traceparent_to_their_turn(
    aiohttp_client, no_export, transport, path, body
):
    builtins = (*TRACES, f"agentik_transport_{transport}")
    app = make_app(llm=ScriptedLLM(["hello"]), builtins=builtins, env={"AGENTIK_OTEL": "1"})
    exporter = in_memory(app)
    client = await aiohttp_client(app)
    header = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
    r = await client.post(path, json=body, headers=header)
    assert r.status == 200, await r.text()
    await r.read()
    for _ in range(100):  # the run's End may reach the client before the span ends
        spans = [s for s in exporter.get_finished_spans() if s.name == "invoke_agent agentik"]
        if spans:
            break
        await asyncio.sleep(0.02)
    (root,) = spans
    assert format_trace_id(root.context.trace_id) == TRACE_ID
    assert format_span_id(root.parent.span_id) == PARENT_ID
    assert root.attributes["agentik.transport"] == transport


@pytest.mark.parametrize("restart", [False, True], ids=["same-process", "after-a-restart"])
async def test_a_turn_that_waited_goes_on_in_the_senders_trace(
    aiohttp_client, no_export, tmp_path, restart
):
    """Sent with one traceparent, held for approval, approved over HTTP with another (in a
    restarted server too): both parts of the turn are in the sender's trace, and the part after
    the wait links to the request that answered it."""
    answer_trace, answer_parent = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    env = {
        "AGENTIK_OTEL": "1",
        "AGENTIK_TOOL_APPROVAL": "add",
        "AGENTIK_DB_PATH": str(tmp_path / "agentik.db"),
    }
    builtins = (*TRACES, "agentik_approvals")
    first, rest = [ToolCallRequest("c1", "add", '{"a": 1, "b": 2}')], ["three"]

    def server(*steps):
        app = make_app(
            llm=ScriptedLLM(*steps), plugins=[("t", Tools())], builtins=builtins, env=env
        )
        return app, in_memory(app)

    app, exporter = server(first, rest)
    client = await aiohttp_client(app)
    cid = await new_conversation(client)
    await send(client, cid, "add them", headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})
    for _ in range(200):
        r = await client.get(f"/agentik/conversations/{cid}/approvals")
        if (await r.json())["items"]:
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError("the tool call never waited for approval")
    before = list(exporter.get_finished_spans())
    if restart:
        await client.close()
        app, exporter = server(rest)
        client = await aiohttp_client(app)
    r = await client.post(
        f"/agentik/conversations/{cid}/approvals/c1",
        json={"approve": True},
        headers={"traceparent": f"00-{answer_trace}-{answer_parent}-01"},
    )
    assert r.status == 200, await r.text()
    await (await app[AGENT].get_conversation(cid)).wait_idle()
    after = [s for s in exporter.get_finished_spans() if s not in before]

    (waited,) = [s for s in before if s.name == "invoke_agent agentik"]
    (went_on,) = [s for s in after if s.name == "invoke_agent agentik"]
    assert waited.attributes["agentik.outcome"] == "waiting" and not waited.links
    assert went_on.attributes["agentik.outcome"] == "done"
    for part in (waited, went_on):  # children of the request that sent the message
        assert format_trace_id(part.context.trace_id) == TRACE_ID
        assert format_span_id(part.parent.span_id) == PARENT_ID and part.parent.is_remote
    (link,) = went_on.links  # ... and the part after the wait follows from the answer
    assert format_trace_id(link.context.trace_id) == answer_trace
    assert format_span_id(link.context.span_id) == answer_parent
    tool = next(s for s in after if s.name == "execute_tool add")
    assert tool.parent.span_id == went_on.context.span_id
    assert {s.context.trace_id for s in after} == {waited.context.trace_id}


async def test_without_the_sdk_start_up_says_what_to_install(monkeypatch):
    import sys

    from agentik.api import StartupError

    monkeypatch.setitem(sys.modules, "agentik_otel.tracing", None)  # the import fails
    with pytest.raises(StartupError, match=r"pip install 'agentik-runtime\[otel\]'"):
        async with started_agent(env={"AGENTIK_OTEL": "1"}, builtins=("agentik_otel",)):
            pass
