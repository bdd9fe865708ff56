"""The ``litert`` backend on the real LiteRT-LM engine and the committed tiny model.

``tests/models/tiny.litertlm`` is built by ``tools/build_tiny_litertlm.py``: whatever it is
asked, it answers exactly :data:`REPLY` (greedy decoding), so the assertions are exact; a
user message with :data:`TRIGGER` makes it call ``echo({"text": "hi"})`` instead, until a tool
response is in its context. Its context is only 128 tokens: keep system prompts short.

Without ``litert_lm`` the module is skipped, visibly, except under ``CI=true`` where it fails.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

try:
    import litert_lm
except ImportError as e:  # never a silent skip: CI must have it
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        raise RuntimeError(f"litert-lm-api is required under CI: {e}") from e
    pytest.skip(
        f"litert_lm is not installed ({e}); pip install 'agentik-runtime[litert]'",
        allow_module_level=True,
    )

import agentik_llm_litert as plugin
from agentik.core.app import AGENT, create_app, load_settings
from agentik.core.llm import (
    HistoryItem,
    LLMError,
    TextDelta,
    ToolCallRequest,
    ToolResultInput,
    Usage,
    UserInput,
)
from agentik.core.settings import Settings, SettingsError
from agentik.core.testing import test_plugins
from agentik.core.tools import ToolSpec, tool
from agentik.core.types import ImagePart
from agentik.hookspecs import hookimpl
from agentik_llm_litert.backend import (
    LiteRtBackend,
    check_model,
    history_messages,
    input_message,
    message_chunks,
)
from tests.conftest import read_sse

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "tests" / "models" / "tiny.litertlm"
REPLY = "Hello from the tiny model."
#: With this word in a user message the model calls ``echo(text="hi")`` (qwen3 format), and
#: answers REPLY once the tool's result is in its context.
TRIGGER = "/tool"
ECHO = ToolSpec(
    "echo", "Echo text.", {"type": "object", "properties": {"text": {"type": "string"}}}
)

litert_lm.set_min_log_severity(litert_lm.LogSeverity.ERROR)


def text_of(chunks) -> str:
    return "".join(c.text for c in chunks if isinstance(c, TextDelta))


@pytest.fixture
async def backend(tmp_path):
    b = plugin.make_backend(
        Settings(
            plugin.SETTINGS,
            {
                "AGENTIK_GOOGLE_MODEL_PATH": str(MODEL),
                "AGENTIK_GOOGLE_THREADS": "1",
                "AGENTIK_GOOGLE_CACHE_DIR": str(tmp_path / "cache"),
            },
        )
    )
    await b.start()
    yield b
    await b.aclose()


# --- the committed model ----------------------------------------------------------------


def test_the_committed_model_is_small_and_is_an_llm():
    assert MODEL.stat().st_size < 1_000_000
    facts = check_model(MODEL)
    assert facts.context_tokens == 128
    assert facts.capabilities["text_input"] is True
    assert facts.capabilities["image_input"] is False


# --- settings and the model check --------------------------------------------------------


def test_registered_as_litert_with_the_google_alias():
    from agentik.core.registry import BackendRegistry

    reg = BackendRegistry("llm")
    plugin.register_llm_backends(reg.register_for("agentik_llm_litert"))
    assert reg.get("google", variable="AGENTIK_LLM_BACKEND").name == "litert"
    backend = reg.get("litert", variable="AGENTIK_LLM_BACKEND")
    assert backend.requires == ("litert_lm",) and backend.extra == "litert"


def test_without_a_model_path_the_cached_default_is_used(tmp_path):
    # conftest sets HF_HUB_OFFLINE: an empty cache is one line (tests/test_models.py: the rest)
    with pytest.raises(SettingsError, match="HF_HUB_OFFLINE is set and litert-community/Qwen3"):
        plugin.make_backend(Settings(plugin.SETTINGS, {"AGENTIK_MODELS_DIR": str(tmp_path)}))


def test_threads_default_to_4():
    assert Settings(plugin.SETTINGS, {})["AGENTIK_GOOGLE_THREADS"] == 4


def test_bad_models_say_what_is_wrong(tmp_path):
    cases = {
        tmp_path / "missing.litertlm": "no such file",
        tmp_path: "is a directory",
    }
    text = tmp_path / "notes.litertlm"
    text.write_text("hello")
    cases[text] = "not a LiteRT-LM model"
    cut = tmp_path / "cut.litertlm"
    cut.write_bytes(MODEL.read_bytes()[:64])
    cases[cut] = "not a valid LiteRT-LM model"
    for path, why in cases.items():
        with pytest.raises(SettingsError) as err:
            check_model(path)
        assert f"AGENTIK_GOOGLE_MODEL_PATH={str(path)!r}: {why}" in str(err.value), err.value


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file: cannot make one unreadable")
def test_an_unreadable_model_says_so(tmp_path):
    path = tmp_path / "locked.litertlm"
    shutil.copy(MODEL, path)
    path.chmod(0)
    with pytest.raises(SettingsError, match="cannot be read"):
        check_model(path)


# --- conversions -------------------------------------------------------------------------


def test_working_memory_becomes_litert_messages():
    history = [
        HistoryItem("user", "weather?"),
        HistoryItem("assistant", "let me look"),
        HistoryItem(
            "tool_call", call_id="c1", tool_name="get_weather", args_json='{"city": "Oslo"}'
        ),
        HistoryItem("tool_result", "sunny", call_id="c1", tool_name="get_weather"),
        HistoryItem("summary", "earlier talk"),
    ]
    assert history_messages(history) == [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "let me look",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Oslo"}},
                }
            ],
        },
        {
            "role": "tool",
            "content": [{"type": "tool_response", "name": "get_weather", "response": "sunny"}],
        },
        {"role": "user", "content": "Summary of the earlier conversation:\nearlier talk"},
    ]


def test_tool_results_go_back_as_one_tool_message():
    msg = input_message([ToolResultInput("c1", "a", "1"), ToolResultInput("c2", "b", "2")])
    assert msg == {
        "role": "tool",
        "content": [
            {"type": "tool_response", "name": "a", "response": "1"},
            {"type": "tool_response", "name": "b", "response": "2"},
        ],
    }
    assert input_message([UserInput("hi")]) == {"role": "user", "content": "hi"}


def test_images_go_to_a_vision_model_as_image_parts():
    """The image input of litert_lm's messages (``{"type": "image", "blob": base64}``); no
    vision model is at hand here, so the engine's use of it is not run."""
    png = ImagePart("image/png", data="iVBORw0KGgo=")
    image_part = {"type": "image", "blob": "iVBORw0KGgo="}
    assert input_message([UserInput("what is it?", (png,))]) == {
        "role": "user",
        "content": [image_part, {"type": "text", "text": "what is it?"}],
    }
    item = HistoryItem("user", "what is it?", extra={"images": [png.to_json()]})
    assert history_messages([item])[0]["content"][0] == image_part
    with pytest.raises(LLMError, match="as data, not as a URL"):
        input_message([UserInput("?", (ImagePart("image/png", url="https://x/y.png"),))])


def test_streamed_messages_become_chunks():
    msg = litert_lm.Message.from_json(
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "ok"}],
            "tool_calls": [
                {"id": "c9", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
            ],
        }
    )
    assert message_chunks(msg) == [TextDelta("ok"), ToolCallRequest("c9", "f", '{"x": 1}')]


# --- the backend on the real engine -------------------------------------------------------


async def test_streams_the_reply_with_token_counts(backend):
    assert backend.context_window == 128
    conv = backend.create_conversation("You are tiny.", [], [])
    chunks = [c async for c in conv.stream([UserInput("hi")])]
    assert text_of(chunks) == REPLY
    assert len([c for c in chunks if isinstance(c, TextDelta)]) > 1  # streamed, not one block
    usage = chunks[-1]
    # 8 reply tokens, then the end of the turn (<|im_end|> and the newline after it)
    assert isinstance(usage, Usage) and usage.output_tokens == 10
    assert usage.input_tokens + usage.output_tokens == conv.token_count()
    await conv.aclose()


async def test_later_turns_reuse_the_same_litert_conversation(backend):
    conv = backend.create_conversation("", [], [])
    first = [c async for c in conv.stream([UserInput("one")])]
    native, after_first = conv.native, conv.token_count()
    second = [c async for c in conv.stream([UserInput("two")])]
    assert text_of(second) == text_of(first) == REPLY
    assert conv.native is native  # the KV cache was kept
    assert conv.token_count() > after_first
    assert second[-1].input_tokens > after_first
    await conv.aclose()


async def test_a_conversation_is_rebuilt_from_working_memory(backend):
    fresh = backend.create_conversation("sys", [], [])
    [c async for c in fresh.stream([UserInput("hi")])]
    history = [HistoryItem("user", "hi"), HistoryItem("assistant", REPLY)]
    rebuilt = backend.create_conversation("sys", history, [])
    chunks = [c async for c in rebuilt.stream([UserInput("hi")])]
    assert text_of(chunks) == REPLY
    assert chunks[-1].input_tokens > fresh.token_count()  # the history is in its context
    await fresh.aclose()
    await rebuilt.aclose()


async def test_one_shot_completion(backend):
    assert await backend.complete("summarise", system_prompt="be short") == REPLY
    assert not backend.live  # its conversation was closed
    # a background feature's call: capped, and counted by the engine
    answer = await backend.one_shot("summarise", max_tokens=2)
    assert answer.text and REPLY.startswith(answer.text) and answer.text != REPLY
    assert answer.usage is not None and 0 < answer.usage.output_tokens <= 3


async def test_an_interrupted_conversation_is_unusable_and_the_next_one_works(backend):
    conv = backend.create_conversation("", [], [])

    async def consume():
        async for _ in conv.stream([UserInput("hi")]):
            await asyncio.sleep(10)  # stuck after the first chunk: the interrupt comes here

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(LLMError, match="unusable"):
        [c async for c in conv.stream([UserInput("again")])]
    await conv.aclose()
    again = backend.create_conversation("", [], [])
    assert text_of([c async for c in again.stream([UserInput("again")])]) == REPLY
    await again.aclose()


async def test_conversations_share_the_engine(backend):
    convs = [backend.create_conversation("", [], []) for _ in range(3)]

    async def turn(c):
        return text_of([x async for x in c.stream([UserInput("hi")])])

    assert await asyncio.gather(*(turn(c) for c in convs)) == [REPLY] * 3
    for c in convs:
        await c.aclose()


async def test_a_tool_call_in_manual_mode_and_its_result_fed_back(backend):
    assert backend.capabilities["function_calling"] is True
    conv = backend.create_conversation("", [], [ECHO])
    step = [c async for c in conv.stream([UserInput(f"{TRIGGER} please")])]
    calls = [c for c in step if isinstance(c, ToolCallRequest)]
    assert [(c.name, c.args_json) for c in calls] == [("echo", '{"text": "hi"}')]
    assert text_of(step) == ""
    # <tool_call>, its JSON, </tool_call>, then the end of the turn (<|im_end|>, newline)
    assert step[-1].output_tokens == 5
    native = conv.native
    after = [c async for c in conv.stream([ToolResultInput(calls[0].call_id, "echo", "HI")])]
    assert text_of(after) == REPLY and conv.native is native
    await conv.aclose()


async def test_a_rebuild_from_memory_with_a_tool_round(backend):
    history = [
        HistoryItem("user", f"{TRIGGER} please"),
        HistoryItem("tool_call", call_id="c1", tool_name="echo", args_json='{"text": "hi"}'),
        HistoryItem("tool_result", "HI", call_id="c1", tool_name="echo"),
        HistoryItem("assistant", REPLY),
    ]
    conv = backend.create_conversation("sys", history, [ECHO])
    # the tool response in its context: the text reply, not another call
    assert text_of([c async for c in conv.stream([UserInput(f"{TRIGGER} again")])]) == REPLY
    await conv.aclose()


async def test_a_rebuild_that_ends_in_tool_results_answers_them(backend):
    """Compacted in the middle of a tool loop: the rebuilt conversation's memory ends with this
    step's tool results, and the engine asks for the next step with no new input."""
    history = [
        HistoryItem("user", f"{TRIGGER} please"),
        HistoryItem("tool_call", call_id="c1", tool_name="echo", args_json='{"text": "hi"}'),
        HistoryItem("tool_result", "HI", call_id="c1", tool_name="echo"),
    ]
    conv = backend.create_conversation("sys", history, [ECHO])
    assert text_of([c async for c in conv.stream([])]) == REPLY
    # and it goes on as usual; with nothing pending, an empty step is refused clearly
    assert text_of([c async for c in conv.stream([UserInput("hi")])]) == REPLY
    with pytest.raises(LLMError, match="nothing to send"):
        [c async for c in conv.stream([])]
    await conv.aclose()


async def test_shutdown_closes_live_conversations_before_the_engine(tmp_path):
    b = LiteRtBackend(check_model(MODEL), threads=1, cache_dir=tmp_path)
    await b.start()
    convs = [b.create_conversation("", [], []) for _ in range(2)]
    for c in convs:
        [x async for x in c.stream([UserInput("hi")])]
    assert len(b.live) == 2
    await b.aclose()
    assert not b.live and b.engine is None
    assert all(c.native is None for c in convs)


# --- through the server -------------------------------------------------------------------


class EchoTool:
    """An in-agent tool plugin: ``echo`` returns its text upper-cased."""

    calls: list[str] = []
    slow = False  # True: the tool hangs (until the turn is interrupted)

    @hookimpl
    def register_tools(self, register, settings):
        async def echo(text: str) -> str:
            EchoTool.calls.append(text)
            if EchoTool.slow:
                await asyncio.sleep(60)
            return text.upper()

        register(tool(echo, name="echo", description="Echo text."))


def litert_app(tmp_path, **env):
    pm = test_plugins([("agentik_llm_litert", plugin), ("echo_tool", EchoTool())])
    settings = load_settings(
        pm,
        {
            "AGENTIK_DB_PATH": str(tmp_path / "a.db"),
            "AGENTIK_LLM_BACKEND": "litert",
            "AGENTIK_GOOGLE_MODEL_PATH": str(MODEL),
            "AGENTIK_GOOGLE_THREADS": "1",
            "AGENTIK_GOOGLE_CACHE_DIR": str(tmp_path / "cache"),
            "AGENTIK_SYSTEM_PROMPT": "Be brief.",  # the tiny model's context is 128 tokens
            "AGENTIK_MEMORY_BACKEND": "off",
            **env,
        },
    )
    return create_app(settings, pm)


async def test_turns_over_sse_reuse_the_conversation(aiohttp_client, tmp_path):
    client = await aiohttp_client(litert_app(tmp_path))
    r = await client.post("/agentik/conversations")
    cid = (await r.json())["id"]
    for n, body in enumerate(("hello", "again"), 1):
        events = await client.get(f"/agentik/conversations/{cid}/events")
        r = await client.post(
            f"/agentik/conversations/{cid}/messages", json=[{"type": "text", "body": body}]
        )
        assert r.status == 202
        frames = await read_sse(events)
        events.close()
        kinds = [f["event"] for f in frames]
        assert kinds[:2] == ["UserMessage", "StartResponse"] and kinds[-1] == "End", kinds
        text = "".join(f["data"]["text"] for f in frames if f["event"] == "AppendText")
        assert text == REPLY
        for _ in range(200):
            if not (await (await client.get(f"/agentik/conversations/{cid}")).json())["busy"]:
                break
            await asyncio.sleep(0.01)
        conv = await client.app[AGENT].get_conversation(cid)
        assert conv.llm_builds == 1, f"turn {n} rebuilt the LiteRT-LM conversation"
    items = (await (await client.get(f"/agentik/conversations/{cid}/messages")).json())["items"]
    assert [m["type"] for m in items] == ["user", "assistant"] * 2
    assert items[1]["tokens"]["output"] == 10 and items[1]["tokens"]["input"] > 0


async def test_a_tool_call_goes_through_the_agent_tool_loop(aiohttp_client, tmp_path):
    EchoTool.calls.clear()
    client = await aiohttp_client(litert_app(tmp_path))
    cid = (await (await client.post("/agentik/conversations")).json())["id"]
    events = await client.get(f"/agentik/conversations/{cid}/events")
    body = [{"type": "text", "body": f"{TRIGGER} please"}]
    assert (await client.post(f"/agentik/conversations/{cid}/messages", json=body)).status == 202
    frames = (await read_sse(events))[1:]  # after the UserMessage
    events.close()
    kinds = [f["event"] for f in frames]
    assert kinds[:2] == ["ToolCall", "ToolResult"] and kinds[-1] == "End", kinds
    assert frames[0]["data"]["callId"] == frames[1]["data"]["callId"]
    assert EchoTool.calls == ["hi"]
    text = "".join(f["data"]["text"] for f in frames if f["event"] == "AppendText")
    assert text == REPLY
    for _ in range(200):
        if not (await (await client.get(f"/agentik/conversations/{cid}")).json())["busy"]:
            break
        await asyncio.sleep(0.01)
    items = (await (await client.get(f"/agentik/conversations/{cid}/messages")).json())["items"]
    assert [m["type"] for m in items] == ["user", "tool_call", "tool_result", "assistant"]
    assert (await client.app[AGENT].get_conversation(cid)).llm_builds == 1


async def test_an_interrupt_then_a_working_turn_rebuilt_from_memory(aiohttp_client, tmp_path):
    EchoTool.calls.clear()
    EchoTool.slow = True
    try:
        client = await aiohttp_client(litert_app(tmp_path))
        cid = (await (await client.post("/agentik/conversations")).json())["id"]
        events = await client.get(f"/agentik/conversations/{cid}/events")
        body = [{"type": "text", "body": f"{TRIGGER} please"}]
        await client.post(f"/agentik/conversations/{cid}/messages", json=body)
        frames = await read_sse(events, until="ToolCall")
        r = await client.post(f"/agentik/conversations/{cid}/interrupt")
        assert (await r.json()) == {"interrupted": True}
        frames = await read_sse(events)
        assert [f["event"] for f in frames[-2:]] == ["Interrupted", "End"]
        last = frames[-1]["id"]
        events.close()
    finally:
        EchoTool.slow = False
    conv = await client.app[AGENT].get_conversation(cid)
    for _ in range(200):
        if not conv.busy:
            break
        await asyncio.sleep(0.01)
    events = await client.get(f"/agentik/conversations/{cid}/events?after={last}")
    body = [{"type": "text", "body": "and now?"}]
    await client.post(f"/agentik/conversations/{cid}/messages", json=body)
    frames = await read_sse(events)
    events.close()
    text = "".join(f["data"]["text"] for f in frames if f["event"] == "AppendText")
    assert text == REPLY, frames
    assert conv.llm_builds == 2  # the interrupted one was dropped and rebuilt from memory


async def test_the_server_refuses_a_bad_model_at_start_up(tmp_path):
    from agentik.core.app import StartupError

    with pytest.raises(StartupError, match="no such file"):
        litert_app(tmp_path, AGENTIK_GOOGLE_MODEL_PATH=str(tmp_path / "nope.litertlm"))


# --- the real `agentik serve` process -----------------------------------------------------


def serve_env(tmp_path, **extra: str) -> dict[str, str]:
    return {
        "AGENTIK_LLM_BACKEND": "litert",
        "AGENTIK_GOOGLE_MODEL_PATH": str(MODEL),
        "AGENTIK_GOOGLE_THREADS": "1",
        "AGENTIK_GOOGLE_CACHE_DIR": str(tmp_path / "cache"),
        **extra,
    }


async def test_serve_streams_restarts_from_memory_and_exits_cleanly(serve, tmp_path):
    import aiohttp

    from tests.test_serve import history, new_conversation, post_message

    async def turn(s, base, cid, text):
        events = await s.get(f"{base}/agentik/conversations/{cid}/events")
        await post_message(s, base, cid, [{"type": "text", "body": text}])
        frames = await read_sse(events)
        events.close()
        return "".join(f["data"]["text"] for f in frames if f["event"] == "AppendText")

    proc, base = serve(serve_env(tmp_path))
    proc.wait_output("llm capabilities:")
    async with aiohttp.ClientSession() as s:
        cid = await new_conversation(s, base)
        assert await turn(s, base, cid, "hello") == REPLY
        idle = await new_conversation(s, base)  # a live conversation at shutdown
        assert await turn(s, base, idle, "hi") == REPLY
    assert "llm capabilities: input text, function_calling, context 128" in proc.output
    assert proc.stop() == 0, proc.output  # conversations closed before the engine: no abort

    proc, base = serve(serve_env(tmp_path))  # a restart: rebuilt from working memory
    async with aiohttp.ClientSession() as s:
        assert await turn(s, base, cid, "again") == REPLY
        items = await history(s, base, cid)
        assert [m["type"] for m in items] == ["user", "assistant"] * 2
        # the rebuilt conversation held the first turn: more input than the first turn had
        assert items[3]["tokens"]["input"] > items[1]["tokens"]["input"] + 10
    assert proc.stop() == 0, proc.output


@pytest.mark.parametrize(
    ("model", "why"),
    [
        ("missing", "no such file"),
        ("dir", "is a directory"),
        ("text", "not a LiteRT-LM model"),
        ("cut", "not a valid LiteRT-LM model"),
        ("zeroed", "LiteRT-LM could not load the model"),  # a good header, broken weights
    ],
)
def test_serve_refuses_a_bad_model_with_one_line(serve, tmp_path, model, why):
    path = tmp_path / "bad.litertlm"
    data = MODEL.read_bytes()
    if model == "missing":
        pass
    elif model == "dir":
        path = tmp_path
    elif model == "text":
        path.write_text("not a model")
    elif model == "cut":
        path.write_bytes(data[:64])
    else:
        path.write_bytes(data[: len(data) - 200_000] + bytes(199_000) + data[-1000:])
    proc, _ = serve(serve_env(tmp_path, AGENTIK_GOOGLE_MODEL_PATH=str(path)), wait=False)
    assert proc.proc.wait(60) != 0
    assert f"AGENTIK_GOOGLE_MODEL_PATH={str(path)!r}: {why}" in proc.output, proc.output


async def test_the_context_window_setting(tmp_path):
    def make(window: str) -> LiteRtBackend:
        env = {"AGENTIK_GOOGLE_MODEL_PATH": str(MODEL), "AGENTIK_GOOGLE_CONTEXT_WINDOW": window}
        env["AGENTIK_GOOGLE_CACHE_DIR"] = str(tmp_path)
        return plugin.make_backend(Settings(plugin.SETTINGS, env))

    assert make("1000").context_window == 128  # the tiny model's context is fixed
    small = make("64")
    assert small.context_window == 64
    await small.start()
    try:
        conv = small.create_conversation("", [], [])
        assert text_of([c async for c in conv.stream([UserInput("hi")])]) == REPLY
        await conv.aclose()
    finally:
        await small.aclose()
