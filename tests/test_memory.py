"""The memory feature on a running app: tools, prefetch, review, pre-compaction review, curator.

Each flow runs on the md backend and on ``DictMemory``, a third-party backend from a test plugin
that implements only the contract and gets everything else for free.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

import agentik_embedding_http
import agentik_memory
import agentik_memory_md
import agentik_memory_vector
from agentik.core.app import AGENT
from agentik.core.llm import HistoryItem, LLMError, ToolCallRequest, ToolResultInput, UserInput
from agentik.core.testing import ScriptedLLM, make_app
from agentik.core.types import TextPart
from agentik_memory.feature import BLOCK_END, BLOCK_START
from tests.conftest import collect_turn
from tests.fake_openai import FakeOpenAI
from tests.test_memory_core import DictPlugin
from tests.test_memory_md import notes_in

BACKENDS = ["md", "dict", "vector"]


class ReviewLLM(ScriptedLLM):
    """ScriptedLLM whose one-shot answers (the reviews) are scripted too, and may be held."""

    def __init__(self, *steps: Any, answers: Sequence[str | LLMError] = ()) -> None:
        super().__init__(*steps)
        self.answers = list(answers)
        self.review_prompts: list[str] = []
        self.gate: asyncio.Event | None = None
        self.active: dict[str, int] = {}
        self.most_active = 0

    async def complete(self, prompt: str, *, system_prompt: str | None = None) -> str:
        self.review_prompts.append(prompt)
        key = prompt.rsplit("Conversation:", 1)[-1].split("\n")[1][:20]
        self.active[key] = self.active.get(key, 0) + 1
        self.most_active = max(self.most_active, self.active[key])
        try:
            if self.gate is not None:
                await self.gate.wait()
            answer = self.answers.pop(0) if self.answers else '{"facts": []}'
            if isinstance(answer, LLMError):
                raise answer
            return answer
        finally:
            self.active[key] -= 1


@pytest.fixture
async def app(tmp_path):
    """``await app(backend, llm, **env)``: a started server with the memory feature."""
    servers: list[TestServer | FakeOpenAI] = []

    async def start(backend: str = "md", llm: Any = None, **env: str) -> Any:
        plugins = [
            ("agentik_memory", agentik_memory),
            ("agentik_memory_md", agentik_memory_md),
            ("agentik_memory_vector", agentik_memory_vector),
            ("agentik_embedding_http", agentik_embedding_http),
            ("dictmem", DictPlugin()),
        ]
        if backend == "vector":  # its embeddings: the fake's hashed bags of words
            embeddings = FakeOpenAI()
            await embeddings.start()
            servers.append(embeddings)
            env = {"OPENAI_BASE_URL": embeddings.base_url, "OPENAI_API_KEY": "sk-test", **env}
        env = {
            "AGENTIK_MEMORY_BACKEND": backend,
            "AGENTIK_MEMORY_DIR": str(tmp_path / "mem"),
            "AGENTIK_MEMORY_REVIEW": "0",
            **env,
        }
        application = make_app(llm=llm or ReviewLLM(), plugins=plugins, env=env)
        server = TestServer(application)
        await server.start_server()
        servers.append(server)
        return application[AGENT]

    yield start
    for server in reversed(servers):
        await server.close()


async def turn(conv: Any, text: str) -> list[Any]:
    collecting = asyncio.create_task(collect_turn(conv))
    await asyncio.sleep(0)
    await conv.send([TextPart(text)])
    return await collecting


def seen_by_model(llm: ScriptedLLM) -> str:
    """The user input of the last turn, as the model got it."""
    first = llm.received[-1][0]
    assert isinstance(first, UserInput)
    return first.text


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_tools(app, backend):
    agent = await app(backend)
    assert {"memory_save", "memory_read", "memory_list", "memory_delete"} <= set(
        agent.tools.names()
    )

    async def call(name: str, **args: Any) -> tuple[str, bool]:
        return await agent.tools.invoke(name, json.dumps(args))

    text, error = await call("memory_save", category="user", text="The user's name is Alice.")
    assert not error and text.startswith("Saved as ")
    note_id = text.removeprefix("Saved as ").rstrip(".")
    assert (await agent.memory.get(note_id)).source == "USER"
    again = await call(
        "memory_save", category="user", text="the USER'S name is alice", source="AGENT"
    )
    assert again == (f"Already remembered as {note_id}.", False)
    assert await agent.memory.count() == 1
    read, error = await call("memory_read", query="what is my name")
    assert not error and note_id in read and "Alice" in read
    listed, error = await call("memory_list", category="user")
    assert not error and note_id in listed
    assert await call("memory_list", category="world") == ("No world notes here.", False)
    # mistakes are tool errors the model can read
    # (the tool's schema lists the categories: the arguments check names them)
    text, error = await call("memory_save", category="secrets", text="x")
    assert error and "'secrets' is not one of ['user', 'world', 'preference']" in text
    text, error = await call("memory_list", category="misc")
    assert error and "'misc' is not one of" in text
    assert await call("memory_delete", id="nope") == ("Error: no note with id 'nope'", True)
    assert await call("memory_delete", id=note_id) == (f"Deleted {note_id}.", False)
    assert await call("memory_read", query="name") == ("No matching notes.", False)


async def test_a_tool_error_is_not_a_failed_turn(app):
    llm = ReviewLLM(
        [ToolCallRequest("c1", "memory_delete", '{"id": "nope"}')],
        [ToolCallRequest("c2", "memory_save", '{"category": "misc", "text": "x"}')],
        ["Sorry, I could not."],
    )
    agent = await app("md", llm)
    conv = await agent.create_conversation()
    events = await turn(conv, "forget note nope")
    results = [e for e in events if e.type == "ToolResult"]
    assert [r.is_error for r in results] == [True, True]
    assert "no note with id 'nope'" in results[0].text
    assert "'misc' is not one of" in results[1].text
    assert [e.type for e in events][-1] == "End" and "Error" not in [e.type for e in events]
    assert [m.kind for m in await conv.get_messages()][-1] == "assistant"
    assert isinstance(llm.received[-1][0], ToolResultInput)


async def test_memory_off_registers_no_tools_no_prompt_and_says_so(app):
    agent = await app("off")
    assert agent.memory is None and not [n for n in agent.tools.names() if "memory" in n]
    assert "long-term memory" not in agent.system_prompt()
    conv = await agent.create_conversation()
    await turn(conv, "What is my name?")
    assert seen_by_model(agent.llm) == "What is my name?"


@pytest.mark.parametrize("backend", BACKENDS)
async def test_prefetch_puts_relevant_notes_before_the_text_for_the_model_only(app, backend):
    agent = await app(backend)
    assert "long-term memory" in agent.system_prompt()
    name = await agent.memory.save("user", "The user's name is Alice.", "USER")
    await agent.memory.save("world", "Oslo is the capital of Norway.", "AGENT")
    conv = await agent.create_conversation()
    await turn(conv, "What is my name?")
    seen = seen_by_model(agent.llm)
    assert (
        seen
        == f"{BLOCK_START}\n- (user) The user's name is Alice.\n{BLOCK_END}\n\nWhat is my name?"
    )
    user = (await conv.get_messages())[0]
    assert user.payload["content"] == [{"type": "text", "body": "What is my name?"}]
    await agent.jobs.wait_idle()
    used = await agent.memory.get(name.id)
    assert used.uses == 1 and used.last_used is not None


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "text",
    [
        "Hello, how are you today?",
        "What is the capital of France?",
        "Which plays of Shakespeare are about kings, queens and betrayal?",
        "Привет! Как дела?",
    ],
)
async def test_nothing_irrelevant_is_injected(app, backend, text):
    agent = await app(backend)
    for fact in (
        "The user's name is Alice.",
        "The user plays the cello in an orchestra.",
        "The user's dog is called Rex.",
        "Пользователь живёт в Москве.",
    ):
        await agent.memory.save("user", fact, "USER")
    conv = await agent.create_conversation()
    await turn(conv, text)
    assert seen_by_model(agent.llm) == text


async def test_the_block_is_bounded_by_count_and_characters(app):
    agent = await app("md", AGENTIK_MEMORY_PREFETCH="3", AGENTIK_MEMORY_PREFETCH_CHARS="300")
    for i in range(8):
        await agent.memory.save("preference", f"The user likes coffee number {i} " * 3, "USER")
    conv = await agent.create_conversation()
    await turn(conv, "Which coffee do I like?")
    block = seen_by_model(agent.llm).split("\n\nWhich coffee")[0]
    assert block.startswith(BLOCK_START) and block.endswith(BLOCK_END)
    assert 1 <= block.count("\n- ") <= 3 and len(block) <= 300


FACT = '{"facts": [{"category": "preference", "text": "The user prefers tea over coffee."}]}'


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_review_saves_durable_facts_once(app, backend):
    llm = ReviewLLM(
        answers=[
            f"Here you go:\n```json\n{FACT}\n```\nHope that helps.",
            FACT.replace("The user", "the USER").replace(".", "!"),  # the same fact again
        ]
    )
    agent = await app(backend, llm, AGENTIK_MEMORY_REVIEW="1", AGENTIK_MEMORY_REVIEW_EVERY="1")
    conv = await agent.create_conversation()
    await turn(conv, "I always drink tea, never coffee.")
    await agent.jobs.wait_idle()
    assert "User: I always drink tea, never coffee.\nAssistant: echo: " in llm.review_prompts[0]
    [note] = await agent.memory.list("preference")
    assert (note.text, note.source, note.uses) == (
        "The user prefers tea over coffee.",
        "AUTO_REVIEW",
        0,
    )
    await turn(conv, "Noted, thanks.")  # nothing to prefetch: only the review bumps it
    await agent.jobs.wait_idle()
    [again] = await agent.memory.list("preference")
    assert again.id == note.id and again.uses == 1  # bumped, not saved twice


@pytest.mark.parametrize(
    "answer",
    [
        "I think the user likes tea.",
        '{"facts": "tea"}',
        '[{"category": "user", "text": "The user likes tea."}]',
        '{"facts": [{"category": "secret", "text": "The user likes tea."}]}',
        '{"facts": [{"category": "user"}]}',
        '{"facts": [{"category": "user", "text": "ok fine"}, {"category": "user", "text": 5}]}',
        '{"facts": [{"category": "user", "text": "..."}]}',
        LLMError("upstream is down", "http_503"),
    ],
)
async def test_bad_review_answers_save_nothing(app, answer, caplog):
    llm = ReviewLLM(answers=[answer])
    agent = await app("md", llm, AGENTIK_MEMORY_REVIEW="1", AGENTIK_MEMORY_REVIEW_EVERY="1")
    conv = await agent.create_conversation()
    events = await turn(conv, "I like tea.")
    await agent.jobs.wait_idle()
    assert events[-1].type == "End" and llm.review_prompts
    assert await agent.memory.count() == 0
    assert "memory review of" in caplog.text


async def test_review_off_asks_nothing(app):
    llm = ReviewLLM(answers=[FACT])
    agent = await app("md", llm, AGENTIK_MEMORY_REVIEW="0")
    await turn(await agent.create_conversation(), "I like tea.")
    await agent.jobs.wait_idle()
    assert llm.review_prompts == []


async def test_reviews_yield_to_turns_and_cover_every_turn_not_reviewed(app):
    """A review waits for no turn: a turn that starts cuts the review under way short, and the
    next review covers every turn not reviewed yet. Reviews run one at a time, whatever the
    conversation."""
    llm = ReviewLLM(answers=[FACT] * 4)
    llm.gate = asyncio.Event()  # every review waits here
    agent = await app("md", llm, AGENTIK_MEMORY_REVIEW="1", AGENTIK_MEMORY_REVIEW_EVERY="1")
    conv = await agent.create_conversation()
    for i in range(3):  # each turn ends while the review before it waits
        assert (await turn(conv, f"turn number {i}"))[-1].type == "End"
    other = await agent.create_conversation()
    assert (await turn(other, "another chat"))[-1].type == "End"
    await asyncio.sleep(0.05)
    assert agent.background.counts["preempted"] == 3  # one cut short by each later turn
    llm.gate.set()
    await agent.jobs.wait_idle()
    assert llm.most_active == 1
    done = llm.review_prompts[-2:]  # the reviews that were not cut short
    assert [p.count("turn number") for p in done] == [6, 0]  # 3 turns: user and echo each
    assert "another chat" in done[1]
    [note] = await agent.memory.list("preference")
    assert note.uses == 1  # saved once, then found again once


async def test_the_review_waits_for_the_user_to_pause(app):
    """AGENTIK_BACKGROUND_IDLE: the review of back-to-back turns runs once, after the last,
    when no turn has run for that long (on a one-slot server it queued the next turn)."""
    llm = ReviewLLM(answers=[FACT])
    agent = await app(
        "md",
        llm,
        AGENTIK_MEMORY_REVIEW="1",
        AGENTIK_MEMORY_REVIEW_EVERY="1",
        AGENTIK_BACKGROUND_IDLE="0.4",
    )
    conv = await agent.create_conversation()
    for i in range(3):
        await turn(conv, f"turn number {i}")
    ended = asyncio.get_running_loop().time()
    await asyncio.sleep(0.2)
    assert llm.review_prompts == []  # not yet
    await agent.jobs.wait_idle()
    assert asyncio.get_running_loop().time() - ended >= 0.4
    (prompt,) = llm.review_prompts  # one review of the three turns
    assert prompt.count("turn number") == 6


async def test_by_default_one_review_reads_four_turns(app):
    """Not a second model call per turn (#20.7): the turns wait and go to one review."""
    llm = ReviewLLM(answers=[FACT])
    agent = await app("md", llm, AGENTIK_MEMORY_REVIEW="1")
    conv = await agent.create_conversation()
    for i in range(3):
        await turn(conv, f"turn number {i}")
    await agent.jobs.wait_idle()
    assert llm.review_prompts == []
    await turn(conv, "turn number 3")
    await agent.jobs.wait_idle()
    [prompt] = llm.review_prompts
    told = prompt.rsplit("Conversation:", 1)[1]
    assert [told.count(f"turn number {i}") for i in range(4)] == [2, 2, 2, 2]  # user, echo
    assert told.index("turn number 0") < told.index("turn number 3")
    assert len(await agent.memory.list("preference")) == 1
    for i in range(4, 8):  # the next review reads only the turns since this one
        await turn(conv, f"turn number {i}")
    await agent.jobs.wait_idle()
    assert len(llm.review_prompts) == 2
    assert "turn number 3" not in llm.review_prompts[1] and "turn number 7" in llm.review_prompts[1]


async def test_turns_left_unreviewed_are_reviewed_when_the_conversation_goes_idle(app):
    llm = ReviewLLM(answers=[FACT])
    agent = await app("md", llm, AGENTIK_MEMORY_REVIEW="1", AGENTIK_MEMORY_REVIEW_IDLE="0.3")
    conv, other = await agent.create_conversation(), await agent.create_conversation()
    await turn(conv, "first of two")
    await asyncio.sleep(0.2)
    await turn(conv, "second of two")  # the idle time starts again
    await turn(other, "alone")
    await asyncio.sleep(0.2)
    assert llm.review_prompts == []  # 0.4 s since the first turn, 0.2 s since the last
    for _ in range(100):
        if len(llm.review_prompts) == 2:
            break
        await asyncio.sleep(0.05)
    await agent.jobs.wait_idle()
    mine = [p for p in llm.review_prompts if "of two" in p]
    assert len(mine) == 1 and "first of two" in mine[0] and "second of two" in mine[0]
    assert sum("alone" in p for p in llm.review_prompts) == 1
    await asyncio.sleep(0.5)
    assert len(llm.review_prompts) == 2  # reviewed once: nothing is left for another


async def test_the_idle_review_waits_for_a_running_turn(app):
    llm = ReviewLLM(answers=[FACT])
    agent = await app("md", llm, AGENTIK_MEMORY_REVIEW="1", AGENTIK_MEMORY_REVIEW_IDLE="0.2")
    conv = await agent.create_conversation()
    await turn(conv, "quick one")
    llm.delay = 0.25  # two chunks: the next turn runs past the idle time of the first
    events = asyncio.create_task(turn(conv, "slow one"))
    await asyncio.sleep(0.35)
    assert llm.review_prompts == []  # the idle time passed while the second turn ran
    await events
    await asyncio.sleep(0.4)
    await agent.jobs.wait_idle()
    [prompt] = llm.review_prompts
    assert "quick one" in prompt and "slow one" in prompt


async def test_before_compaction_reviews_the_turns_about_to_go(app):
    llm = ReviewLLM(
        answers=['{"facts": [{"category": "user", "text": "The user lives in Oslo."}]}']
    )
    agent = await app("md", llm, AGENTIK_MEMORY_REVIEW="0")  # independent of the setting
    conv = await agent.create_conversation()
    items = [
        HistoryItem("user", "I moved to Oslo last year."),
        HistoryItem("tool_call", call_id="c", tool_name="t", args_json="{}"),
        HistoryItem("assistant", "Nice city!"),
    ]
    await agent.before_compaction(conv, items)
    # the transcript every one-shot call reads (agentik.core.oneshot.render_items)
    expected = "User: I moved to Oslo last year.\nTool call t({})\nAssistant: Nice city!"
    assert expected in llm.review_prompts[0]
    [note] = await agent.memory.list("user")
    assert (note.text, note.source) == ("The user lives in Oslo.", "PRE_COMPACTION")


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_curator_archives_notes_never_used(app, backend, caplog):
    caplog.set_level(logging.INFO, logger="agentik.memory")
    # the first pass comes after the notes are saved and one is used (on a busy machine too)
    agent = await app(backend, AGENTIK_MEMORY_CURATOR_INTERVAL="0.3", AGENTIK_MEMORY_MAX_AGE="0")
    used = await agent.memory.save("user", "The user is a nurse.", "USER")
    await agent.memory.mark_used([used.id])  # before the curator's next pass can archive it
    await agent.memory.save("user", "The user once visited Oslo.", "AUTO_REVIEW")
    for _ in range(250):
        if await agent.memory.count() == 1:
            break
        await asyncio.sleep(0.02)
    assert [n.id for n in await agent.memory.list("user")] == [used.id]
    assert "[Curator] archived 1 stale notes" in caplog.text


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_banner_line(app, backend, tmp_path):
    agent = await app(backend)
    await agent.memory.save("user", "The user's name is Alice.", "USER")
    settings = {
        "AGENTIK_MEMORY_BACKEND": backend,
        "AGENTIK_MEMORY_CURATOR_INTERVAL": 86400.0,
        "AGENTIK_MEMORY_MAX_AGE": 90.0,
    }
    line, curator = agentik_memory.banner_lines(agent, settings)
    assert curator == "curator: on (every 1d, archives notes unused for 90d)"  # as the seeds'
    where = {
        "md": f"{tmp_path / 'mem'}, 1 notes",
        "dict": "a dict, 1 notes",
        "vector": "1 notes, dim 1536, embeddings: http text-embedding-3-small",
    }[backend]
    assert line == f"memory: {backend} ({where})"


async def test_twenty_conversations_saving_at_once_lose_nothing(app, tmp_path):
    class Saver(ReviewLLM):
        def default(self, inputs: Sequence[Any]) -> Any:
            last = inputs[-1]
            if isinstance(last, UserInput):
                args = {"category": "world", "text": f"Fact {last.text} is true."}
                return [ToolCallRequest("c", "memory_save", json.dumps(args))]
            return ["saved"]

    agent = await app("md", Saver())
    convs = [await agent.create_conversation() for _ in range(20)]
    await asyncio.gather(*(turn(c, f"number{i}") for i, c in enumerate(convs)))
    await agent.jobs.wait_idle()
    texts = sorted(n.text for n in notes_in(tmp_path / "mem" / "world.md"))
    assert texts == sorted(f"Fact number{i} is true." for i in range(20))
    assert await agent.memory.count() == 20


def test_the_curator_line_names_its_interval_in_the_largest_whole_unit():
    from agentik_memory import _duration

    assert [_duration(s) for s in (86400, 172800, 7200, 5400, 60, 90, 0.5)] == [
        "1d", "2d", "2h", "90m", "1m", "90s", "0.5s",
    ]  # fmt: skip
