"""Self-reflection (F11) end to end: the openai backend, the fake OpenAI server scripted with
reflection answers (good and malformed), the reflection table on a real SQLite file and the
system prompt of later conversations."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from typing import Any

import pytest

import agentik_reflection
from agentik.core.app import AGENT
from agentik.core.cli import banner
from agentik.core.testing import make_app
from agentik.core.types import TextPart
from agentik_llm_openai.backend import OpenAIBackend
from agentik_reflection.reflector import EXAMPLE, HEADING, validate
from tests.conftest import wait_until
from tests.fake_openai import FakeOpenAI, Reply, echo

PLUGIN = ("agentik_reflection", agentik_reflection)


class Reviewer:
    """Echoes turns; answers one-shot (reflection) calls from ``answers`` in order."""

    def __init__(self, *answers: str, delay: float = 0.0) -> None:
        self.answers = list(answers)
        self.delay = delay
        self.prompts: list[str] = []

    def __call__(self, body: dict[str, Any]) -> Reply:
        if body.get("stream"):
            return echo(body)
        self.prompts.append(body["messages"][-1]["content"])
        return Reply(self.answers.pop(0) if self.answers else "{}", delay=self.delay)


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    server = FakeOpenAI()
    await server.start()
    yield server
    await server.close()


async def start(aiohttp_client: Any, fake: FakeOpenAI, tmp_path: Any, **env: str) -> Any:
    llm = OpenAIBackend(base_url=fake.base_url, api_key="k", model="fake", max_retries=0)
    app = make_app(
        llm=llm,
        plugins=[PLUGIN],
        env={"AGENTIK_DB_PATH": str(tmp_path / "r.db"), **env},
    )
    await aiohttp_client(app)
    return app[AGENT]


async def turns(agent: Any, conv: Any, texts: list[str]) -> None:
    for text in texts:
        await conv.send([TextPart(text)])
        await conv.wait_idle()
        await agent.jobs.wait_idle()  # the reflection of this turn, if any


def stored(tmp_path: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(tmp_path / "r.db") as db:
        return db.execute(
            "SELECT conversation_id, turns, score, weak_spots_json FROM reflection ORDER BY id"
        ).fetchall()


@pytest.mark.sqlite_file
async def test_reflections_are_scored_stored_and_prompted(aiohttp_client, fake, tmp_path, caplog):
    fake.default = reviewer = Reviewer(
        '{"score": 2, "weakSpots": ["answers too long"]}',
        "I would say 3 out of 5.",  # no JSON: dropped
        '```json\n{"score": 9, "weakSpots": []}\n```',  # out of range: dropped
        'Sure: {"score": 4, "weakSpots": ["did not ask which city", "answers too long"]} ok?',
    )
    agent = await start(
        aiohttp_client,
        fake,
        tmp_path,
        AGENTIK_REFLECTION_INTERVAL="2",
        AGENTIK_REFLECTION_TOP_K="2",
    )
    conv = await agent.create_conversation()
    await turns(agent, conv, [f"message {k}" for k in range(9)])
    # one call every 2 user turns (turns 2, 4, 6, 8), each on the last 2 turns
    assert len(reviewer.prompts) == 4
    assert "User: message 0\nAssistant: echo: message 0\nUser: message 1" in reviewer.prompts[0]
    assert "message 5" in reviewer.prompts[2] and "message 3" not in reviewer.prompts[2]
    assert stored(tmp_path) == [
        (conv.id, 2, 2, '["answers too long"]'),
        (conv.id, 8, 4, '["did not ask which city", "answers too long"]'),
    ]
    assert "answer ignored" in caplog.text and "score must be an integer from 1 to 5" in caplog.text

    # a new conversation's system prompt lists the weak spots of the last 2 reflections
    other = await agent.create_conversation()
    await turns(agent, other, ["hello"])
    system = fake.requests[-1]["messages"][0]
    assert system["role"] == "system"
    assert system["content"].endswith(
        f"{HEADING} (avoid repeating them):\n- did not ask which city\n- answers too long"
    )


async def test_a_reflection_reaches_the_conversation_it_is_about(aiohttp_client, fake, tmp_path):
    """Its weak spots are in the system prompt of that very conversation's next turn, not only
    of conversations started later; the live conversation keeps its history."""
    fake.default = Reviewer('{"score": 2, "weakSpots": ["answers too long"]}')
    agent = await start(aiohttp_client, fake, tmp_path, AGENTIK_REFLECTION_INTERVAL="2")
    conv = await agent.create_conversation()
    await turns(agent, conv, ["message 0", "message 1"])  # reflected on after the second
    assert HEADING not in fake.requests[-2]["messages"][0]["content"]
    await turns(agent, conv, ["message 2"])
    sent = fake.requests[-1]["messages"]
    assert sent[0]["role"] == "system"
    assert sent[0]["content"].endswith(f"{HEADING} (avoid repeating them):\n- answers too long")
    assert [m["content"] for m in sent[1:] if m["role"] == "user"] == [
        "message 0",
        "message 1",
        "message 2",
    ]
    assert conv.llm_builds == 1  # the openai backend swapped the system message


@pytest.mark.sqlite_file
async def test_a_reflection_yields_to_a_turn_and_never_runs_twice(aiohttp_client, fake, tmp_path):
    """A turn that starts cuts the reflection under way short (on a one-slot server it would
    wait behind it); the reflection runs again once the turn is over, on the latest turns."""
    fake.default = reviewer = Reviewer(
        '{"score": 4, "weakSpots": []}', '{"score": 5, "weakSpots": []}', delay=1.0
    )
    agent = await start(aiohttp_client, fake, tmp_path, AGENTIK_REFLECTION_INTERVAL="1")
    reflector = agent.state["agentik_reflection"]
    conv = await agent.create_conversation()
    await conv.send([TextPart("first")])
    await conv.wait_idle()
    await wait_until(lambda: len(reviewer.prompts) == 1)  # turn 1's reflection (slow)
    await conv.send([TextPart("second")])
    await conv.wait_idle()
    assert agent.background.counts["preempted"] == 1  # turn 2 cut it short
    await wait_until(lambda: conv.id in reflector.running)  # and it runs again
    second = await reflector.reflect(conv)
    assert second == {
        "conversationId": conv.id,
        "reflected": False,
        "reason": "a reflection is already running",
    }
    await agent.jobs.wait_idle()
    assert len(reviewer.prompts) == 2  # the one cut short, then one after turn 2
    assert [row[1:3] for row in stored(tmp_path)] == [(2, 5)]  # the answer to the second


@pytest.mark.parametrize(
    "answer",
    [
        {"score": 3},
        {"score": 3, "weakSpots": [], "note": "extra"},
        {"score": True, "weakSpots": []},
        {"score": 0, "weakSpots": []},
        {"score": "3", "weakSpots": []},
        {"score": 3, "weakSpots": "too long"},
        {"score": 3, "weakSpots": [1]},
        [3, ["x"]],
        EXAMPLE,
    ],
)
def test_only_the_exact_shape_is_accepted(answer):
    with pytest.raises(ValueError):
        validate(answer)


def test_the_shape_is_cleaned():
    assert validate({"score": 1, "weakSpots": ["  too\n long ", ""]}) == (1, ["too long"])
    # a weak spot without a word is none (the prompt's "..." placeholder)
    assert validate({"score": 2, "weakSpots": ["...", " - ", "…", "too long"]}) == (2, ["too long"])


@pytest.mark.sqlite_file
async def test_the_prompts_own_example_given_back_is_ignored(aiohttp_client, fake, tmp_path):
    """A small model answered the prompt's example, and ``- ...`` went into every system
    prompt: that answer is no reflection, and wordless weak spots are dropped."""
    fake.default = Reviewer(
        json.dumps(EXAMPLE), '{"score": 2, "weakSpots": ["...", "answers too long"]}'
    )
    agent = await start(aiohttp_client, fake, tmp_path, AGENTIK_REFLECTION_INTERVAL="1")
    conv = await agent.create_conversation()
    await turns(agent, conv, ["first", "second"])
    assert [row[1:] for row in stored(tmp_path)] == [(2, 2, '["answers too long"]')]
    await turns(agent, await agent.create_conversation(), ["hello"])
    system = [r for r in fake.requests if r.get("stream")][-1]["messages"][0]["content"]
    assert system.endswith("- answers too long") and "- ..." not in system


@pytest.mark.parametrize(
    ("interval", "line"),
    [("10", "reflection: on (every 10 turns, top 3)"), ("0", "reflection: off")],
)
async def test_banner_line(aiohttp_client, tmp_path, interval, line):
    app = make_app(plugins=[PLUGIN], env={"AGENTIK_REFLECTION_INTERVAL": interval})
    await aiohttp_client(app)
    assert any(entry.startswith(f"  {line}") for entry in await banner(app, "127.0.0.1", 1))
