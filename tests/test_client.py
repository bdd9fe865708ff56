"""The Python client (agentik.client) against a real ``agentik serve``: the shared protocol
scenario run against the in-process agent and the remote one, resuming streams after dropped
connections and a killed server, sends retried without duplicates, errors, API keys."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from agentik.client import (
    APIError,
    ConnectionFailed,
    NotFound,
    RemoteAgent,
    Unauthorized,
)
from agentik.core.protocol import Agent, Conversation
from agentik.core.types import (
    AgentEvent,
    AppendText,
    End,
    Event,
    Gap,
    Interrupted,
    MessageContext,
    StartResponse,
    TextPart,
    ToolCall,
    ToolResult,
    UserMessage,
)
from agentik_llm_openai.backend import OpenAIBackend
from tests.conftest import ON_POSTGRES, free_port, script_fake
from tests.proxy import Proxy
from tests.test_serve import openai_env

KEY = "client-test-key-0123456789"


async def turn(stream: Any, timeout: float = 15) -> list[Event]:
    """The events of a stream up to and including the next End."""
    out: list[Event] = []

    async def run() -> None:
        async for event in stream:
            out.append(event)
            if isinstance(event, End):
                return

    await asyncio.wait_for(run(), timeout)
    return out


def text_of(events: list[Event]) -> str:
    return "".join(e.text for e in events if isinstance(e, AppendText) and not e.reasoning)


# --- one scenario, two implementations ---------------------------------------------------------


async def scenario(agent: Agent, script: Callable[..., Awaitable[None]]) -> None:
    """Written against the protocol only: it must pass in process and over HTTP alike."""
    agent_events = agent.events()
    conv: Conversation = await agent.create_conversation(title="first")
    created = await asyncio.wait_for(agent_events.__anext__(), 5)
    assert created == AgentEvent("ConversationCreated", conv.id)
    await agent_events.aclose()
    again = await agent.get_conversation(conv.id)
    assert again is not None and again.id == conv.id and again.title == "first"
    assert conv.id in [i.id for i in await agent.list_conversations()]
    assert await agent.get_conversation("conv-nope") is None

    # a streamed turn with context; the events are typed objects
    await script({"text": "Hello there, friend"})
    events = conv.events()
    context = MessageContext("event", "scheduled check", "cron-1", {"k": 1})
    sent = await conv.send([TextPart("wake up")], context)
    got = await turn(events)
    # every viewer sees the accepted message first, then its turn, whose End names it
    accepted = got[0]
    assert isinstance(accepted, UserMessage) and accepted.id == sent.id
    assert accepted.content == (TextPart("wake up"),) and accepted.context == context
    assert accepted.conversation_id == conv.id and accepted.created_at == sent.created_at
    assert isinstance(got[1], StartResponse) and got[-1] == End(sent.id)
    assert text_of(got) == "Hello there, friend"
    history = await conv.get_messages()
    assert [m.kind for m in history] == ["user", "assistant"]
    assert history[0].id == sent.id and history[0].payload["context"] == context.to_json()
    assert history[1].payload["text"] == "Hello there, friend"

    # the same idempotency key twice: stored and run once
    first = await conv.send([TextPart("once")], idempotency_key="key-1")
    second = await conv.send([TextPart("once")], idempotency_key="key-1")
    assert first.id == second.id
    got = await turn(events)
    assert text_of(got) == "echo: once"
    assert [e.id for e in got if isinstance(e, UserMessage)] == [first.id]  # announced once

    # a tool round (the tool does not exist here: the loop records the error and goes on)
    await script({"tool_calls": [["lookup", {"q": "x"}]]}, {"text": "done"})
    await conv.send([TextPart("use a tool")])
    got = await turn(events)
    call = next(e for e in got if isinstance(e, ToolCall))
    result = next(e for e in got if isinstance(e, ToolResult))
    assert call.tool_name == "lookup" and result.call_id == call.call_id and result.is_error

    # an interrupt stops a slow reply; nothing runs when idle
    assert await conv.ainterrupt() is False
    await script({"text": "slow " * 200, "delay": 0.02})
    await conv.send([TextPart("talk a lot")])
    got = [await asyncio.wait_for(events.__anext__(), 5) for _ in range(3)]
    assert await conv.ainterrupt() is True
    got += await turn(events)
    assert any(isinstance(e, Interrupted) for e in got) and isinstance(got[-1], End)
    await events.aclose()

    # history pages: offset, limit and after
    everything = await conv.get_messages(limit=200)
    kinds = ["user", "assistant", "user", "assistant", "user", "tool_call", "tool_result"]
    assert [m.kind for m in everything] == [*kinds, "assistant", "user", "assistant"]
    page = await conv.get_messages(offset=2, limit=3)
    assert [m.id for m in page] == [m.id for m in everything[2:5]]
    assert [m.id for m in await conv.get_messages(after=everything[7].id)] == [
        m.id for m in everything[8:]
    ]
    assert everything[-1].payload.get("interrupted") is True

    await conv.rename("renamed")
    assert conv.title == "renamed"
    assert (await agent.get_conversation(conv.id)).title == "renamed"  # type: ignore[union-attr]

    temp = await agent.create_conversation(temp=True)
    assert temp.is_temporal and temp.id not in [i.id for i in await agent.list_conversations()]
    assert await agent.delete_conversation(conv.id) is True
    assert await agent.get_conversation(conv.id) is None
    assert await agent.delete_conversation(conv.id) is False


async def test_the_protocol_scenario_in_process(make_agent, fake_openai_proc):
    llm = OpenAIBackend(
        base_url=fake_openai_proc, api_key="sk-test", model="fake-model", max_retries=0
    )
    await llm.start()
    agent = await make_agent(llm=llm)
    await scenario(agent, lambda *r: script_fake(fake_openai_proc, *r))
    await llm.aclose()


async def test_the_protocol_scenario_over_http(serve, fake_openai_proc):
    _, base = serve(openai_env(fake_openai_proc))
    async with RemoteAgent(base) as agent:
        await scenario(agent, lambda *r: script_fake(fake_openai_proc, *r))


# --- a proxy whose connections the test cuts ---------------------------------------------------


@pytest.fixture
async def proxied(serve, fake_openai_proc) -> AsyncIterator[tuple[Proxy, str]]:
    _, base = serve(openai_env(fake_openai_proc))
    proxy = Proxy(int(base.rsplit(":", 1)[1]))
    yield proxy, await proxy.start()
    await proxy.close()


async def test_a_dropped_stream_resumes_without_losing_or_repeating(proxied, fake_openai_proc):
    proxy, url = proxied
    words = [f"w{i} " for i in range(80)]
    await script_fake(fake_openai_proc, {"text": "".join(words), "delay": 0.01})
    async with RemoteAgent(url) as agent:
        conv = await agent.create_conversation()
        events = conv.events()
        await conv.send([TextPart("go")])
        got: list[Event] = []
        ids: list[int] = []
        cuts = 0
        async for event in events:
            got.append(event)
            ids.append(events.last_event_id)  # type: ignore[arg-type]
            if len(got) in (5, 30, 60):
                cuts += proxy.cut()  # mid-turn, three times
            if isinstance(event, End):
                break
        await events.aclose()
        assert cuts >= 3
        assert not any(isinstance(e, Gap) for e in got)
        assert ids == sorted(set(ids))  # each event once, in order
        assert [type(e) for e in got].count(StartResponse) == 1
        assert text_of(got) == "".join(words)
        history = await conv.get_messages()
        assert history[-1].payload["text"] == "".join(words)


async def test_a_stream_dropped_before_its_first_event_resumes_from_its_start(
    proxied, fake_openai_proc
):
    """The server says where a stream starts (Last-Event-ID response header): a connection
    lost before any event resumes there, so the turn sent meanwhile arrives whole."""
    proxy, url = proxied
    async with RemoteAgent(url) as agent:
        conv = await agent.create_conversation()
        events = conv.events()
        await conv.send([TextPart("first")])
        assert text_of(await turn(events)) == "echo: first"
        idle = conv.events()
        await conv.send([TextPart("warm")])  # waits until `idle` is subscribed
        await turn(events)
        await events.aclose()
        start = idle.last_event_id
        assert start is not None
        proxy.cut()  # `idle` has read nothing yet; its connection is gone
        await conv.send([TextPart("second")])
        got = await turn(idle)  # the "warm" turn, then the "second" turn
        got += await turn(idle)
        await idle.aclose()
        assert text_of(got) == "echo: warmecho: second"


async def test_a_send_whose_answer_was_lost_is_retried_once_stored(proxied):
    proxy, url = proxied
    async with RemoteAgent(url) as agent:
        conv = await agent.create_conversation()
        events = conv.events()
        proxy.drop_sends = 1
        msg = await conv.send([TextPart("only once")])
        assert proxy.drop_sends == 0  # the first answer was dropped: the client retried
        await turn(events)
        await events.aclose()
        users = [m for m in await conv.get_messages() if m.kind == "user"]
        assert [m.id for m in users] == [msg.id]


async def test_the_stream_survives_a_killed_and_restarted_server(serve, fake_openai_proc):
    """SIGKILL mid-turn, restart on the same database and port: the stream reconnects by
    itself, passes on the server's Gap (the cut turn's lost events are not invented) and
    delivers the cut turn (it had recorded nothing: it runs again) and the queued one, each
    once."""
    env = openai_env(fake_openai_proc, AGENTIK_PORT=str(free_port()))
    proc, base = serve(env)
    await script_fake(fake_openai_proc, {"text": "long " * 300, "delay": 0.02})
    async with RemoteAgent(base, retry_for=30) as agent:
        conv = await agent.create_conversation()
        events = conv.events()
        cut = await conv.send([TextPart("one")], idempotency_key="one")
        queued = await conv.send([TextPart("two")], idempotency_key="two")
        assert cut.turn in ("queued", "running") and queued.turn == "queued"
        got = [await asyncio.wait_for(events.__anext__(), 10) for _ in range(5)]
        ids = [events.last_event_id]
        proc.stop(signal.SIGKILL)
        restart = asyncio.get_running_loop().run_in_executor(None, serve, env)
        rest = await turn(events, timeout=60)
        rest += await turn(events, timeout=60)
        await restart
        ids.append(events.last_event_id)
        await events.aclose()
        gaps = [e for e in rest if isinstance(e, Gap)]
        if ON_POSTGRES:  # the events outlive the process: the new owner says where it lost
            assert gaps, rest
        else:
            assert len(gaps) == 1 and gaps[0].after == ids[0]  # resumed from the last id seen
        assert text_of(rest) == "echo: oneecho: two"  # the cut turn again, then the queued one
        assert [type(e) for e in rest].count(End) == 2
        assert all(isinstance(e, (UserMessage, StartResponse, AppendText)) for e in got)
        history = await conv.get_messages()
        assert [m.kind for m in history] == ["user", "user", "assistant", "assistant"]
        assert history[1].id == queued.id
        # a client that resends a message learns where its turn stands: the cut one ran again
        again = await conv.send([TextPart("one")], idempotency_key="one")
        assert again.id == cut.id and (again.turn, again.error) == ("done", None)
        again = await conv.send([TextPart("two")], idempotency_key="two")
        assert again.id == queued.id and (again.turn, again.error) == ("done", None)


# --- errors, timeouts, keys --------------------------------------------------------------------


async def test_http_errors_carry_the_server_code_and_message(serve, fake_openai_proc):
    _, base = serve(openai_env(fake_openai_proc))
    async with RemoteAgent(base) as agent:
        conv = await agent.create_conversation()
        with pytest.raises(APIError) as bad:
            await conv.send([])
        assert bad.value.status == 400 and bad.value.code == "invalid_request"
        assert "content" in bad.value.message
        with pytest.raises(APIError) as bad:
            await agent.request("GET", "/conversations", params={"limit": 5000})
        assert bad.value.code == "invalid_request" and "limit" in bad.value.message
        await agent.delete_conversation(conv.id)
        with pytest.raises(NotFound) as gone:
            await conv.send([TextPart("hello?")])
        assert gone.value.status == 404
        with pytest.raises(NotFound):
            await turn(conv.events(), timeout=5)

        # closing the client ends a stream another task is reading, quietly
        async def read_all(stream: Any) -> list[Event]:
            return [event async for event in stream]

        reader = asyncio.ensure_future(read_all(agent.events()))
        await asyncio.sleep(0.2)
        await agent.close()
        assert await asyncio.wait_for(reader, 5) == []


async def test_an_unreachable_server_fails_clearly_and_in_time():
    url = f"http://127.0.0.1:{free_port()}"
    async with RemoteAgent(url, retry_for=0.5, timeout=2) as agent:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(ConnectionFailed, match=r"gave up after 0\.5 s"):
            await agent.list_conversations()
        with pytest.raises(ConnectionFailed):
            await agent.create_conversation()  # not retried: it is not safe to do twice
        stream = agent.events()
        with pytest.raises(ConnectionFailed):
            await stream.__anext__()
        assert loop.time() - t0 < 5


async def test_the_api_key_from_the_option_or_the_environment(serve, fake_openai_proc, monkeypatch):
    _, base = serve(openai_env(fake_openai_proc, AGENTIK_API_KEY=KEY))
    monkeypatch.delenv("AGENTIK_API_KEY", raising=False)
    async with RemoteAgent(base) as agent:
        with pytest.raises(Unauthorized) as no:
            await agent.list_conversations()
        assert no.value.code == "unauthorized"
        with pytest.raises(Unauthorized):
            await agent.events().__anext__()
    async with RemoteAgent(base, api_key="wrong-key-0123456789") as agent:
        with pytest.raises(Unauthorized):
            await agent.create_conversation()
    for agent in (RemoteAgent(base, api_key=KEY), None):
        if agent is None:  # the key from the environment, as the server's variable gives it
            monkeypatch.setenv("AGENTIK_API_KEY", f"{KEY},another-key-0123456789")
            agent = RemoteAgent(base)
        async with agent:
            conv = await agent.create_conversation()
            events = conv.events()
            await conv.send([TextPart("with a key")])
            assert text_of(await turn(events)) == "echo: with a key"
            await events.aclose()


async def test_any_sse_layout_is_read_and_unknown_events_are_skipped(aiohttp_server):
    """Frames as the SSE format allows them, not only as agentik writes them."""
    from aiohttp import web

    body = (
        b": a comment\n\n"
        b'event: AppendText\nid: 11\ndata: {"type": "AppendText",\ndata: "text": "a"}\n\n'
        b"id: 12\n\n"  # an id alone moves the resume point
        b'id: 13\nevent: Future\ndata: {"type": "SomethingNew"}\n\n'
        b'id: 14\nevent: End\ndata:{"type":"End"}\n\n'
    )

    async def events(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(0, len(body), 7):  # in small pieces, frames split anywhere
            await resp.write(body[i : i + 7])
        await asyncio.sleep(10)
        return resp

    app = web.Application()
    app.router.add_get("/agentik/events", events)
    server = await aiohttp_server(app)
    async with RemoteAgent(str(server.make_url(""))) as agent:
        stream = agent.events()
        got = await turn(stream, timeout=5)
        assert got == [AppendText("a"), End()]
        assert stream.last_event_id == 14
        await stream.aclose()


async def test_a_silent_stream_reconnects_from_its_last_id_and_slow_requests_time_out(
    aiohttp_server,
):
    """A connection that stops sending (no event, no ping) for ``stream_idle`` seconds counts
    as dropped: the stream reconnects with Last-Event-ID. A request that hangs times out."""
    from aiohttp import web

    seen: list[str | None] = []

    async def events(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Last-Event-ID"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if len(seen) == 1:
            await resp.write(b'id: 41\nevent: StartResponse\ndata: {"type":"StartResponse"}\n\n')
        else:
            await resp.write(b'id: 42\nevent: End\ndata: {"type":"End"}\n\n')
        await asyncio.sleep(30)  # then silence, as a half-open connection would be
        return resp

    async def hang(request: web.Request) -> web.Response:
        await asyncio.sleep(30)
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/agentik/events", events)
    app.router.add_get("/agentik/conversations", hang)
    server = await aiohttp_server(app)
    url = str(server.make_url("")).rstrip("/")
    async with RemoteAgent(url, stream_idle=0.5, timeout=0.3, retry_for=0.8) as agent:
        stream = agent.events()
        assert await turn(stream, timeout=10) == [StartResponse(), End()]
        assert seen == [None, "41"]
        await stream.aclose()
        with pytest.raises(ConnectionFailed, match=r"gave up after 0\.8 s: timed out"):
            await agent.list_conversations()


async def test_a_read_the_caller_gives_up_on_ends_nothing(aiohttp_server):
    """``wait_for(stream.__anext__(), t)`` timing out used to cancel the stream's generator:
    the stream ended silently. Now the next read goes on, on the same connection, nothing lost
    or repeated."""
    from aiohttp import web

    connections = 0

    async def events(request: web.Request) -> web.StreamResponse:
        nonlocal connections
        connections += 1
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'id: 1\nevent: StartResponse\ndata: {"type":"StartResponse"}\n\n')
        for i in range(2, 5):
            await asyncio.sleep(0.4)  # slower than the reader waits
            frame = json.dumps({"type": "AppendText", "text": str(i)})
            await resp.write(f"id: {i}\nevent: AppendText\ndata: {frame}\n\n".encode())
        await resp.write(b'id: 5\nevent: End\ndata: {"type":"End"}\n\n')
        await asyncio.sleep(10)
        return resp

    app = web.Application()
    app.router.add_get("/agentik/events", events)
    server = await aiohttp_server(app)
    async with RemoteAgent(str(server.make_url(""))) as agent:
        stream = agent.events()
        got: list[Event] = []
        timeouts = 0
        while not got or not isinstance(got[-1], End):
            try:
                got.append(await asyncio.wait_for(stream.__anext__(), 0.1))
            except TimeoutError:
                timeouts += 1
        assert timeouts >= 3
        assert got == [StartResponse(), AppendText("2"), AppendText("3"), AppendText("4"), End()]
        assert stream.last_event_id == 5 and connections == 1
        await stream.aclose()


async def test_without_a_time_limit_it_keeps_trying_and_says_so(serve, fake_openai_proc):
    """``retry_for=None``: a stream and a send outlast a server that is away longer than any
    window (SIGKILL, restarted after a pause); ``on_retry`` hears every failed try, with the
    time since the first, then the recovery; back-off is capped at a second."""
    env = openai_env(fake_openai_proc, AGENTIK_PORT=str(free_port()))
    proc, base = serve(env)
    heard: list[tuple[str, float, bool]] = []

    def on_retry(what: str, seconds: float, failure: Exception | None) -> None:
        heard.append((what, seconds, failure is not None))

    async with RemoteAgent(base, retry_for=None, on_retry=on_retry) as agent:
        conv = await agent.create_conversation()
        events = conv.events()
        await conv.send([TextPart("before")])
        await turn(events)
        assert heard == []  # while connected it costs nothing
        proc.stop(signal.SIGKILL)
        sending = asyncio.ensure_future(conv.send([TextPart("while away")]))
        reading = asyncio.ensure_future(turn(events, timeout=60))
        await asyncio.sleep(4)
        assert not sending.done() and not reading.done()  # still trying
        proc, _ = await asyncio.get_running_loop().run_in_executor(None, serve, env)
        sent = await asyncio.wait_for(sending, 30)
        got = await asyncio.wait_for(reading, 30)
        await events.aclose()
    assert any(isinstance(e, Gap) for e in got) and got[-1] == End(sent.id)
    assert text_of(got) == "echo: while away"
    for what in {w for w, _, _ in heard}:
        tries = [(s, failed) for w, s, failed in heard if w == what]
        assert tries[-1][1] is False  # the recovery, said once at the end
        failures = [s for s, failed in tries if failed]
        assert failures == sorted(failures) and failures[-1] > 3
        waits = [b - a for a, b in itertools.pairwise(failures)]
        assert max(waits) < 1.6  # capped (1 s, plus the time a try takes)
