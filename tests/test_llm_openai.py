"""The ``openai`` backend against the fake OpenAI-compatible server on loopback (no mocks)."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

import agentik_llm_openai as plugin
from agentik.core.agent import ChatAgent
from agentik.core.cli import token_counts
from agentik.core.context_keeper import INTERRUPTED_NOTE
from agentik.core.llm import (
    CONTEXT_LENGTH,
    SILENT_REFUSAL,
    HistoryItem,
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
)
from agentik.core.registry import BackendRegistry
from agentik.core.settings import Settings, SettingsError
from agentik.core.store import MemoryStore, TokenStats
from agentik.core.tools import ToolRegistry, ToolSpec, tool
from agentik.core.types import MAX_IMAGE_BYTES, End, Error, ImagePart, InvalidInput, TextPart
from agentik_llm_openai import client as client_module
from agentik_llm_openai.backend import (
    NO_RESULT,
    EncodedMessages,
    OpenAIBackend,
    _add_fragment,
    encode_request,
    history_messages,
)
from agentik_llm_openai.client import retry_delay
from tests.conftest import collect_turn
from tests.fake_openai import FakeOpenAI, Quirks, Reply

ROOT = Path(__file__).resolve().parent.parent
WEATHER = ToolSpec(
    "get_weather",
    "Weather of a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


class Seen:
    """A middleware on the fake: what each request sent and when its handler ended; it can add
    headers to error responses, or replace their body."""

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []
        self.content_types: list[list[str]] = []
        self.peers: list[Any] = []  # the client's address: one per connection
        self.ended: list[float] = []
        self.error_headers: dict[str, str] = {}
        self.error_body: str | None = None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.headers.append(dict(request.headers))
        self.content_types.append(request.headers.getall("Content-Type", []))
        assert request.transport is not None
        self.peers.append(request.transport.get_extra_info("peername"))
        try:
            resp: web.StreamResponse = await handler(request)
        finally:
            self.ended.append(time.monotonic())
        if resp.status >= 300 and self.error_body is not None:
            resp = web.Response(status=resp.status, text=self.error_body)
        if resp.status >= 300:
            resp.headers.update(self.error_headers)
        return resp


@pytest.fixture
def seen() -> Seen:
    return Seen()


@pytest.fixture
async def fake(seen: Seen) -> AsyncIterator[FakeOpenAI]:
    server = FakeOpenAI()
    server.app.middlewares.append(seen.middleware)
    await server.start()
    yield server
    await server.close()


@pytest.fixture
def delays(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str | None, float]]:
    """Record each back-off the client computes (retry, Retry-After, seconds), then wait 0 s."""
    out: list[tuple[int, str | None, float]] = []

    def record(retry: int, retry_after: str | None) -> float:
        out.append((retry, retry_after, retry_delay(retry, retry_after)))
        return 0.0

    monkeypatch.setattr(client_module, "retry_delay", record)
    return out


def make_backend(base_url: str, **kw: Any) -> OpenAIBackend:
    kw = {"timeout": 5.0, "max_retries": 0, **kw}
    return OpenAIBackend(base_url=base_url, api_key="sk-test", model="fake-model", **kw)


@pytest.fixture
async def backend(fake: FakeOpenAI) -> AsyncIterator[OpenAIBackend]:
    llm = make_backend(fake.base_url)
    await llm.start()
    yield llm
    await llm.aclose()


async def collect(conv: LLMConversation, inputs: Sequence[LLMInput]) -> list[LLMChunk]:
    return [chunk async for chunk in conv.stream(inputs)]


def text_of(chunks: list[LLMChunk]) -> str:
    return "".join(c.text for c in chunks if isinstance(c, TextDelta))


# --- streaming ---------------------------------------------------------------------------


async def test_text_streams_in_order_with_usage(fake: FakeOpenAI, backend: OpenAIBackend) -> None:
    reply = "The quick brown fox jumps over the lazy dog."
    fake.script(Reply(reply, chunks=6, usage=(42, 9)))
    conv = backend.create_conversation("Be brief.", [], [])
    chunks = await collect(conv, [UserInput("Tell me a sentence.")])
    deltas = [c for c in chunks if isinstance(c, TextDelta)]
    assert len(deltas) == 6
    assert text_of(chunks) == reply
    assert chunks[-1] == Usage(42, 9)
    body = fake.requests[0]
    assert body["model"] == "fake-model"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert "tools" not in body
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Tell me a sentence."},
    ]
    assert conv.messages[-1] == {"role": "assistant", "content": reply}


async def test_usage_omitted_is_estimated_and_reasoning(
    fake: FakeOpenAI, backend: OpenAIBackend
) -> None:
    fake.script(Reply("Four.", reasoning="Two plus two is four.", usage=None))
    chunks = await collect(backend.create_conversation("", [], []), [UserInput("2+2? " * 10)])
    # characters / 4: 50 sent; 5 + 21 received (the reasoning too)
    assert chunks[-1] == Usage(12, 6, estimated=True)
    kinds = [type(c) for c in chunks]
    assert kinds.index(ReasoningDelta) < kinds.index(TextDelta)
    assert "".join(c.text for c in chunks if isinstance(c, ReasoningDelta)) == (
        "Two plus two is four."
    )
    assert text_of(chunks) == "Four."
    assert fake.requests[0]["messages"] == [{"role": "user", "content": "2+2? " * 10}]  # no system


async def test_parallel_tool_calls_accumulate_by_index(
    fake: FakeOpenAI, backend: OpenAIBackend
) -> None:
    fake.script(
        Reply(
            "Checking both.",
            tool_calls=[
                ("get_weather", {"city": "Paris", "note": "a longer argument string " * 3}),
                ("get_weather", {"city": "Tokyo"}),
            ],
        )
    )
    conv = backend.create_conversation("", [], [WEATHER])
    chunks = await collect(conv, [UserInput("Weather in Paris and Tokyo?")])
    calls = [c for c in chunks if isinstance(c, ToolCallRequest)]
    assert [c.name for c in calls] == ["get_weather", "get_weather"]
    assert [json.loads(c.args_json)["city"] for c in calls] == ["Paris", "Tokyo"]
    assert calls[0].call_id != calls[1].call_id
    assert text_of(chunks) == "Checking both."
    assert fake.requests[0]["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather of a city.",
                "parameters": WEATHER.parameters,
            },
        }
    ]


def test_fragments_interleaved_across_indexes() -> None:
    calls: dict[int, dict[str, Any]] = {}
    for fragment in [
        {
            "index": 0,
            "id": "call_a",
            "type": "function",
            "function": {"name": "add", "arguments": ""},
        },
        {
            "index": 1,
            "id": "call_b",
            "type": "function",
            "function": {"name": "mul", "arguments": '{"x"'},
        },
        {"index": 0, "function": {"arguments": '{"a": 1,'}},
        {"index": 1, "function": {"arguments": ": 3}"}},
        {"index": 0, "function": {"arguments": ' "b": 2}'}},
    ]:
        _add_fragment(calls, fragment)
    assert calls[0] == {"id": "call_a", "name": "add", "args": ['{"a": 1,', ' "b": 2}']}
    assert "".join(calls[1]["args"]) == '{"x": 3}'


async def test_multi_step_tool_conversation_messages(
    fake: FakeOpenAI, backend: OpenAIBackend
) -> None:
    fake.script(
        Reply(tool_calls=[("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]),
        Reply("Paris is sunny, Rome is rainy."),
        Reply("You're welcome."),
    )
    conv = backend.create_conversation("sys", [], [WEATHER])
    calls = [
        c for c in await collect(conv, [UserInput("Weather?")]) if isinstance(c, ToolCallRequest)
    ]
    results = [
        ToolResultInput(calls[0].call_id, "get_weather", "sunny"),
        ToolResultInput(calls[1].call_id, "get_weather", "rainy"),
    ]
    assert text_of(await collect(conv, results)) == "Paris is sunny, Rome is rainy."
    await collect(conv, [UserInput("Thanks!")])

    assistant_calls = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": calls[0].call_id,
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {
                "id": calls[1].call_id,
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
            },
        ],
    }
    step2 = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "Weather?"},
        assistant_calls,
        {"role": "tool", "tool_call_id": calls[0].call_id, "content": "sunny"},
        {"role": "tool", "tool_call_id": calls[1].call_id, "content": "rainy"},
    ]
    assert fake.requests[1]["messages"] == step2
    assert fake.requests[2]["messages"] == [
        *step2,
        {"role": "assistant", "content": "Paris is sunny, Rome is rainy."},
        {"role": "user", "content": "Thanks!"},
    ]


# --- history ------------------------------------------------------------------------------


def test_history_merges_text_and_tool_calls_and_keeps_summary() -> None:
    history = [
        HistoryItem("summary", "The user is planning a trip."),
        HistoryItem("user", "Weather in Paris and Rome?"),
        HistoryItem("assistant", "Let me check."),
        HistoryItem("tool_call", call_id="c1", tool_name="get_weather", args_json='{"city":"P"}'),
        HistoryItem("tool_call", call_id="c2", tool_name="get_weather", args_json='{"city":"R"}'),
        HistoryItem("tool_result", "sunny", call_id="c1", tool_name="get_weather"),
        HistoryItem("tool_result", "rainy", call_id="c2", tool_name="get_weather"),
        HistoryItem("tool_call", call_id="c3", tool_name="get_weather", args_json=""),
        HistoryItem("tool_result", "windy", call_id="c3", tool_name="get_weather"),
        HistoryItem("assistant", "Sunny in Paris, rainy in Rome."),
    ]
    assert history_messages("sys", history) == [
        {"role": "system", "content": "sys"},
        {
            "role": "user",
            "content": "Summary of the earlier conversation:\nThe user is planning a trip.",
        },
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"P"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"R"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rainy"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c3",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c3", "content": "windy"},
        {"role": "assistant", "content": "Sunny in Paris, rainy in Rome."},
    ]


def test_history_repairs_unpaired_tool_items() -> None:
    history = [
        HistoryItem("tool_result", "42", call_id="gone", tool_name="calc"),  # call compacted away
        HistoryItem("tool_call", call_id="c1", tool_name="calc", args_json="{}"),
        HistoryItem("user", "next"),  # c1 never got a result
    ]
    assert history_messages("", history) == [
        {"role": "user", "content": "[Result of tool calc]\n42"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": NO_RESULT},
        {"role": "user", "content": "next"},
    ]


async def test_conversation_from_history_sends_it(fake: FakeOpenAI, backend: OpenAIBackend) -> None:
    history = [HistoryItem("user", "My name is Ada."), HistoryItem("assistant", "Hello Ada!")]
    conv = backend.create_conversation("sys", history, [])
    assert text_of(await collect(conv, [UserInput("What is my name?")])) == (
        "echo: What is my name?"
    )
    assert fake.requests[0]["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "Hello Ada!"},
        {"role": "user", "content": "What is my name?"},
    ]


# --- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [500, 429, 401])
async def test_http_errors(fake: FakeOpenAI, backend: OpenAIBackend, status: int) -> None:
    fake.script(Reply(f"upstream says no ({status})", status=status))
    conv = backend.create_conversation("", [], [])
    with pytest.raises(LLMError) as info:
        await collect(conv, [UserInput("hi")])
    assert info.value.code == f"http_{status}"
    assert f"upstream says no ({status})" in info.value.message
    assert str(status) in info.value.message
    assert conv.messages == []


async def test_request_headers(fake: FakeOpenAI, seen: Seen, backend: OpenAIBackend) -> None:
    await collect(backend.create_conversation("", [], []), [UserInput("hi")])
    assert await backend.complete("hi") == "echo: hi"
    for headers in seen.headers:
        assert headers["Authorization"] == "Bearer sk-test"
        assert headers["Content-Type"] == "application/json"
    assert len(seen.headers) == 2 and seen.content_types == [["application/json"]] * 2


async def test_default_error_message_of_the_fake(fake: FakeOpenAI, backend: OpenAIBackend) -> None:
    fake.script(Reply(status=401))
    with pytest.raises(LLMError, match="Incorrect API key provided") as info:
        await collect(backend.create_conversation("", [], []), [UserInput("hi")])
    assert info.value.code == "http_401"


async def test_retries_then_succeeds_honouring_retry_after(fake: FakeOpenAI, seen: Seen) -> None:
    seen.error_headers = {"Retry-After": "0"}  # the back-off would be 0.375-0.5 s
    llm = make_backend(fake.base_url, max_retries=1)
    fake.script(Reply(status=500), Reply("recovered"))
    started = time.monotonic()
    try:
        chunks = await collect(llm.create_conversation("", [], []), [UserInput("hi")])
    finally:
        await llm.aclose()
    assert time.monotonic() - started < 0.3
    assert text_of(chunks) == "recovered"
    assert len(fake.requests) == 2
    assert fake.requests[0] == fake.requests[1]


async def test_retries_on_429_and_503_before_the_first_chunk(
    fake: FakeOpenAI, seen: Seen, delays: list[tuple[int, str | None, float]]
) -> None:
    seen.error_headers = {"Retry-After": "7"}
    llm = make_backend(fake.base_url, max_retries=2)
    fake.script(Reply(status=429), Reply(status=503), Reply("third time lucky"))
    try:
        chunks = await collect(llm.create_conversation("", [], []), [UserInput("hi")])
    finally:
        await llm.aclose()
    assert text_of(chunks) == "third time lucky"
    assert len(fake.requests) == 3
    assert delays == [(0, "7", 7.0), (1, "7", 7.0)]  # the server's Retry-After, read for real


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504])
async def test_retryable_statuses_give_up_after_max_retries(
    fake: FakeOpenAI, delays: list[tuple[int, str | None, float]], status: int
) -> None:
    llm = make_backend(fake.base_url, max_retries=2)
    fake.script(*[Reply(status=status)] * 3, Reply("not reached"))
    try:
        with pytest.raises(LLMError) as info:
            await collect(llm.create_conversation("", [], []), [UserInput("hi")])
    finally:
        await llm.aclose()
    assert info.value.code == f"http_{status}"
    assert len(fake.requests) == 3
    assert [(retry, after) for retry, after, _ in delays] == [(0, None), (1, None)]
    assert 0.375 <= delays[0][2] <= 0.5 and 0.75 <= delays[1][2] <= 1.0  # 0.5 s x 2^n, jittered


@pytest.mark.parametrize("status", [400, 401, 404, 422])
async def test_other_statuses_are_not_retried(
    fake: FakeOpenAI, delays: list[tuple[int, str | None, float]], status: int
) -> None:
    llm = make_backend(fake.base_url, max_retries=2)
    fake.script(Reply(status=status), Reply("not reached"))
    try:
        with pytest.raises(LLMError) as info:
            await llm.complete("hi")
    finally:
        await llm.aclose()
    assert info.value.code == f"http_{status}"
    assert len(fake.requests) == 1 and delays == []


async def test_no_retry_once_the_stream_has_started(
    fake: FakeOpenAI, delays: list[tuple[int, str | None, float]]
) -> None:
    llm = make_backend(fake.base_url, max_retries=2)
    fake.script(Reply("one two three four", fail_after=3), Reply("not reached"))
    received: list[LLMChunk] = []
    try:
        with pytest.raises(LLMError) as info:
            async for chunk in llm.create_conversation("", [], []).stream([UserInput("hi")]):
                received.append(chunk)
    finally:
        await llm.aclose()
    assert text_of(received) == "one two"
    assert info.value.code == "connection"
    assert len(fake.requests) == 1 and delays == []


async def test_complete_retries(
    fake: FakeOpenAI, delays: list[tuple[int, str | None, float]]
) -> None:
    llm = make_backend(fake.base_url, max_retries=1)
    fake.script(Reply(status=502), Reply("a summary"))
    try:
        assert await llm.complete("summarize") == "a summary"
    finally:
        await llm.aclose()
    assert len(fake.requests) == 2 and len(delays) == 1


async def test_a_timeout_before_the_reply_is_retried(
    fake: FakeOpenAI, delays: list[tuple[int, str | None, float]]
) -> None:
    llm = make_backend(fake.base_url, timeout=0.2, max_retries=1)
    fake.script(Reply("too late", delay=1.0), Reply("in time"))  # non-streamed: delays headers
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
    try:
        answer = await llm.client.complete(body)
    finally:
        await llm.aclose()
    assert answer["choices"][0]["message"]["content"] == "in time"
    assert len(fake.requests) == 2 and len(delays) == 1
    # a one-shot call (a background feature's) is not sent again: see test_oneshot.py


def test_retry_delay() -> None:
    assert retry_delay(0, "3") == 3.0
    assert retry_delay(5, "0") == 0.0
    assert retry_delay(0, "1.5") == 1.5
    assert retry_delay(0, "3600") == 60.0  # capped
    for retry, low, high in [(0, 0.375, 0.5), (1, 0.75, 1.0), (2, 1.5, 2.0), (9, 6.0, 8.0)]:
        for after in (None, "", "-1", "nan", "Wed, 21 Oct 2015 07:28:00 GMT"):  # back-off
            assert low <= retry_delay(retry, after) <= high, (retry, after)


async def test_timeout(fake: FakeOpenAI) -> None:
    llm = make_backend(fake.base_url, timeout=0.3)
    fake.script(Reply(hang=True), Reply(hang=True))
    try:
        with pytest.raises(LLMError) as info:
            await collect(llm.create_conversation("", [], []), [UserInput("hi")])
        assert info.value.code == "timeout"
        with pytest.raises(LLMError) as info:
            await llm.complete("hi")
        assert info.value.code == "timeout"
    finally:
        await llm.aclose()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_connection_refused(delays: list[tuple[int, str | None, float]]) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    llm = make_backend(url, max_retries=1)
    try:
        with pytest.raises(LLMError) as info:
            await collect(llm.create_conversation("", [], []), [UserInput("hi")])
        assert info.value.code == "connection"
        assert info.value.message == f"could not connect to the model server at {url}"
        with pytest.raises(LLMError) as info:
            await llm.complete("hi")
        assert info.value.code == "connection"
    finally:
        await llm.aclose()
    assert [retry for retry, _, _ in delays] == [0, 0]  # one retry each


async def test_broken_stream_leaves_messages_clean(
    fake: FakeOpenAI, backend: OpenAIBackend
) -> None:
    conv = backend.create_conversation(
        "sys", [HistoryItem("user", "a"), HistoryItem("assistant", "b")], []
    )
    before = list(conv.messages)
    fake.script(Reply("one two three four five six", fail_after=3), Reply("fine"))
    received: list[LLMChunk] = []
    with pytest.raises(LLMError) as info:
        async for chunk in conv.stream([UserInput("count")]):
            received.append(chunk)
    assert text_of(received) == "one two"  # the role chunk, then two words, then the drop
    assert info.value.code == "connection"
    assert conv.messages == before
    await collect(conv, [UserInput("again")])
    assert fake.requests[1]["messages"] == [*before, {"role": "user", "content": "again"}]


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("data: {not json\n\n", "bad_response"),
        ('data: {"choices": "nope"}\n\n', "bad_response"),
        ('data: {"choices": [{"index": 0, "delta": {"content": "cut"}}]}\n\n', "bad_response"),
        ('data: {"error": {"message": "model overloaded"}}\n\n', "upstream_error"),
    ],
)
async def test_malformed_streams(
    fake: FakeOpenAI, backend: OpenAIBackend, raw: str, code: str
) -> None:
    fake.script(Reply(raw=raw))
    conv = backend.create_conversation("", [], [])
    with pytest.raises(LLMError) as info:
        await collect(conv, [UserInput("hi")])
    assert info.value.code == code
    assert conv.messages == []


async def test_cancel_mid_stream_keeps_messages_clean_and_closes_the_response(
    fake: FakeOpenAI, seen: Seen, backend: OpenAIBackend
) -> None:
    fake.script(Reply("slow " * 50, delay=0.02))  # 1 s of stream
    conv = backend.create_conversation("", [], [])
    first = asyncio.Event()

    async def consume() -> None:
        async for _ in conv.stream([UserInput("go")]):
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), 5)
    task.cancel()
    cancelled = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert conv.messages == []
    deadline = cancelled + 5
    while not seen.ended and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert seen.ended[0] - cancelled < 0.3  # the fake's next write found the connection closed


# --- complete() ---------------------------------------------------------------------------


async def test_complete(fake: FakeOpenAI, backend: OpenAIBackend) -> None:
    fake.script(Reply("A short summary."), Reply("upstream broke", status=503))
    assert await backend.complete("Summarize this.", system_prompt="Be terse.") == (
        "A short summary."
    )
    assert not fake.requests[0].get("stream")
    assert fake.requests[0]["messages"] == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Summarize this."},
    ]
    with pytest.raises(LLMError) as info:
        await backend.complete("again")
    assert info.value.code == "http_503"
    assert "upstream broke" in info.value.message


# --- the plugin ---------------------------------------------------------------------------


def test_no_openai_sdk_anywhere() -> None:
    code = (
        "import sys, agentik_llm_openai, agentik_llm_openai.backend;"
        "heavy = [m for m in ('openai', 'httpx2', 'httpx', 'pydantic') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)


async def test_session_made_by_start_and_closed_by_aclose(fake: FakeOpenAI) -> None:
    llm = make_backend(fake.base_url)
    await llm.start()
    session = llm.client.session
    await collect(llm.create_conversation("", [], []), [UserInput("hi")])
    await llm.complete("hi")
    assert llm.client.session is session  # one session, reused
    await llm.aclose()
    assert session.closed
    await llm.aclose()  # twice is fine


@pytest.mark.parametrize("bypass", [False, True])
async def test_proxy_from_the_environment(
    fake: FakeOpenAI, seen: Seen, monkeypatch: pytest.MonkeyPatch, bypass: bool
) -> None:
    """HTTP_PROXY and NO_PROXY are honoured, as the SDK did: the fake is the proxy here (an
    aiohttp server answers an absolute-form request line by its path)."""
    for name in ("HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{fake.port}")
    if bypass:
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    target = f"127.0.0.1:{free_port()}"  # nothing listens there
    llm = make_backend(f"http://{target}/v1")
    try:
        if bypass:
            with pytest.raises(LLMError) as info:
                await llm.complete("hi")
            assert info.value.code == "connection"
        else:
            assert await llm.complete("hi") == "echo: hi"
            assert seen.headers[0]["Host"] == target
    finally:
        await llm.aclose()


async def test_connections_are_kept_alive(
    fake: FakeOpenAI, seen: Seen, backend: OpenAIBackend
) -> None:
    fake.script(Reply("a"), Reply(tool_calls=[("add", {"a": 1})]), Reply(status=500))
    for _ in range(2):
        await collect(backend.create_conversation("", [], []), [UserInput("hi")])
    with pytest.raises(LLMError):
        await backend.complete("hi")
    assert await backend.complete("hi") == "echo: hi"
    assert len(seen.peers) == 4 and len(set(seen.peers)) == 1


async def test_session_made_lazily_without_start(fake: FakeOpenAI) -> None:
    llm = make_backend(fake.base_url)
    try:
        assert await llm.complete("hi") == "echo: hi"
    finally:
        await llm.aclose()


def settings(**env: str) -> Settings:
    return Settings(plugin.SETTINGS, env)


def test_factory_names_missing_settings() -> None:
    with pytest.raises(SettingsError, match=r"^OPENAI_API_KEY, OPENAI_MODEL must be set$"):
        plugin.make_backend(settings())
    with pytest.raises(SettingsError) as info:
        plugin.make_backend(settings(OPENAI_BASE_URL="http://localhost:1/v1"))
    assert str(info.value) == "OPENAI_API_KEY, OPENAI_MODEL must be set"
    # a key alone (as many shells export): OpenAI's own endpoint, and the model it lacks
    with pytest.raises(SettingsError) as info:
        plugin.make_backend(settings(OPENAI_API_KEY="sk-x"))
    assert str(info.value) == (
        "OPENAI_MODEL must be set. the model to ask at https://api.openai.com/v1, e.g. gpt-4o-mini"
    )
    llm = plugin.make_backend(settings(OPENAI_API_KEY="sk-x", OPENAI_MODEL="gpt-4o-mini"))
    assert llm.description == "openai gpt-4o-mini @ https://api.openai.com/v1"


def test_settings_validated() -> None:
    with pytest.raises(SettingsError, match="OPENAI_MAX_RETRIES"):
        settings(OPENAI_MAX_RETRIES="-1")
    with pytest.raises(SettingsError, match="OPENAI_BASE_URL"):
        settings(OPENAI_BASE_URL="localhost:8000")
    with pytest.raises(SettingsError, match="OPENAI_CONTEXT_WINDOW"):
        settings(OPENAI_CONTEXT_WINDOW="0")
    with pytest.raises(SettingsError, match="OPENAI_TIMEOUT"):
        settings(OPENAI_TIMEOUT="soon")
    assert next(s for s in plugin.SETTINGS if s.name == "OPENAI_API_KEY").secret
    assert all(s.help for s in plugin.SETTINGS)
    defaults = settings()
    assert defaults["OPENAI_TIMEOUT"] == 60 and defaults["OPENAI_MAX_RETRIES"] == 2
    assert defaults["OPENAI_CONTEXT_WINDOW"] is None


def test_registered_backend_and_banner() -> None:
    registry = BackendRegistry("llm")
    plugin.register_llm_backends(register=registry.register_for("agentik_llm_openai"))
    entry = registry.get("openai", variable="AGENTIK_LLM_BACKEND")
    assert entry.extra is None and entry.requires == ()  # aiohttp only
    llm = entry.factory(
        settings(
            OPENAI_BASE_URL="http://localhost:11434/v1/",
            OPENAI_API_KEY="k",
            OPENAI_MODEL="llama3.2",
            OPENAI_CONTEXT_WINDOW="8192",
            OPENAI_TIMEOUT="2.5",
        )
    )
    assert isinstance(llm, OpenAIBackend)
    assert (llm.base_url, llm.model, llm.timeout, llm.context_window) == (
        "http://localhost:11434/v1",
        "llama3.2",
        2.5,
        8192,
    )
    assert llm.capabilities is None
    # the core's banner prints it as "llm: <description>"
    assert llm.description == "openai llama3.2 @ http://localhost:11434/v1"


# --- with the turn engine -----------------------------------------------------------------


async def run_turn(conv: Any, text: str) -> list[Any]:
    events = conv.events()
    await conv.send([TextPart(text)])
    out = []
    async for event in events:
        out.append(event)
        if isinstance(event, End):
            return out
    return out


async def test_tool_turn_through_the_chat_agent(fake: FakeOpenAI, backend: OpenAIBackend) -> None:
    @tool
    def add(a: int, b: int) -> str:
        """Add two numbers."""
        return str(a + b)

    agent = ChatAgent(
        store=MemoryStore(),
        llm=backend,
        tools=ToolRegistry([add]),
        prompt_sections=[(100, "base", lambda: "sys")],
    )
    conv = await agent.create_conversation()
    fake.script(
        Reply("Adding.", tool_calls=[("add", {"a": 2, "b": 3})]),
        Reply("It is 5."),
        Reply(status=500),
        Reply("Still here."),
    )
    events = await asyncio.wait_for(run_turn(conv, "2+3?"), 10)
    assert "".join(getattr(e, "text", "") for e in events if e.type == "AppendText") == (
        "Adding.It is 5."
    )
    assert fake.requests[1]["messages"][-1]["content"] == "5"
    events = await asyncio.wait_for(run_turn(conv, "fail"), 10)
    assert next(e for e in events if isinstance(e, Error)).code == "http_500"
    await asyncio.wait_for(run_turn(conv, "and now?"), 10)
    roles = [m["role"] for m in fake.requests[3]["messages"]]  # rebuilt from working memory
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert fake.requests[3]["messages"][2]["content"] == "Adding."
    await agent.close()


# --- the fake itself, as another process --------------------------------------------------


async def test_fake_as_a_process(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    args = [str(ROOT / "tests" / "fake_openai.py"), "--port", "0", "--port-file", str(port_file)]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *args, stdout=asyncio.subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 15
        while not port_file.exists():
            assert proc.returncode is None and time.monotonic() < deadline
            await asyncio.sleep(0.02)
        base = f"http://127.0.0.1:{port_file.read_text()}"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/v1/models") as r:
                assert (await r.json())["data"][0]["id"] == "fake-model"
            script = [
                {"text": "from the script", "tool_calls": [["add", {"a": 1}]], "usage": [7, 3]}
            ]
            async with http.post(f"{base}/_fake/script", json=script) as r:
                assert r.status == 200
            llm = make_backend(f"{base}/v1")
            try:
                chunks = await collect(llm.create_conversation("", [], []), [UserInput("x")])
            finally:
                await llm.aclose()
            assert text_of(chunks) == "from the script"
            call, usage = chunks[-2:]
            assert isinstance(call, ToolCallRequest)
            assert (call.name, call.args_json, usage) == ("add", '{"a": 1}', Usage(7, 3))
            async with http.get(f"{base}/_fake/requests") as r:
                assert [b["messages"] for b in await r.json()] == [
                    [{"role": "user", "content": "x"}]
                ]
            async with http.post(f"{base}/_fake/reset") as r:
                assert r.status == 200
            async with http.get(f"{base}/_fake/requests") as r:
                assert await r.json() == []
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 10) == 0


async def test_a_surrogate_pair_split_across_chunks_is_rejoined(
    fake: FakeOpenAI, backend: OpenAIBackend
) -> None:
    def chunk(text: str) -> str:
        escaped = json.dumps(text)  # ASCII-only: a lone surrogate becomes "\\ud83d"
        return f'data: {{"choices": [{{"index": 0, "delta": {{"content": {escaped}}}}}]}}\n\n'

    raw = (
        chunk("smile \ud83d")
        + chunk("\ude00 done \udc00")
        + 'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n'
        + "data: [DONE]\n\n"
    )
    fake.script(Reply(raw=raw))
    conv = backend.create_conversation("", [], [])
    chunks = await collect(conv, [UserInput("hi")])
    assert text_of(chunks) == "smile \U0001f600 done \ufffd"
    text_of(chunks).encode()  # valid UTF-8: SQLite and SSE clients can take it


async def test_sse_framing_crlf_comments_and_a_huge_line(
    fake: FakeOpenAI, backend: OpenAIBackend
) -> None:
    big = "y" * (3 << 20)  # one 3 MiB line: more than aiohttp's readline limit (512 KiB)
    first = json.dumps({"choices": [{"index": 0, "delta": {"content": "a"}}]})
    second = json.dumps({"choices": [{"index": 0, "delta": {"content": big}}]})
    done = json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    raw = (
        ": keep-alive\r\n\r\n"
        f"event: message\r\ndata: {first}\r\n\r\n"
        f"data:{second}\n\n"
        f"data: {done}\r\n\r\n"
        "data: [DONE]\r\n\r\n"
        "data: {after done: ignored\n\n"
    )
    fake.script(Reply(raw=raw))
    conv = backend.create_conversation("", [], [])
    chunks = await collect(conv, [UserInput("hi")])
    assert text_of(chunks) == "a" + big
    assert conv.messages[-1] == {"role": "assistant", "content": "a" + big}


# --- what real servers do (the fake's quirks; docs/llm_servers.md) -------------------------


@pytest.fixture
async def quirky(request: pytest.FixtureRequest) -> AsyncIterator[FakeOpenAI]:
    """A fake with the quirks of ``@pytest.mark.parametrize("quirky", [...], indirect=True)``."""
    server = FakeOpenAI(quirks=request.param)
    await server.start()
    yield server
    await server.close()


@pytest.fixture
async def quirky_backend(quirky: FakeOpenAI) -> AsyncIterator[OpenAIBackend]:
    llm = make_backend(quirky.base_url)
    await llm.start()
    yield llm
    await llm.aclose()


@pytest.mark.parametrize("quirky", [Quirks(repeat_tool_names=True)], indirect=True)
async def test_a_name_and_id_repeated_in_every_fragment_are_taken_once(
    quirky: FakeOpenAI, quirky_backend: OpenAIBackend
) -> None:
    quirky.script(
        Reply(tool_calls=[("time__get_current_time", {"zone": "UTC"}), ("get_weather", "{}")])
    )
    chunks = await collect(quirky_backend.create_conversation("", [], [WEATHER]), [UserInput("?")])
    calls = [c for c in chunks if isinstance(c, ToolCallRequest)]
    assert [(c.name, json.loads(c.args_json)) for c in calls] == [
        ("time__get_current_time", {"zone": "UTC"}),
        ("get_weather", {}),
    ]
    assert calls[0].call_id.startswith("call_") and len(calls[0].call_id) == 29  # not doubled


def test_a_name_streamed_in_parts_is_still_joined() -> None:
    calls: dict[int, dict[str, Any]] = {}
    for part in ("get_", "weather"):
        _add_fragment(calls, {"index": 0, "function": {"name": part}})
    assert calls[0]["name"] == "get_weather"


@pytest.mark.parametrize("quirky", [Quirks(string_content_only=True)], indirect=True)
async def test_tool_call_messages_carry_string_content(
    quirky: FakeOpenAI, quirky_backend: OpenAIBackend
) -> None:
    history = [
        HistoryItem("user", "weather?"),
        HistoryItem("tool_call", call_id="c1", tool_name="get_weather", args_json="{}"),
        HistoryItem("tool_result", "", call_id="c1", tool_name="get_weather"),
        HistoryItem("assistant", "Sunny."),
    ]
    conv = quirky_backend.create_conversation("sys", history, [WEATHER])
    quirky.script(Reply(tool_calls=[("get_weather", {"city": "Oslo"})]), Reply("Rain."))
    await collect(conv, [UserInput("and Oslo?")])
    call_id = conv.messages[-1]["tool_calls"][0]["id"]
    assert text_of(await collect(conv, [ToolResultInput(call_id, "get_weather", "")])) == "Rain."
    sent = quirky.requests[-1]["messages"]
    assert [m["content"] for m in sent if m["role"] in ("assistant", "tool")] == [
        "",
        "",
        "Sunny.",
        "",
        "",
    ]


@pytest.mark.parametrize("quirky", [Quirks(tools_need_tool_choice=True)], indirect=True)
async def test_tools_are_offered_with_tool_choice_auto(
    quirky: FakeOpenAI, quirky_backend: OpenAIBackend
) -> None:
    quirky.script(Reply(tool_calls=[("get_weather", {"city": "Oslo"})]), Reply("hi"))
    chunks = await collect(quirky_backend.create_conversation("", [], [WEATHER]), [UserInput("?")])
    assert [c.name for c in chunks if isinstance(c, ToolCallRequest)] == ["get_weather"]
    assert quirky.requests[0]["tool_choice"] == "auto"
    await collect(quirky_backend.create_conversation("", [], []), [UserInput("no tools")])
    assert "tool_choice" not in quirky.requests[1] and "tools" not in quirky.requests[1]


@pytest.mark.parametrize("quirky", [Quirks(no_streamed_tools=True)], indirect=True)
async def test_a_server_that_cannot_stream_tools_gets_a_clear_error_then_a_whole_reply(
    quirky: FakeOpenAI,
) -> None:
    llm = make_backend(quirky.base_url)
    quirky.script(Reply("unused"))
    with pytest.raises(LLMError) as info:
        await collect(llm.create_conversation("", [], [WEATHER]), [UserInput("?")])
    assert info.value.code == SILENT_REFUSAL  # a 200 and an empty stream
    assert "OPENAI_TOOL_STREAMING=false" in info.value.message
    quirky.script(Reply("Automatic streaming tool choice is not supported", status=500))
    with pytest.raises(LLMError) as info:  # the same refusal, before the 200
        await collect(llm.create_conversation("", [], [WEATHER]), [UserInput("?")])
    assert info.value.message.startswith("the model server failed (HTTP 500): Automatic")
    assert info.value.message.endswith("set OPENAI_TOOL_STREAMING=false")
    await llm.aclose()

    llm = make_backend(quirky.base_url, tool_streaming=False)
    quirky.script(
        Reply("Checking.", tool_calls=[("get_weather", {"city": "Oslo"})], usage=(30, 7)),
        Reply("Rain in Oslo.", reasoning="Easy.", usage=(50, 4)),
    )
    conv = llm.create_conversation("", [], [WEATHER])
    chunks = await collect(conv, [UserInput("Oslo?")])
    assert [type(c).__name__ for c in chunks] == ["TextDelta", "ToolCallRequest", "Usage"]
    call = chunks[1]
    assert isinstance(call, ToolCallRequest) and json.loads(call.args_json) == {"city": "Oslo"}
    assert chunks[2] == Usage(30, 7)
    chunks = await collect(conv, [ToolResultInput(call.call_id, "get_weather", "rain")])
    assert chunks == [ReasoningDelta("Easy."), TextDelta("Rain in Oslo."), Usage(50, 4)]
    assert [r.get("stream", False) for r in quirky.requests[2:]] == [False, False]
    assert conv.messages[-1] == {"role": "assistant", "content": "Rain in Oslo."}
    await collect(llm.create_conversation("", [], []), [UserInput("no tools")])
    assert quirky.requests[-1]["stream"] is True  # without tools it still streams
    await llm.aclose()


async def test_error_texts_are_one_sentence_with_details_in_the_log(
    fake: FakeOpenAI, seen: Seen, backend: OpenAIBackend, caplog: pytest.LogCaptureFixture
) -> None:
    useful = "messages.3.content: Input should be a valid string " + "x" * 600 + " THE END"
    fake.script(Reply(useful, status=400))
    with pytest.raises(LLMError) as info:
        await collect(backend.create_conversation("", [], []), [UserInput("hi")])
    assert info.value.message == f"the model server rejected the request (HTTP 400): {useful}"

    seen.error_body = "<html><body>Bad gateway " + "x" * 2000 + "</body></html>"
    fake.script(Reply(status=502))
    with caplog.at_level("WARNING"), pytest.raises(LLMError) as info:
        await collect(backend.create_conversation("", [], []), [UserInput("hi")])
    assert info.value.message == "the model server failed (HTTP 502 Bad Gateway)"
    assert "Bad gateway xxx" in caplog.text  # the body is in the log

    fake.script(Reply("one two three four", fail_after=3))
    caplog.clear()
    with caplog.at_level("WARNING"), pytest.raises(LLMError) as info:
        await collect(backend.create_conversation("", [], []), [UserInput("hi")])
    assert info.value.message == "the model server closed the stream in the middle of the reply"
    assert "Payload" in caplog.text or "payload" in caplog.text

    # llama-cpp-python refuses a streamed request with a 200 and an empty stream; or cut
    fake.script(Reply("never sent", raw=""), Reply("never sent", fail_after=0))
    for _ in range(2):
        with pytest.raises(LLMError) as info:
            await collect(backend.create_conversation("", [], []), [UserInput("hi")])
        assert info.value.message == (
            "the model server ended the stream without a reply (its log says why)"
        )

    fake.script(Reply(raw="data: {not json\n\n"))
    with pytest.raises(LLMError) as info:
        await collect(backend.create_conversation("", [], []), [UserInput("hi")])
    assert info.value.message == "the model server sent a reply that could not be read"


async def test_output_cap_and_a_truncated_reply(fake: FakeOpenAI) -> None:
    llm = make_backend(fake.base_url, max_tokens=64)
    fake.script(Reply("A long story that goes on and", finish="length"), Reply("Short."))
    conv = llm.create_conversation("", [], [])
    chunks = await collect(conv, [UserInput("Tell me a story.")])
    assert fake.requests[0]["max_tokens"] == 64
    assert isinstance(chunks[-2], Truncated) and isinstance(chunks[-1], Usage)
    assert conv.messages[-1]["content"] == "A long story that goes on and"  # kept, as seen
    assert not any(isinstance(c, Truncated) for c in await collect(conv, [UserInput("Again")]))
    assert await llm.complete("hi") == "echo: hi"
    assert fake.requests[2]["max_tokens"] == 64
    await llm.aclose()
    llm = make_backend(fake.base_url)
    await collect(llm.create_conversation("", [], []), [UserInput("x")])
    await llm.aclose()
    assert "max_tokens" not in fake.requests[3]  # unset: the server's own cap


@pytest.mark.parametrize(
    ("status", "message", "code"),
    [
        (400, "This model's maximum context length is 4096 tokens.", "context_length_exceeded"),
        (400, "Please reduce the length of the messages.", "context_length_exceeded"),
        (400, "the request exceeds the available context size, try increasing it", None),
        (400, "Requested tokens (5000) exceed context window of 4096", None),
        (400, "litellm.ContextWindowExceededError: prompt is too long", None),
        (
            500,
            "Trying to keep the first 5000 tokens when context the overflows. The context "
            "length is 4096.",
            None,
        ),
    ],
)
async def test_context_length_refusals_say_what_to_set(
    fake: FakeOpenAI, status: int, message: str, code: str | None
) -> None:
    for window, advice in [
        (None, "set OPENAI_CONTEXT_WINDOW to the server's context size to turn on compaction"),
        (8192, "lower OPENAI_CONTEXT_WINDOW (now 8192) so compaction starts earlier"),
    ]:
        llm = make_backend(fake.base_url, context_window=window)
        fake.script(Reply(message, status=status, code=code))
        with pytest.raises(LLMError) as info:
            await collect(llm.create_conversation("", [], []), [UserInput("hi")])
        await llm.aclose()
        assert info.value.code == CONTEXT_LENGTH
        assert info.value.message == (
            f"the conversation no longer fits the model's context ({message}); {advice}, "
            "or start a new conversation"
        )


async def test_a_context_error_inside_the_stream(fake: FakeOpenAI, backend: OpenAIBackend) -> None:
    too_long = "the request exceeds the available context size, try increasing it"
    fake.script(Reply(raw=f'data: {{"error": {{"message": "{too_long}"}}}}\n\n'))
    with pytest.raises(LLMError) as info:
        await collect(backend.create_conversation("", [], []), [UserInput("hi")])
    assert info.value.code == CONTEXT_LENGTH
    fake.script(Reply(status=400), Reply(status=401))  # other refusals are not context ones
    for code in ("http_400", "http_401"):
        with pytest.raises(LLMError) as info:
            await collect(backend.create_conversation("", [], []), [UserInput("hi")])
        assert info.value.code == code


# --- what the turn engine makes of it (#14) --------------------------------------------------


async def chat(backend: OpenAIBackend) -> tuple[ChatAgent, Any]:
    agent = ChatAgent(
        store=MemoryStore(), llm=backend, prompt_sections=[(100, "base", lambda: "sys")]
    )
    return agent, await agent.create_conversation()


async def turn_events(conv: Any, text: str) -> list[Any]:
    events = asyncio.ensure_future(collect_turn(conv))
    await asyncio.sleep(0)
    await conv.send([TextPart(text)])
    return await events


async def test_a_truncated_reply_is_recorded_as_such(fake: FakeOpenAI) -> None:
    agent, conv = await chat(make_backend(fake.base_url, max_tokens=8))
    fake.script(Reply("It was a dark and", finish="length", usage=(20, 8)), Reply("Fine."))
    events = await turn_events(conv, "Tell me a story.")
    assert [e.type for e in events[-2:]] == ["Truncated", "End"]
    assert (await turn_events(conv, "Short, please."))[-2].type == "AppendText"
    await conv.wait_idle()
    records = [m.to_json() for m in await conv.get_messages()]
    assert records[1]["type"] == "assistant" and records[1]["truncated"] is True
    assert records[1]["tokens"] == {"input": 20, "output": 8}
    assert "truncated" not in records[3]
    assert fake.requests[1]["messages"][2] == {"role": "assistant", "content": "It was a dark and"}
    await agent.close()
    await agent.llm.aclose()


@pytest.mark.parametrize("quirky", [Quirks(no_usage=True)], indirect=True)
async def test_tokens_are_estimated_and_marked_when_the_server_sends_none(
    quirky: FakeOpenAI, quirky_backend: OpenAIBackend
) -> None:
    agent, conv = await chat(quirky_backend)
    quirky.script(Reply("x" * 400))
    await turn_events(conv, "y" * 797)
    await conv.wait_idle()
    tokens = (await conv.get_messages())[-1].payload["tokens"]
    assert tokens == {"input": 200, "output": 100, "estimated": True}  # (797 + 3) / 4, 400 / 4
    await agent.close()


async def test_a_failed_turn_keeps_what_was_shown_in_the_audit_log_only(
    fake: FakeOpenAI, backend: OpenAIBackend
) -> None:
    agent, conv = await chat(backend)
    fake.script(Reply("one two three four", fail_after=3), Reply("Fine."))
    events = await turn_events(conv, "count")
    assert [e.type for e in events[-2:]] == ["Error", "End"]
    assert events[-2].message == "the model server closed the stream in the middle of the reply"
    await turn_events(conv, "again")
    records = [m.to_json() for m in await conv.get_messages()]
    assert [r["type"] for r in records] == ["user", "error", "user", "assistant"]
    assert records[1]["partialText"] == "one two"
    assert [m["content"] for m in fake.requests[1]["messages"]] == ["sys", "again"]
    await agent.close()


async def test_the_last_request_of_a_tool_loop_offers_no_tools(
    fake: FakeOpenAI, backend: OpenAIBackend
) -> None:
    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return "nothing"

    agent = ChatAgent(store=MemoryStore(), llm=backend, tools=ToolRegistry([lookup]),
                      max_tool_rounds=2)  # fmt: skip
    conv = await agent.create_conversation()
    fake.script(*[Reply(tool_calls=[("lookup", {"key": "k"})])] * 2, Reply("Nothing found."))
    events = await turn_events(conv, "find k")
    assert [e.type for e in events].count("ToolResult") == 2 and events[-1].type == "End"
    assert ["tools" in r for r in fake.requests] == [True, True, False]
    last = fake.requests[-1]["messages"]  # the calls and results stay in the history
    assert [m["role"] for m in last[-4:]] == ["assistant", "tool", "assistant", "tool"]
    text = "".join(e.text for e in events if e.type == "AppendText")
    assert text == "Nothing found."
    await agent.close()


async def test_after_an_interrupt_the_model_sees_its_partial_reply_and_a_note_it_does_not_echo(
    fake: FakeOpenAI, backend: OpenAIBackend
) -> None:
    """The partial reply goes back as it was, and the system prompt says replies were cut: a
    mark at the end of the reply (or before the next message), a small model repeated."""
    agent, conv = await chat(backend)
    fake.script(Reply("slow " * 200, delay=0.01), Reply("Fine."), Reply("Sure."))
    events = asyncio.ensure_future(collect_turn(conv))
    await asyncio.sleep(0)
    await conv.send([TextPart("talk")])
    while not fake.requests:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.15)  # a few words were streamed
    assert conv.interrupt()
    got = await events
    assert got[-2].type == "Interrupted"
    await turn_events(conv, "stop")
    sent = fake.requests[1]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    partial = "".join(e.text for e in got if e.type == "AppendText")
    assert partial and sent[2]["content"] == partial and sent[3]["content"] == "stop"
    assert sent[0]["content"] == f"sys\n\n{INTERRUPTED_NOTE}"
    await turn_events(conv, "and then?")  # the live conversation goes on: same system prompt
    assert fake.requests[2]["messages"][0] == sent[0]
    # the interrupted turn's counts: the server got its prompt and streamed some words
    interrupted = next(m for m in await conv.get_messages() if m.kind == "assistant").payload
    tokens = interrupted["tokens"]
    assert tokens["estimated"] is True and tokens["input"] > 0 and tokens["output"] > 0
    await agent.close()


async def test_a_context_length_refusal_does_not_brick_the_conversation(
    fake: FakeOpenAI, backend: OpenAIBackend
) -> None:
    agent, conv = await chat(backend)
    too_long = "the request exceeds the available context size, try increasing it"
    fake.script(Reply("A very long reply", finish="length"), Reply(too_long, status=400))
    await turn_events(conv, "write a lot")
    events = await turn_events(conv, "and more")
    assert events[-2].code == CONTEXT_LENGTH and "OPENAI_CONTEXT_WINDOW" in events[-2].message
    await turn_events(conv, "new topic")  # nothing of the failed turn is in the context
    assert [m["content"] for m in fake.requests[2]["messages"]] == [
        "sys", "write a lot", "A very long reply", "new topic"
    ]  # fmt: skip
    await agent.close()


def test_the_banner_never_shows_unknown_counts_as_zero() -> None:
    assert token_counts(TokenStats(0, 0, 0)) == "in=0, out=0, total=0"
    assert token_counts(TokenStats(3, 0, 0, uncounted=3)) == (
        "in=?, out=?, total=? (the model server gave no counts)"
    )
    assert token_counts(TokenStats(3, 100, 20, uncounted=1)) == (
        "in=100, out=20, total=120 (+ 1 of 3 turns not counted)"
    )


async def test_images_reach_a_model_that_takes_them(fake: FakeOpenAI) -> None:
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n fake pixels").decode()
    image = ImagePart("image/png", data=png)
    agent, conv = await chat(make_backend(fake.base_url, image_input=True))
    fake.script(Reply("A cat."), Reply(status=500), Reply("Still a cat."))
    await conv.send(
        [TextPart("What is this?"), image, ImagePart("image/jpeg", url="https://x/y.jpg")]
    )
    await conv.wait_idle()
    sent = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
        {"type": "image_url", "image_url": {"url": "https://x/y.jpg"}},
    ]
    assert fake.requests[0]["messages"][-1] == {"role": "user", "content": sent}
    await turn_events(conv, "fail")  # the next turn rebuilds the context from working memory
    await turn_events(conv, "and now?")
    assert fake.requests[2]["messages"][1] == {"role": "user", "content": sent}
    assert [m["content"] for m in fake.requests[2]["messages"][2:]] == ["A cat.", "and now?"]
    too_big = base64.b64encode(b"\0" * (MAX_IMAGE_BYTES + 3)).decode()
    with pytest.raises(InvalidInput, match="an image may be at most 4 MB"):
        await conv.send([ImagePart("image/png", data=too_big)])
    await agent.close()
    await agent.llm.aclose()

    agent, conv = await chat(make_backend(fake.base_url))  # OPENAI_IMAGE_INPUT unset
    with pytest.raises(InvalidInput, match="does not accept image input"):
        await conv.send([TextPart("What is this?"), image])
    assert await conv.get_messages() == []
    await agent.close()
    await agent.llm.aclose()


async def test_set_system_prompt_swaps_the_first_message_and_keeps_the_summaries():
    backend = OpenAIBackend(base_url="http://127.0.0.1:9/v1", api_key="k", model="m")
    history = [
        HistoryItem("summary", "They talked about tea."),
        HistoryItem("user", "hi"),
        HistoryItem("assistant", "hello"),
    ]
    conv = backend.create_conversation("Be brief.", history, [])
    rest = conv.messages[1:]
    assert conv.messages[0] == {
        "role": "system",
        "content": "Be brief.\n\nSummary of the earlier conversation:\nThey talked about tea.",
    }
    assert await conv.set_system_prompt("You are Arthur.\n\nBe brief.")
    assert conv.messages[0]["content"].startswith("You are Arthur.\n\nBe brief.\n\nSummary of")
    assert await conv.set_system_prompt("")  # only the summary is left
    assert conv.messages[0]["content"].startswith("Summary of the earlier conversation:")
    assert conv.messages[1:] == rest
    bare = backend.create_conversation("", [HistoryItem("user", "hi")], [])
    assert [m["role"] for m in bare.messages] == ["user"]
    assert await bare.set_system_prompt("New.")
    assert bare.messages == [
        {"role": "system", "content": "New."},
        {"role": "user", "content": "hi"},
    ]
    assert await bare.set_system_prompt("")
    assert bare.messages == [{"role": "user", "content": "hi"}]


def test_a_request_encoded_from_its_cached_messages_is_what_json_dumps_writes():
    """The messages of a chat are encoded once each (a long chat re-encodes only what is new);
    the bytes sent stay those of ``json.dumps`` as the chat grows, its system prompt changes
    and a compaction starts it over."""

    def dumped(request):
        return json.dumps(request, separators=(",", ":")).encode()

    cache = EncodedMessages()
    messages = [{"role": "system", "content": "Tu es «utile».\u2028"}]
    for turn in range(4):
        messages = [*messages, {"role": "user", "content": [{"type": "text", "text": f"q{turn}"}]}]
        request = {"model": "m", "messages": messages, "stream": True, "tools": [{"x": turn}]}
        assert encode_request(request, cache) == dumped(request)
        messages = [*messages, {"role": "assistant", "content": f"a{turn} 😀"}]
        if turn == 1:  # a new system prompt replaces the first message
            messages[0] = {"role": "system", "content": "another prompt"}
    messages = [{"role": "system", "content": "summary"}, messages[-1]]  # compacted
    request = {"model": "m", "messages": messages}
    assert encode_request(request, cache) == dumped(request)
