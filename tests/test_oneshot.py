"""The shared way of asking the model for JSON (memory review, reflection, skill mining)."""

from __future__ import annotations

import logging

import pytest

from agentik.core.llm import LLMError
from agentik.core.oneshot import (
    JSON_ONLY,
    BadAnswer,
    ask_json,
    parse_json_answer,
    render_transcript,
)
from agentik.core.store import utcnow
from agentik.core.testing import ScriptedLLM
from agentik.core.types import Message


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


async def test_ask_json_returns_the_validated_answer():
    llm = Answers('```json\n{"facts": [{"category": "user", "text": "likes tea"}]}\n```')
    assert await ask_json(llm, "Extract facts.", facts, system_prompt="sys") == ["likes tea"]
    prompt, system = llm.asked[0]
    assert prompt.startswith("Extract facts.") and prompt.endswith(JSON_ONLY)
    assert system == "sys"


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
    assert await ask_json(Answers(answer), "Extract.", facts, purpose="memory review") is None
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
