"""The core's observation points (agentik.core.observe): what an observer a plugin registers
is told about a turn, its model calls, tool calls, compactions and background work."""

from __future__ import annotations

import asyncio
import logging

from agentik import hookimpl
from agentik.core import observe
from agentik.core.app import AGENT
from agentik.core.llm import LLMError, ToolCallRequest, Usage
from agentik.core.observe import Observer, Observers, Span
from agentik.core.testing import ScriptedLLM, make_app, run_turn
from tests.sample_tools import Tools


class Recorder(Observer):
    """Keeps every span and event, and the turn scope and headers seen inside spans."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.ended: list[Span] = []
        self.events: list[tuple[str, str]] = []
        self.sent: list[str] = []
        self.scopes: list[observe.TurnScope | None] = []

    def accepted(self, conversation, message):
        self.sent.append(message.id)

    def start(self, span):
        self.spans.append(span)
        self.scopes.append(observe.turn_scope.get())

    def event(self, span, name, attributes):
        self.events.append((span.kind, name))

    def end(self, span):
        self.ended.append(span)

    def inject(self, span, headers):
        headers["x-span"] = span.name


class Observing:
    def __init__(self, *observers: Observer) -> None:
        self.observers = observers

    @hookimpl
    def register_observers(self, register, agent, settings):
        for o in self.observers:
            register(o)


def tree(spans: list[Span]) -> list[tuple[str, str | None]]:
    return [(s.name, s.parent.name if s.parent else None) for s in spans]


async def test_a_turn_with_two_tool_calls_gives_a_span_tree(aiohttp_client):
    rec = Recorder()
    llm = ScriptedLLM(
        [ToolCallRequest("c1", "add", '{"a": 1, "b": 2}'), Usage(10, 3)],
        [ToolCallRequest("c2", "boom", "{}"), Usage(14, 2)],
        ["all done", Usage(20, 4)],
    )
    app = make_app(llm=llm, plugins=[("o", Observing(rec)), ("t", Tools())])
    await aiohttp_client(app)
    turn = await run_turn(app[AGENT], "compute")
    tid = turn.history[0].id
    assert rec.sent == [tid]
    assert tree(rec.spans) == [
        ("invoke_agent agentik", None),
        ("chat scripted", "invoke_agent agentik"),
        ("execute_tool add", "invoke_agent agentik"),
        ("chat scripted", "invoke_agent agentik"),
        ("execute_tool boom", "invoke_agent agentik"),
        ("chat scripted", "invoke_agent agentik"),
    ]
    root = rec.spans[0]
    assert root.attributes[observe.CONVERSATION_ID] == turn.conversation.id
    assert root.attributes[observe.TURN_ID] == tid
    assert root.attributes[observe.OUTCOME] == "done" and root.error is None
    chats = [s for s in rec.spans if s.kind == observe.CHAT]
    assert [c.attributes[observe.FINISH_REASON] for c in chats] == [
        ("tool_calls",),
        ("tool_calls",),
        ("stop",),
    ]
    assert [c.attributes[observe.INPUT_TOKENS] for c in chats] == [10, 14, 20]
    assert rec.events.count(("chat", observe.FIRST_TOKEN)) == 3
    tools = [s for s in rec.spans if s.kind == observe.TOOL]
    assert [t.error for t in tools] == [None, "tool_error"]
    assert tools[0].attributes[observe.TOOL_CALL_ID] == "c1"
    # every span ended, children before their turn; all saw the turn's scope
    assert rec.ended[-1] is root and len(rec.ended) == len(rec.spans)
    assert {s.turn_id for s in rec.scopes if s} == {tid} and None not in rec.scopes
    assert observe.current_span() is None  # nothing leaks into the test's task


async def test_a_failed_turn_ends_with_its_error_code(aiohttp_client):
    rec = Recorder()
    llm = ScriptedLLM(LLMError("the server is down", "connection"))
    app = make_app(llm=llm, plugins=[("o", Observing(rec))])
    await aiohttp_client(app)
    await run_turn(app[AGENT], "hello")
    root, chat = rec.spans
    assert chat.error == "connection" and chat.parent is root
    assert root.error == "connection" and root.attributes[observe.OUTCOME] == "failed"


async def test_compaction_and_before_turn_work_have_spans(aiohttp_client):
    rec = Recorder()

    class Compactor:
        @hookimpl
        def compact_context(self, conversation, context_tokens, forced):
            async def summarize(items):
                return "summary"

            return conversation.compact(summarize, keep_turns=1)

    class Prefetch:
        @hookimpl
        def before_turn(self, conversation, text):
            async def look_up():
                return "[Memory context: none]"

            return look_up()

    plugins = [("o", Observing(rec)), ("c", Compactor()), ("m", Prefetch())]
    app = make_app(llm=ScriptedLLM(), plugins=plugins)
    await aiohttp_client(app)
    conv = await app[AGENT].create_conversation()
    for text in ("one", "two", "three"):
        await run_turn(conv, text)
    kinds = [s.kind for s in rec.spans]
    assert kinds.count(observe.BEFORE_TURN) == 3
    prefetch = next(s for s in rec.spans if s.kind == observe.BEFORE_TURN)
    assert prefetch.name == "before_turn m" and prefetch.parent.kind == observe.TURN
    assert prefetch.ended is not None and prefetch.error is None
    compactions = [s for s in rec.spans if s.kind == observe.COMPACTION]
    assert compactions and all(c.parent.kind == observe.TURN for c in compactions)
    done = [c for c in compactions if "agentik.compaction.dropped" in c.attributes]
    assert done and done[0].attributes["agentik.compaction.dropped"] >= 2
    assert len(done) == conv.compactions


async def test_background_work_is_a_root_span(aiohttp_client):
    rec = Recorder()
    app = make_app(plugins=[("o", Observing(rec))])
    await aiohttp_client(app)
    agent = app[AGENT]
    done = asyncio.Event()

    scopes = []

    async def review():
        scopes.append(observe.turn_scope.get())
        done.set()

    # submitted from inside a turn, as after_turn work is: the work is not that turn's
    token = observe.turn_scope.set(observe.TurnScope("conv_x", "msg_1"))
    try:
        agent.background.submit("memory review", "conv_x", review)
    finally:
        observe.turn_scope.reset(token)
    await asyncio.wait_for(done.wait(), 5)
    await asyncio.sleep(0.05)
    (span,) = rec.spans
    assert span.kind == observe.BACKGROUND and span.name == "memory review"
    assert span.parent is None and span.error is None and span.ended is not None
    assert scopes == [None]


async def test_outgoing_headers_come_from_the_observers_of_the_current_span():
    rec = Recorder()
    observers = Observers([rec])
    assert observe.trace_headers() == {}
    with observers.start(observe.TURN, "t", root=True):
        with observers.start(observe.TOOL, "inner"):
            assert observe.trace_headers() == {"x-span": "inner"}
        assert observe.trace_headers() == {"x-span": "t"}
    assert observe.trace_headers() == {}


async def test_a_failing_observer_is_logged_and_the_turn_goes_on(aiohttp_client, caplog):
    class Broken(Observer):
        def start(self, span):
            raise RuntimeError("observer bug")

    rec = Recorder()
    app = make_app(plugins=[("b", Observing(Broken(), rec))])
    await aiohttp_client(app)
    with caplog.at_level(logging.ERROR):
        turn = await run_turn(app[AGENT], "hi")
    assert turn.text == "echo: hi"
    assert "observer Broken failed" in caplog.text
    assert rec.spans[0].attributes[observe.OUTCOME] == "done"


async def test_without_observers_no_span_is_made_but_the_turn_scope_is_set(aiohttp_client):
    scopes = []

    class Peek:
        @hookimpl
        def before_turn(self, conversation, text):
            scopes.append((observe.turn_scope.get(), observe.current_span()))

    app = make_app(plugins=[("p", Peek())])
    await aiohttp_client(app)
    agent = app[AGENT]
    assert not agent.observers
    turn = await run_turn(agent, "hi")
    ((scope, span),) = scopes
    assert span is None and turn.conversation.runner.span is None
    assert scope.turn_id == turn.history[0].id and scope.conversation_id == turn.conversation.id
    assert scope.transport is None and scope.trace_id is None
    assert "trace" not in turn.history[0].payload  # nothing kept for a tracer that is not there


async def test_the_senders_trace_context_is_kept_with_the_message_for_its_turn(
    aiohttp_client, caplog
):
    class Sender(Observer):
        def trace_context(self):
            return {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}

    class Broken(Observer):
        def trace_context(self):
            raise RuntimeError("observer bug")

    rec = Recorder()
    app = make_app(plugins=[("o", Observing(Broken(), Sender(), rec))])
    await aiohttp_client(app)
    with caplog.at_level(logging.ERROR):
        turn = await run_turn(app[AGENT], "hi")
    kept = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    assert turn.history[0].payload["trace"] == kept  # stored: it outlives a restart
    root = rec.spans[0]
    assert root.kind == observe.TURN and root.trace_parent == kept and root.trace_links == ()
    assert "observer Broken failed" in caplog.text and turn.text == "echo: hi"
