"""The OpenAI-compatible API (``/v1``) in-process over real loopback HTTP, driven by the ``openai``
SDK (and by raw HTTP where the bytes matter): completions whole and streamed, one stored
conversation for a client that resends its history, the conversation header, retries, edits,
refusals in OpenAI's error shape, failures, tool calls as reasoning, a client that leaves, and
the bookkeeping surviving a restart. ``tests/test_openai_api_e2e.py`` runs simonw/llm against
``agentik serve``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest

from agentik import hookimpl
from agentik.core.app import AGENT
from agentik.core.llm import LLMError, ReasoningDelta, ToolCallRequest
from agentik.core.testing import ScriptedLLM, make_app
from agentik.core.tools import tool

BUILTINS = ("agentik_transport_http", "agentik_transport_openai")
HEADER = "X-Agentik-Conversation-Id"
KEY = "openai-test-key-0123456789"


@tool
def add(a: int, b: int = 0) -> str:
    """Add two numbers."""
    return str(a + b)


class AddTool:
    @hookimpl
    def register_tools(self, register: Any) -> None:
        register(add)


class Served:
    def __init__(self, app: Any, client: Any, key: str = "unused") -> None:
        self.app, self.client = app, client
        self.agent = app[AGENT]
        self.sdk = openai.AsyncOpenAI(
            base_url=str(client.make_url("/v1")), api_key=key, max_retries=0
        )

    async def chat(self, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        return await self.sdk.chat.completions.create(model="agentik", messages=messages, **kwargs)

    async def stream(self, messages: list[dict[str, Any]], **kwargs: Any) -> tuple[str, Any]:
        """The streamed reply's text and its last chunk."""
        stream = await self.chat(messages, stream=True, **kwargs)
        text, last = [], None
        async for chunk in stream:
            if chunk.choices:
                text.append(chunk.choices[0].delta.content or "")
            last = chunk
        return "".join(text), last

    async def conversations(self) -> dict[str, list[Any]]:
        """Every conversation's audit records, by id."""
        out = {}
        for info in await self.agent.list_conversations(0, 100):
            conv = await self.agent.get_conversation(info.id)
            await conv.wait_idle()
            out[info.id] = await conv.get_messages(limit=1000)
        return out

    async def users(self) -> list[list[str]]:
        """The user texts of every conversation."""
        return [
            [r.payload["content"][0]["body"] for r in records if r.kind == "user"]
            for records in (await self.conversations()).values()
        ]


@pytest.fixture
async def serve(aiohttp_client: Any, tmp_path: Any) -> Any:
    made: list[Served] = []

    async def make(llm: ScriptedLLM | None = None, db: str = "a.db", **env: str) -> Served:
        env = {"AGENTIK_DB_PATH": str(tmp_path / db), **env}
        app = make_app(
            llm=llm or ScriptedLLM(), plugins=[("add", AddTool())], builtins=BUILTINS, env=env
        )
        made.append(Served(app, await aiohttp_client(app), env.get("AGENTIK_API_KEY", "unused")))
        return made[-1]

    yield make
    for served in made:  # a client left open is closed by the garbage collector in a later loop
        await served.sdk.close()


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


async def raw_stream(served: Served, body: dict[str, Any], **headers: str) -> list[str]:
    """The ``data:`` payloads of a streamed completion, as sent."""
    r = await served.client.post("/v1/chat/completions", json=body, headers=headers)
    assert r.status == 200, await r.text()
    assert r.headers["Content-Type"].startswith("text/event-stream")
    frames = (await r.text()).split("\n\n")
    assert frames[-1] == ""
    assert all(f.startswith("data: ") for f in frames[:-1]), frames
    return [f.removeprefix("data: ") for f in frames[:-1]]


async def test_the_agent_is_one_model(serve: Any) -> None:
    served = await serve(AGENTIK_OPENAI_MODEL_ID="my-agent")
    models = await served.sdk.models.list()
    assert [m.id for m in models.data] == ["my-agent"]
    assert (await served.sdk.models.retrieve("my-agent")).owned_by == "agentik"
    with pytest.raises(openai.NotFoundError) as e:
        await served.sdk.models.retrieve("gpt-4o")
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError) as e:  # a completion for another model
        await served.sdk.chat.completions.create(model="gpt-4o", messages=[user("hi")])
    assert e.value.code == "model_not_found"
    assert await served.conversations() == {}


async def test_a_completion_whole_and_streamed(serve: Any) -> None:
    served = await serve()
    raw = await served.sdk.chat.completions.with_raw_response.create(
        model="agentik",
        messages=[user("hello")],
        temperature=0.2,  # sampling settings are accepted and ignored
        top_p=0.5,
        max_tokens=10,
        seed=1,
        stop=["x"],
    )
    completion = raw.parse()
    cid = raw.headers[HEADER]
    assert completion.object == "chat.completion"
    assert completion.id.startswith("chatcmpl-msg-")
    assert completion.model == "agentik"
    choice = completion.choices[0]
    assert (choice.message.role, choice.message.content) == ("assistant", "echo: hello")
    assert choice.finish_reason == "stop"
    assert completion.usage.prompt_tokens == len("hello")  # ScriptedLLM counts characters
    assert completion.usage.completion_tokens == 2
    assert completion.usage.total_tokens == len("hello") + 2

    body = {
        "model": "agentik",
        "messages": [user("again")],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    data = await raw_stream(served, body)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1])
    assert text == "echo: again"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    # without include_usage there is no usage chunk; the SDK reads the stream
    text, last = await served.stream([user("third")])
    assert text == "echo: third"
    assert last.choices[0].finish_reason == "stop" and last.usage is None
    # a message without earlier ones starts a conversation each time
    assert len(await served.conversations()) == 3
    assert cid in await served.conversations()


async def test_resent_history_continues_one_conversation(serve: Any) -> None:
    """A client that sends the whole history each time (as chat front ends do) talks to one
    conversation; only each new message reaches the model, and the client's system message once
    per change, as message context."""
    llm = ScriptedLLM()
    served = await serve(llm)
    messages = [{"role": "system", "content": "Be brief."}, user("one")]
    first = await served.chat(messages)
    messages += [assistant(first.choices[0].message.content), user("two")]
    text, _ = await served.stream(messages)
    messages += [assistant(text), user("three")]
    third = await served.chat(messages)
    messages[0] = {"role": "system", "content": "Be very brief."}  # the client changed it
    messages += [assistant(third.choices[0].message.content), user("four")]
    await served.stream(messages)

    (records,) = (await served.conversations()).values()
    users = [r for r in records if r.kind == "user"]
    assert [u.payload["content"][0]["body"] for u in users] == ["one", "two", "three", "four"]
    contexts = [u.payload.get("context") for u in users]
    assert contexts == [
        {"origin": "system", "description": "Be brief."},
        None,
        None,
        {"origin": "system", "description": "Be very brief."},
    ]
    sent = [inputs[-1].text for inputs in llm.received]
    assert sent == ["[SYSTEM] Be brief.\none", "two", "three", "[SYSTEM] Be very brief.\nfour"]
    assert first.choices[0].message.content == "echo: [SYSTEM] Be brief.\none"


async def test_the_header_names_the_conversation(serve: Any) -> None:
    served = await serve()
    r = await served.client.post("/agentik/conversations", json={})
    cid = (await r.json())["id"]
    raw = await served.sdk.chat.completions.with_raw_response.create(
        model="agentik", messages=[user("via the header")], extra_headers={HEADER: cid}
    )
    assert raw.headers[HEADER] == cid
    reply = raw.parse().choices[0].message.content
    # a client that drops the header but keeps the history stays in it
    follow = await served.sdk.chat.completions.with_raw_response.create(
        model="agentik", messages=[user("via the header"), assistant(reply), user("no header")]
    )
    assert follow.headers[HEADER] == cid
    assert await served.users() == [["via the header", "no header"]]
    with pytest.raises(openai.NotFoundError) as e:
        await served.chat([user("x")], extra_headers={HEADER: "conv-nope"})
    assert e.value.code == "conversation_not_found"
    assert e.value.body["type"] == "invalid_request_error"


async def test_retries_edits_and_regenerations(serve: Any) -> None:
    served = await serve()
    a = (await served.chat([user("a")])).choices[0].message.content
    history = [user("a"), assistant(a), user("b")]
    b = (await served.chat(history)).choices[0].message.content
    assert b == "echo: b"
    # the same request again (a retry; or "regenerate" of the last reply, which the server
    # cannot tell apart) gets that turn's reply, whole or streamed, and runs nothing
    assert (await served.chat(history)).choices[0].message.content == b
    assert (await served.stream(history))[0] == b
    assert await served.users() == [["a", "b"]]
    # an edited earlier message: the history is not the agent's any more, a new conversation
    await served.chat([user("a, edited"), assistant(a), user("b")])
    # the earlier reply regenerated: the client's history ends before it, a new one too
    await served.chat([user("a")])
    assert sorted(await served.users()) == [["a"], ["a", "b"], ["b"]]
    # and the first conversation still goes on
    await served.chat([*history, assistant(b), user("c")])
    assert sorted(await served.users()) == [["a"], ["a", "b", "c"], ["b"]]


async def test_a_retry_of_a_running_turn_gets_its_whole_reply(serve: Any) -> None:
    served = await serve(ScriptedLLM(["slow ", "reply ", "in ", "parts"], delay=0.05))
    first = await served.chat([user("go")])
    history = [user("go"), assistant(first.choices[0].message.content), user("more")]
    stream = asyncio.ensure_future(served.stream(history))
    await asyncio.sleep(0.1)  # the first request's turn is running
    whole = await served.chat(history)
    assert whole.choices[0].message.content == (await stream)[0] == "echo: more"
    assert await served.users() == [["go", "more"]]


async def test_two_clients_with_the_same_history_get_two_conversations(serve: Any) -> None:
    served = await serve(ScriptedLLM(delay=0.02))
    reply = (await served.chat([user("start")])).choices[0].message.content
    history = [user("start"), assistant(reply)]
    one, two = await asyncio.gather(
        served.stream([*history, user("left")]), served.stream([*history, user("right")])
    )
    assert {one[0], two[0]} == {"echo: left", "echo: right"}
    users = sorted(await served.users())
    assert users in ([["right"], ["start", "left"]], [["left"], ["start", "right"]])


async def test_a_conversation_another_request_took_is_not_taken_again(serve: Any) -> None:
    """The race behind the test above, made certain: a request has taken the conversation and
    not yet recorded its send; another with the same history (the whole reply as its last
    message, which also begins that reply) must not join it."""
    from agentik_transport_openai import STATE
    from agentik_transport_openai.request import EMPTY, chain

    served = await serve()
    raw = await served.sdk.chat.completions.with_raw_response.create(
        model="agentik", messages=[user("start")]
    )
    history = [user("start"), assistant(raw.parse().choices[0].message.content)]
    prior = chain(EMPTY, [("user", "start"), ("assistant", history[1]["content"])])
    assert await served.agent.state[STATE].claim(prior)  # the first request, in flight
    second = await served.sdk.chat.completions.with_raw_response.create(
        model="agentik", messages=[*history, user("right")]
    )
    assert second.headers[HEADER] != raw.headers[HEADER]


@pytest.mark.parametrize(
    ("change", "status", "code", "param"),
    [
        ({"n": 2}, 400, "unsupported_value", "n"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, 400,
         "client_tools_unsupported", "tools"),
        ({"functions": [{"name": "f"}]}, 400, "client_tools_unsupported", "functions"),
        ({"tool_choice": "required"}, 400, "client_tools_unsupported", "tool_choice"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, 400, "audio_unsupported", "audio"),
        ({"modalities": ["text", "audio"]}, 400, "audio_unsupported", "modalities"),
        ({"messages": [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}]},
         400, "audio_unsupported", "messages[0].content[0]"),
        ({"messages": [user("hi"), {"role": "tool", "tool_call_id": "c", "content": "5"}]}, 400,
         "client_tools_unsupported", "messages[1]"),
        ({"messages": [user("hi"), {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            user("and")]}, 400, "client_tools_unsupported", "messages[1]"),
        ({"messages": [user("hi"), assistant("hello")]}, 400, "invalid_value",
         "messages[1].role"),
        ({"messages": []}, 400, "invalid_value", "messages"),
        ({"messages": [user("   ")]}, 400, "invalid_value", "messages[0].content"),
        ({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]},
         400, "invalid_value", "messages"),  # this model takes no images
        ({"model": None}, 400, "missing_required_parameter", "model"),
        ({"stream": "yes"}, 400, "invalid_type", "stream"),
    ],
)  # fmt: skip
async def test_refusals_in_openai_error_shape(
    serve: Any, change: dict[str, Any], status: int, code: str, param: str
) -> None:
    served = await serve()
    body = {"model": "agentik", "messages": [user("hi")], **change}
    r = await served.client.post("/v1/chat/completions", json=body)
    assert r.status == status
    error = (await r.json())["error"]
    assert (error["code"], error["param"], error["type"]) == (code, param, "invalid_request_error")
    assert error["message"]
    assert await served.conversations() == {}  # nothing was stored


async def test_bodies_that_are_not_requests(serve: Any) -> None:
    served = await serve()
    r = await served.client.post(
        "/v1/chat/completions", data=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert r.status == 400 and (await r.json())["error"]["code"] == "invalid_json"
    r = await served.client.post("/v1/chat/completions", json=[1])
    assert r.status == 400 and (await r.json())["error"]["type"] == "invalid_request_error"
    r = await served.client.post(
        "/v1/chat/completions", data=b"hi", headers={"Content-Type": "text/plain"}
    )
    assert r.status == 415 and (await r.json())["error"]["code"] == "unsupported_media_type"
    with pytest.raises(openai.BadRequestError) as e:  # the SDK reads the shape
        await served.chat([user("x")], n=3)
    assert e.value.code == "unsupported_value" and e.value.param == "n"


async def test_images_reach_a_model_that_takes_them(serve: Any) -> None:
    llm = ScriptedLLM()
    llm.capabilities = {"image_input": True}
    served = await serve(llm)
    pixel = "data:image/png;base64,iVBORw0KGgo="
    content = [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": pixel}},
    ]
    await served.chat([{"role": "user", "content": content}])
    (records,) = (await served.conversations()).values()
    assert records[0].payload["content"] == [
        {"type": "text", "body": "what is this?"},
        {"type": "image", "mimeType": "image/png", "data": "iVBORw0KGgo="},
    ]
    assert llm.received[0][0].images[0].data == "iVBORw0KGgo="


async def test_a_failed_turn_and_its_retry(serve: Any) -> None:
    served = await serve(
        ScriptedLLM(
            ["reply one"], LLMError("the model is down", "unavailable"), LLMError("still down", "x")
        )
    )
    raw = await served.sdk.chat.completions.with_raw_response.create(
        model="agentik", messages=[user("first")]
    )
    cid = raw.headers[HEADER]
    history = [user("first"), assistant("reply one"), user("hi")]
    # streamed: the error comes in the stream, as OpenAI's do, and the SDK raises it
    with pytest.raises(openai.APIError, match="the model is down"):
        await served.stream(history)
    # the same request again runs again (a failure is no reply to give back), in the same
    # conversation; whole, the failure is a 502 in OpenAI's shape
    with pytest.raises(openai.APIStatusError) as e:
        await served.chat(history)
    assert e.value.status_code == 502 and e.value.code == "x"
    assert e.value.message.endswith("still down")
    assert e.value.response.headers[HEADER] == cid
    # a client that keeps its failed message in the history is in step too
    again = await served.sdk.chat.completions.with_raw_response.create(
        model="agentik", messages=[*history, user("hi again")]
    )
    assert again.headers[HEADER] == cid
    assert again.parse().choices[0].message.content == "echo: hi again"
    kinds = [r.kind for r in (await served.conversations())[cid]]
    assert kinds == ["user", "assistant", "user", "error", "user", "error", "user", "assistant"]


async def test_tool_calls_stream_as_reasoning_only_when_asked(serve: Any) -> None:
    steps = [
        [ReasoningDelta("thinking"), ToolCallRequest("c1", "add", '{"a": 2, "b": 3}')],
        ["five"],
    ]
    quiet = await serve(ScriptedLLM(*steps), db="quiet.db")
    chunks = await raw_stream(quiet, {"model": "agentik", "messages": [user("2+3")],
                                      "stream": True})  # fmt: skip
    deltas = [json.loads(c)["choices"][0]["delta"] for c in chunks[:-1] if json.loads(c)["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "thinking"
    assert "".join(d.get("content", "") for d in deltas) == "five"

    shown = await serve(ScriptedLLM(*steps, *steps), db="shown.db", AGENTIK_OPENAI_SHOW_TOOLS="1")
    chunks = await raw_stream(shown, {"model": "agentik", "messages": [user("2+3")],
                                      "stream": True})  # fmt: skip
    deltas = [json.loads(c)["choices"][0]["delta"] for c in chunks[:-1] if json.loads(c)["choices"]]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    assert reasoning == 'thinking\n[tool call] add {"a": 2, "b": 3}\n[tool result] 5\n'
    assert "".join(d.get("content", "") for d in deltas) == "five"
    whole = await shown.chat([user("2+3"), assistant("five"), user("again")])
    message = whole.choices[0].message
    assert message.content == "five"
    assert message.model_extra["reasoning_content"].startswith("thinking\n[tool call] add")
    assert len(await shown.conversations()) == 1  # tool calls are not in the client's history


async def leave_mid_reply(served: Served, text: str) -> tuple[str, str]:
    """Start a streamed turn and go away once some of its reply came: (conversation id, the
    reply so far as the client has it)."""
    body = {"model": "agentik", "messages": [user(text)], "stream": True}
    r = await served.client.post("/v1/chat/completions", json=body)
    partial = ""
    while not partial:
        line = (await r.content.readline()).decode()
        if line.startswith("data: "):
            partial = json.loads(line[6:])["choices"][0]["delta"].get("content", "")
    r.close()  # the client goes away mid-reply (a stop button)
    return r.headers[HEADER], partial


async def test_a_client_that_leaves_does_not_stop_the_turn(serve: Any) -> None:
    words = [f"w{i} " for i in range(30)]
    served = await serve(ScriptedLLM(words, words, delay=0.02))
    cid, partial = await leave_mid_reply(served, "long")
    assert len(partial) < len("".join(words))
    conv = await served.agent.get_conversation(cid)
    await asyncio.wait_for(conv.wait_idle(), 10)
    records = await conv.get_messages()
    assert records[-1].kind == "assistant" and "interrupted" not in records[-1].payload
    assert records[-1].payload["text"] == "".join(words)
    await served.agent.jobs.wait_idle()  # the conversation was settled without the client
    follow = await served.sdk.chat.completions.with_raw_response.create(
        model="agentik", messages=[user("long"), assistant("".join(words)), user("next")]
    )
    assert follow.headers[HEADER] == cid


async def test_a_client_that_stopped_reading_goes_on_with_what_it_has(serve: Any) -> None:
    """A front end's stop button keeps the start of the reply; its next message continues the
    conversation (the agent's history has the whole reply: the turn ran on)."""
    words = [f"w{i} " for i in range(30)]
    served = await serve(ScriptedLLM(words, delay=0.02))
    cid, partial = await leave_mid_reply(served, "long")
    # a last message that is not the start of the reply is another history: a new conversation
    # (asked at once, while the turn still runs: the request waits for its end to compare)
    other = await served.sdk.chat.completions.with_raw_response.create(
        model="agentik", messages=[user("long"), assistant("w0 w2"), user("other")]
    )
    assert other.headers[HEADER] != cid
    follow = await served.sdk.chat.completions.with_raw_response.create(
        model="agentik", messages=[user("long"), assistant(partial), user("next")]
    )
    assert follow.headers[HEADER] == cid
    assert follow.parse().choices[0].message.content == "echo: next"
    assert sorted(await served.users()) == [["long", "next"], ["other"]]


async def test_what_continues_a_conversation_survives_a_restart(serve: Any, tmp_path: Any) -> None:
    from agentik_transport_openai import STATE

    first = await serve(db="r.db")
    reply = (await first.chat([user("before")])).choices[0].message.content
    history = [user("before"), assistant(reply)]
    threads = first.agent.state[STATE]
    request = {"model": "agentik", "messages": [*history, user("x")]}
    from agentik_transport_openai.request import parse

    # a request took the conversation; the server stopped before it sent anything
    assert await threads.claim(parse(json.dumps(request).encode(), "agentik").prior_digest)
    await first.client.close()
    second = await serve(db="r.db")
    await second.agent.jobs.wait_idle()  # start-up settles what the stop left taken
    await second.chat([*history, user("after")])
    assert await second.users() == [["before", "after"]]


async def test_the_key_guards_the_api(serve: Any) -> None:
    served = await serve(AGENTIK_API_KEY=KEY)
    assert (await served.chat([user("hi")])).choices[0].message.content == "echo: hi"
    async with openai.AsyncOpenAI(
        base_url=str(served.client.make_url("/v1")), api_key="wrong-key", max_retries=0
    ) as anonymous:
        with pytest.raises(openai.AuthenticationError):
            await anonymous.models.list()
        with pytest.raises(openai.AuthenticationError):
            await anonymous.chat.completions.create(model="agentik", messages=[user("x")])


def test_a_model_id_with_spaces_stops_start_up() -> None:
    from agentik.core.settings import SettingsError

    with pytest.raises(SettingsError, match="AGENTIK_OPENAI_MODEL_ID='my agent' is invalid"):
        make_app(builtins=BUILTINS, env={"AGENTIK_OPENAI_MODEL_ID": "my agent"})
