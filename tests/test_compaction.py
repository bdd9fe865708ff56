"""Context compaction (F10): the core's atomic operation and the compaction plugin's policy,
in process with a scripted backend (the long and end-to-end runs are in
test_compaction_e2e.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import pytest

import agentik_compaction
from agentik import hookimpl
from agentik.core.app import AGENT
from agentik.core.cli import banner
from agentik.core.context import compaction_cut, context_tokens, estimate_tokens
from agentik.core.llm import (
    CONTEXT_LENGTH,
    SILENT_REFUSAL,
    HistoryItem,
    LLMError,
    LLMInput,
    ToolCallRequest,
    ToolResultInput,
    Usage,
    UserInput,
)
from agentik.core.store import MemoryRow
from agentik.core.testing import ScriptedLLM, make_app
from agentik.core.tools import tool
from agentik.core.types import TextPart
from tests.conftest import collect_turn

PLUGIN = ("agentik_compaction", agentik_compaction)
PADDING = "x" * 300  # each turn is ~170 tokens: a 1,600-token window compacts every few turns


class WindowLLM(ScriptedLLM):
    """A scripted backend with a context window; it reports no token usage, so the turn
    engine's chars/4 estimate is what compaction sees. ``summaries`` script ``complete``."""

    def __init__(self, *steps: Any, window: int | None = 1600, summaries: Sequence[Any] = ()):
        super().__init__(*steps)
        self.context_window = window
        self.summaries = list(summaries)
        self.summary_prompts: list[str] = []

    def default(self, inputs: Sequence[LLMInput]) -> Any:
        last = inputs[-1] if inputs else UserInput("")
        return [f"echo: {last.text if isinstance(last, UserInput | ToolResultInput) else ''}"]

    async def complete(self, prompt: str, *, system_prompt: str | None = None) -> str:
        self.summary_prompts.append(prompt)
        answer = self.summaries.pop(0) if self.summaries else None
        if isinstance(answer, BaseException):
            raise answer
        if callable(answer):
            return str(await answer())
        return answer or f"Goal: chat. Summary number {len(self.summary_prompts)}."


async def start(aiohttp_client: Any, llm: ScriptedLLM, *plugins: Any, env: Any = None) -> Any:
    app = make_app(llm=llm, plugins=[PLUGIN, *plugins], env=env)
    await aiohttp_client(app)  # starts the services (the compactor)
    return app[AGENT]


async def turn(conv: Any, text: str) -> list[Any]:
    events = asyncio.ensure_future(collect_turn(conv))
    await asyncio.sleep(0)
    await conv.send([TextPart(text)])
    got = await events
    await conv.wait_idle()
    return got


async def test_compacts_at_the_threshold_keeping_the_last_four_turns(aiohttp_client):
    llm = WindowLLM()
    agent = await start(aiohttp_client, llm)
    conv = await agent.create_conversation()
    compacted = []
    for i in range(16):
        events = await turn(conv, f"question {i} {PADDING}")
        assert events[-1].type == "End" and not any(e.type == "Error" for e in events)
        compacted += [(i, e) for e in events if e.type == "Compacted"]
    assert len(compacted) == conv.compactions >= 2
    for _, event in compacted:
        assert event.tokens_before >= 1280 > event.tokens_after  # 80 % of 1,600
    # what the model got after the last compaction: the summary, then whole turns
    last_i = compacted[-1][0]
    history = llm.conversations[-1].history
    assert history[0] == HistoryItem("summary", f"Goal: chat. Summary number {len(compacted)}.")
    users = [h.text for h in history if h.role == "user"]
    assert users == [f"question {i} {PADDING}" for i in range(last_i - 4, last_i)]
    assert llm.received[-1] == [UserInput(f"question 15 {PADDING}")]
    # summaries nest: each summary prompt carries the summary before it
    assert "Summary number 1." in llm.summary_prompts[1]
    assert "Goal:" in llm.summary_prompts[0] and "Remaining:" in llm.summary_prompts[0]
    # the audit log keeps everything, with one summary record per compaction
    records = await conv.get_messages(limit=200)
    kinds = [m.kind for m in records]
    assert kinds.count("user") == kinds.count("assistant") == 16
    summaries = [m for m in records if m.kind == "summary"]
    assert [m.id for m in summaries] == [e.summary_id for _, e in compacted]
    memory = await agent.store.list_memory(conv.id)
    assert [r.item.role for r in memory].count("summary") == 1
    assert memory[0].item.text == summaries[-1].payload["text"]


async def fill(conv: Any, turns: int, size: int = 300) -> None:
    for i in range(turns):
        await turn(conv, f"question {i} " + "x" * size)


async def test_a_failing_summary_leaves_memory_as_it_was(aiohttp_client, caplog):
    llm = WindowLLM(window=10_000)
    agent = await start(aiohttp_client, llm)
    conv = await agent.create_conversation()
    await fill(conv, 6)
    before = await agent.store.list_memory(conv.id)
    llm.context_window = 1200  # now over the threshold
    llm.summaries = [LLMError("the endpoint answered 500", "http_500")]
    with caplog.at_level(logging.WARNING):
        events = await turn(conv, "still there?")
    assert [e.type for e in events][-1] == "End" and "Error" not in [e.type for e in events]
    assert "the summary call failed, working memory is unchanged" in caplog.text
    after = await agent.store.list_memory(conv.id)
    assert after[: len(before)] == before and conv.compactions == 0
    assert len(after) == len(before) + 2  # the turn itself
    assert [m.kind for m in await conv.get_messages(limit=100)].count("summary") == 0


async def test_still_over_after_compacting_warns_and_goes_on(aiohttp_client, caplog):
    llm = WindowLLM(window=2000)
    agent = await start(aiohttp_client, llm)
    conv = await agent.create_conversation()
    with caplog.at_level(logging.WARNING):
        await fill(conv, 7, size=2500)  # every turn alone is ~650 tokens
    assert "the context is still" in caplog.text
    records = await conv.get_messages(limit=100)
    assert [m.kind for m in records].count("assistant") == 7
    # one summary call per compaction, never a second try in the same send
    assert len(llm.summary_prompts) == conv.compactions == 2


async def test_compaction_is_skipped_when_it_would_gain_little_and_said_once(
    aiohttp_client, caplog
):
    """The last 4 turns alone are over the threshold: compaction used to run before every
    turn, each time folding one more turn into the summary for a small gain. Now the old
    turns must hold a quarter of the window (an earlier summary aside), and the warning that
    compaction cannot help is said once."""
    llm = WindowLLM(window=1600)  # compacts at 1,280; each turn is ~315 tokens
    agent = await start(aiohttp_client, llm)
    conv = await agent.create_conversation()
    with caplog.at_level(logging.WARNING):
        await fill(conv, 10, size=600)
    # turn 5: nothing to compact; 6: one old turn, too little; 7: two, compacted; 8: the
    # summary and one turn, too little; 9: compacted; 10: too little
    assert conv.compactions == len(llm.summary_prompts) == 2
    assert caplog.text.count("the last turns are too long to compact") == 1


async def test_the_memory_review_runs_beside_the_summary(aiohttp_client):
    both = asyncio.Event()
    seen: list[list[str]] = []

    class Memory:
        @hookimpl
        def before_compaction(self, items):
            async def review():
                seen.append([i.text for i in items])
                both.set()  # the summary call waits for this: they run at the same time

            return review()

    async def summary_after_review():
        await asyncio.wait_for(both.wait(), 5)
        return "Goal: reviewed."

    llm = WindowLLM(window=10_000, summaries=[summary_after_review])
    agent = await start(aiohttp_client, llm, ("memory", Memory()))
    conv = await agent.create_conversation()
    await fill(conv, 6)
    llm.context_window = 1200
    await turn(conv, "go on")
    assert conv.compactions == 1
    assert seen and seen[0][0] == "question 0 " + "x" * 300  # the oldest turns went to review


async def test_a_context_length_error_forces_one_compaction_and_one_retry(aiohttp_client):
    llm = WindowLLM(window=100_000)
    agent = await start(aiohttp_client, llm)
    conv = await agent.create_conversation()
    await fill(conv, 6)
    too_long = LLMError("maximum context length exceeded", CONTEXT_LENGTH)
    llm.steps = [too_long, ["fits now"]]
    events = await turn(conv, "next")
    assert "Error" not in [e.type for e in events] and conv.compactions == 1
    assert (await conv.get_messages(limit=100))[-1].payload["text"] == "fits now"
    # refused again after the retry: the turn fails with the endpoint's error, no loop
    await fill(conv, 5)
    llm.steps = [too_long, too_long, ["never sent"]]
    events = await turn(conv, "again")
    assert events[-2].type == "Error" and events[-2].code == CONTEXT_LENGTH
    assert conv.compactions == 2 and llm.steps == [["never sent"]]


async def test_a_reply_that_never_came_near_a_known_window_is_taken_for_the_context(
    aiohttp_client,
):
    """llama-cpp-python answers a streamed request it refuses with an empty stream: with a
    known window and a context at least half of it, that is taken for a full context (one
    compaction, one retry); the error a user finally sees says to start a new conversation."""
    llm = WindowLLM(window=100_000)
    agent = await start(aiohttp_client, llm)
    conv = await agent.create_conversation()
    await fill(conv, 6)
    silent = LLMError("the model server ended the stream without a reply", SILENT_REFUSAL)
    llm.steps = [silent, ["fits now"]]
    events = await turn(conv, "next")
    assert "Error" in [e.type for e in events] and conv.compactions == 0  # far from the window
    llm.context_window = 1400  # the context (~1,000 tokens) is over half of it now
    llm.steps = [silent, ["fits now"]]
    events = await turn(conv, "next")
    assert "Error" not in [e.type for e in events] and conv.compactions == 1
    assert (await conv.get_messages(limit=100))[-1].payload["text"] == "fits now"
    llm.context_window = 1200
    llm.steps = [silent, silent, ["never sent"]]  # still no reply after the compaction
    events = await turn(conv, "again")
    assert events[-2].type == "Error" and events[-2].code == SILENT_REFUSAL
    assert events[-2].message.endswith("start a new conversation")
    assert llm.steps == [["never sent"]] and conv.compactions == 2


async def test_a_compaction_inside_a_tool_loop_keeps_the_tool_results(aiohttp_client):
    lookup = tool(lambda key: "y" * 2000, name="lookup", description="Look up.")

    class Tools:
        @hookimpl
        def register_tools(self, register):
            register(lookup)

    llm = WindowLLM(window=10_000)
    agent = await start(aiohttp_client, llm, ("tools", Tools()))
    conv = await agent.create_conversation()
    await fill(conv, 8)
    llm.context_window = 2000  # the tool result pushes the second step over
    llm.steps = [[ToolCallRequest("c1", "lookup", '{"key": "k"}')], ["found it"]]
    before = conv.compactions
    await turn(conv, "look it up")
    assert conv.compactions == before + 1
    # the rebuilt conversation already holds the call and its result: nothing new is sent
    assert llm.received[-1] == []
    history = llm.conversations[-1].history
    assert [h.role for h in history[-3:]] == ["user", "tool_call", "tool_result"]
    assert history[-1].text == "y" * 2000 and history[-2].call_id == "c1"
    assert (await conv.get_messages(limit=100))[-1].payload["text"] == "found it"


def test_the_estimate_counts_non_latin_text_and_emoji_conservatively():
    """Russian with emoji was estimated at 383 tokens (characters / 4) where the server counted
    1,034 of its 1,024-token window; ASCII text keeps the 4 characters a token."""
    assert estimate_tokens("a" * 400) == 100
    russian = ("Привет! Расскажи, пожалуйста, как у тебя дела сегодня? 🙂🚀 " * 30)[:1532]  # noqa: RUF001
    assert len(russian) // 4 == 383  # the old estimate
    assert estimate_tokens(russian) >= 1000  # the server's 1,034, near enough for 80 %
    assert estimate_tokens("日本語のテキスト") == 10  # 8 characters of 3 bytes: 5/4 each


async def test_the_estimate_is_calibrated_by_the_counts_the_server_reports(aiohttp_client):
    """A step right after the live conversation is built reports the server's count of the
    whole context: the estimate learns its factor; a backend's own guess (estimated usage, as
    the openai backend makes for llama-cpp-python's streams) is not taken over the engine's."""
    llm = WindowLLM(window=100_000)
    agent = await start(aiohttp_client, llm)
    conv = await agent.create_conversation()
    await fill(conv, 3)
    estimate = conv.context_tokens  # the engine's own running estimate
    llm.steps = [["sure", Usage(1, 1, estimated=True)]]  # a backend's (bad) guess
    await turn(conv, "go on")
    assert conv.context_tokens > estimate  # grown by the turn, not set to the guess
    assert agent.token_scale.factor == 1.0
    # rebuilt (a restart would do the same): the first step's count is the whole context's
    await conv.context.reset()
    built = context_tokens(
        agent.system_prompt(), [r.item for r in await agent.store.list_memory(conv.id)], []
    )
    llm.steps = [["ok", Usage(3 * (built + 6), 2)]]  # the model counts 3 times as many
    await turn(conv, "hello")
    assert agent.token_scale.factor == pytest.approx(3.0, rel=0.05)
    await conv.context.reset()
    await turn(conv, "and now")  # rebuilt again: the estimate is scaled
    assert conv.context_tokens >= 2.9 * built


def rows(*roles_and_turns: tuple[str, str | None]) -> list[MemoryRow]:
    return [MemoryRow(i, t, HistoryItem(r)) for i, (r, t) in enumerate(roles_and_turns)]


def test_the_cut_keeps_whole_turns_and_the_running_one():
    memory = rows(
        ("summary", None),
        ("user", "t1"),
        ("assistant", "t1"),
        ("user", "t2"),
        ("tool_call", "t2"),
        ("tool_result", "t2"),
        ("assistant", "t2"),
        ("user", "t3"),
        ("tool_call", "t3"),
        ("tool_result", "t3"),
        ("user", "run"),
        ("tool_call", "run"),
        ("tool_result", "run"),
    )
    assert compaction_cut(memory, 2, "run") == 3  # t2 and t3 kept, with their tool calls
    assert compaction_cut(memory, 2, None) == 7  # no turn running: t3 and "run" kept
    assert compaction_cut(memory, 3, "run") is None  # only the summary before t1
    assert compaction_cut(memory, 0, "run") == 10
    assert compaction_cut(rows(("user", "a"), ("assistant", "a")), 4, None) is None


@pytest.mark.parametrize(
    ("window", "line"),
    [(8192, "compaction: on at 80% of 8192 tokens"), (None, "compaction: off (no context window)")],
)
async def test_banner_line(aiohttp_client, window, line):
    app = make_app(llm=WindowLLM(window=window), plugins=[PLUGIN])
    await aiohttp_client(app)
    assert f"  {line}" in await banner(app, "127.0.0.1", 8080)


async def test_a_compaction_that_fails_midway_leaves_the_old_memory(tmp_path):
    import sqlite3 as sqlite

    from agentik.core.db import Database
    from agentik.core.store import SqliteStore, utcnow
    from agentik.core.types import ConversationInfo, Message

    store = SqliteStore(Database(str(tmp_path / "s.db")))
    await store.open()
    now = utcnow()
    await store.create_conversation(ConversationInfo("c1", None, False, now, now))
    taken = Message("sum-1", "c1", "summary", now, {"text": "an earlier summary"})
    await store.append("c1", [taken], [HistoryItem("user", str(i)) for i in range(6)])
    before = await store.list_memory("c1")
    # the summary record comes last in the transaction: its id is taken, so it fails after the
    # old entries were deleted and the summary entry written; all of it is rolled back
    record = Message("sum-1", "c1", "summary", now, {"text": "S"})
    with pytest.raises(sqlite.IntegrityError):
        await store.compact_memory("c1", 4, HistoryItem("summary", "S"), record)
    assert await store.list_memory("c1") == before
    record = Message("sum-2", "c1", "summary", now, {"text": "S"})
    await store.compact_memory("c1", 4, HistoryItem("summary", "S"), record)
    assert [r.item.text for r in await store.list_memory("c1")] == ["S", "4", "5"]
    assert [m.id for m in await store.list_messages("c1", None, 0, 10)] == ["sum-1", "sum-2"]
    await store.close()


async def test_an_interrupt_during_the_summary_leaves_memory_as_it_was(aiohttp_client):
    asked = asyncio.Event()

    async def slow_summary():
        asked.set()
        await asyncio.sleep(30)
        return "never"

    llm = WindowLLM(window=10_000, summaries=[slow_summary])
    agent = await start(aiohttp_client, llm)
    conv = await agent.create_conversation()
    await fill(conv, 6)
    before = await agent.store.list_memory(conv.id)
    llm.context_window = 1200
    events = asyncio.ensure_future(collect_turn(conv))
    await asyncio.sleep(0)
    await conv.send([TextPart("stop me")])
    await asyncio.wait_for(asked.wait(), 5)
    assert conv.interrupt()
    assert [e.type for e in await events][-2:] == ["Interrupted", "End"]
    await conv.wait_idle()
    after = await agent.store.list_memory(conv.id)
    assert after[: len(before)] == before and conv.compactions == 0
    assert "summary" not in [m.kind for m in await conv.get_messages(limit=100)]


def test_a_summary_goes_into_the_system_prompt_so_turns_still_alternate():
    from agentik_llm_openai.backend import OpenAIBackend

    backend = OpenAIBackend(base_url="http://127.0.0.1:9/v1", api_key="k", model="m")
    history = [
        HistoryItem("summary", "Goal: plan a trip."),
        HistoryItem("user", "and the hotel?"),
        HistoryItem("assistant", "Booked."),
    ]
    messages = backend.create_conversation("Be brief.", history, []).messages
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    assert (
        messages[0]["content"]
        == "Be brief.\n\nSummary of the earlier conversation:\nGoal: plan a trip."
    )
