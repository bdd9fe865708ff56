"""The shared way of asking the model a one-shot question (memory review, reflection, skill
mining, compaction summaries): JSON parsing, the output cap, the transcript fitted to the
context window, the counts recorded per feature."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentik.core.agent import ChatAgent
from agentik.core.context import estimate_tokens
from agentik.core.llm import LLMBackend, LLMError
from agentik.core.oneshot import (
    JSON_ONLY,
    PROMPT_TOO_LONG,
    BadAnswer,
    ask,
    ask_json,
    fit_entries,
    parse_json_answer,
    render_transcript,
)
from agentik.core.store import FeatureUsage, MemoryStore, utcnow
from agentik.core.testing import ScriptedLLM
from agentik.core.types import Message
from agentik_llm_openai.backend import OpenAIBackend
from tests.fake_openai import FakeOpenAI, Reply


@pytest.mark.parametrize(
    "answer",
    [
        '{"score": 3, "weakSpots": ["a"]}',
        '  \n{"score": 3, "weakSpots": ["a"]}\n',
        '```json\n{"score": 3, "weakSpots": ["a"]}\n```',
        '```\n{"score": 3, "weakSpots": ["a"]}\n```',
        'Here is my review:\n```json\n{"score": 3, "weakSpots": ["a"]}\n```\nHope it helps.',
        'Sure! {"score": 3, "weakSpots": ["a"]} That is all.',
        'I think {not json} but {"score": 3, "weakSpots": ["a"]}',
    ],
)
def test_parse_json_answer_finds_the_value(answer):
    assert parse_json_answer(answer) == {"score": 3, "weakSpots": ["a"]}


@pytest.mark.parametrize("answer", ["", "no idea", "{broken: json", "```json\n{oops\n```"])
def test_parse_json_answer_refuses_what_has_no_json(answer):
    with pytest.raises(BadAnswer):
        parse_json_answer(answer)


class Answers(ScriptedLLM):
    def __init__(self, *answers: str | LLMError) -> None:
        super().__init__()
        self.answers = list(answers)
        self.asked: list[tuple[str, str | None]] = []

    async def complete(self, prompt: str, *, system_prompt: str | None = None) -> str:
        self.asked.append((prompt, system_prompt))
        answer = self.answers.pop(0)
        if isinstance(answer, LLMError):
            raise answer
        return answer


def facts(value):
    items = value["facts"]
    if not isinstance(items, list):
        raise ValueError("facts must be a list")
    return [str(f["text"]) for f in items]


def agent_of(llm: LLMBackend) -> ChatAgent:
    return ChatAgent(store=MemoryStore(), llm=llm)


async def test_ask_json_returns_the_validated_answer():
    llm = Answers('```json\n{"facts": [{"category": "user", "text": "likes tea"}]}\n```')
    agent = agent_of(llm)
    answer = await ask_json(agent, "Extract facts.", facts, feature="test", system_prompt="sys")
    assert answer == ["likes tea"]
    prompt, system = llm.asked[0]
    assert prompt.startswith("Extract facts.") and prompt.endswith(JSON_ONLY)
    assert system == "sys"
    # a backend that reports no counts: estimated, and recorded under the feature
    (usage,) = (await agent.store.background_usage()).values()
    assert usage.calls == 1 and usage.estimated == 1 and usage.input > 0


@pytest.mark.parametrize(
    ("answer", "logged"),
    [
        ("I cannot help with that.", "no JSON in the answer"),
        ('{"facts": "tea"}', "facts must be a list"),
        ('{"other": []}', "'facts'"),
        (LLMError("the model endpoint answered HTTP 500: boom", "http_500"), "HTTP 500"),
    ],
)
async def test_ask_json_logs_and_gives_none(answer, logged, caplog):
    caplog.set_level(logging.WARNING)
    agent = agent_of(Answers(answer))
    assert await ask_json(agent, "Extract.", facts, feature="x", purpose="memory review") is None
    assert "memory review" in caplog.text and logged in caplog.text


def test_render_transcript():
    def rec(kind, **payload):
        return Message("m", "c", kind, utcnow(), payload)

    text = render_transcript(
        [
            rec("user", content=[{"type": "text", "body": "what time is it?"}]),
            rec("tool_call", callId="1", toolName="clock", argsJson='{"tz": "UTC"}'),
            rec("tool_result", callId="1", toolName="clock", text="12:00", isError=False),
            rec("assistant", text="x" * 50, tokens=None),
            rec("error", message="boom", code=None),
        ],
        max_chars=10,
    )
    assert text.splitlines() == [
        "User: what time  […]",
        'Tool call clock({"tz": "UTC"})',
        "Tool result clock: 12:00",
        "Assistant: xxxxxxxxxx […]",
    ]


# --- the output cap, the window, the counts: against the openai backend and the fake server --


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    server = FakeOpenAI()
    await server.start()
    yield server
    await server.close()


async def openai_agent(fake: FakeOpenAI, **kw: Any) -> ChatAgent:
    kw = {"timeout": 5.0, "max_retries": 2, **kw}
    llm = OpenAIBackend(base_url=fake.base_url, api_key="sk-test", model="fake-model", **kw)
    await llm.start()
    return agent_of(llm)


async def test_every_one_shot_call_carries_its_own_cap_whatever_openai_max_tokens_says(fake):
    agent = await openai_agent(fake, max_tokens=4000)
    fake.script(Reply('{"facts": []}'), Reply("Goal: chat."))
    assert await ask_json(agent, "Extract.", facts, feature="memory_review") == []
    await ask(agent, "Summarise.", feature="compaction", max_tokens=600)
    assert [r["max_tokens"] for r in fake.requests] == [400, 600]
    assert not any(r.get("stream") for r in fake.requests)  # llama-cpp-python counts only these
    # with a known window no cap takes more than a quarter of it
    agent.llm.context_window = 1024
    fake.script(Reply('{"facts": []}'))
    await ask_json(agent, "Extract.", facts, feature="memory_review")
    assert fake.requests[-1]["max_tokens"] == 256
    await agent.llm.aclose()


async def test_a_timed_out_one_shot_call_is_not_sent_again(fake, caplog):
    """A small model that does not stop: the call times out, and is not re-sent at once (the
    server would run it again while the user waits)."""
    caplog.set_level(logging.WARNING)
    agent = await openai_agent(fake, timeout=0.3, max_retries=2)
    fake.script(Reply(hang=True))
    assert await ask_json(agent, "Extract.", facts, feature="memory_review") is None
    assert len(fake.requests) == 1 and "timed out" in caplog.text
    await agent.llm.aclose()


def test_fit_entries_shortens_long_entries_then_leaves_out_the_oldest():
    entries = [f"User: message number {i} " + "words " * 20 for i in range(40)]
    entries[-2] = "Tool result big: " + "x" * 8000
    assert fit_entries(entries[:3], 10_000) == "\n".join(entries[:3])  # it fits: as it is
    text = fit_entries(entries, 400)
    assert estimate_tokens(text) <= 400
    lines = text.splitlines()
    assert lines[0].endswith("earlier entries left out]")
    assert lines[-1] == entries[-1]  # the newest, whole
    assert lines[-2].startswith("Tool result big: xxx") and lines[-2].endswith(" […]")
    assert len(lines[-2]) < 500  # shortened to a quarter of the room
    kept = [int(line.split()[3]) for line in lines[1:] if line.startswith("User:")]
    assert kept == [*range(kept[0], 38), 39] and kept[0] > 0  # the newest, in order


async def test_the_transcript_is_fitted_to_the_context_window(fake):
    """A reflection prompt of 2,270 tokens was sent to a 1,024-token model: every transcript is
    fitted to the window now, around the prompt and the answer's room."""
    agent = await openai_agent(fake, context_window=1024)
    fake.script(Reply('{"facts": []}'))
    transcript = [(f"User: Привет, это сообщение номер {i} 🙂 " * 4).strip() for i in range(60)]
    await ask_json(
        agent,
        lambda t: f"Read this.\n\nConversation:\n{t}",
        facts,
        feature="reflection",
        transcript=transcript,
    )
    (request,) = fake.requests
    prompt = request["messages"][-1]["content"]
    assert transcript[-1] in prompt and transcript[0] not in prompt
    assert "earlier entries left out]" in prompt
    assert estimate_tokens(prompt) + request["max_tokens"] <= 1024
    # a window too small for any transcript: no call, a clear error
    agent.llm.context_window = 300
    with pytest.raises(LLMError) as info:
        await ask(agent, lambda t: "x" * 2000 + t, feature="reflection", max_tokens=100,
                  transcript=["User: hi"])  # fmt: skip
    assert info.value.code == PROMPT_TOO_LONG and len(fake.requests) == 1
    await agent.llm.aclose()


async def test_the_counts_are_recorded_per_feature_and_calibrate_the_estimate(fake):
    agent = await openai_agent(fake)
    prompt = "Привет! Как дела? 🙂 " * 40
    sent = estimate_tokens(prompt) + 12  # the prompt and the messages' framing
    fake.script(Reply("ok", usage=(sent * 2, 7)), Reply("ok", usage=(sent * 2, 5)))
    await ask(agent, prompt, feature="memory_review", max_tokens=50, conversation_id="c1")
    assert agent.token_scale.factor == pytest.approx(2.0, rel=0.01)
    assert agent.token_scale(100) == 200
    await ask(agent, prompt, feature="reflection", max_tokens=50)
    assert await agent.store.background_usage() == {
        "memory_review": FeatureUsage(1, sent * 2, 7, 0),
        "reflection": FeatureUsage(1, sent * 2, 5, 0),
    }
    await agent.llm.aclose()
