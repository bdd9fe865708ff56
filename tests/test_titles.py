"""Conversation titles (plugins/titles): after the first reply of an untitled conversation one
short one-shot call names it, in the background; never when the user set a title, never
again after, nothing at all when ``AGENTIK_AUTO_TITLE=0``. Against a real ``agentik serve``
and the fake LLM."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from agentik.client import RemoteAgent, RemoteConversation
from agentik.core.types import End, TextPart
from agentik_titles.titler import validate
from tests.conftest import script_fake
from tests.test_serve import openai_env

ASKED = "short title"  # in the title prompt only


async def title_requests(fake: str) -> list[dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"{fake.removesuffix('/v1')}/_fake/requests") as r,
    ):
        bodies = await r.json()
    return [b for b in bodies if any(ASKED in str(m.get("content")) for m in b["messages"])]


async def turn(conv: RemoteConversation, text: str) -> None:
    events = conv.events()
    sent = await conv.send([TextPart(text)])
    async for event in events:
        if isinstance(event, End) and event.turn_id == sent.id:
            break
    await events.aclose()


async def title_of(agent: RemoteAgent, cid: str) -> str | None:
    conv = await agent.get_conversation(cid)
    assert conv is not None
    return conv.title


async def wait_title(agent: RemoteAgent, cid: str, timeout: float = 10) -> str:
    deadline = time.monotonic() + timeout
    while (title := await title_of(agent, cid)) is None:
        assert time.monotonic() < deadline, "never titled"
        await asyncio.sleep(0.1)
    return title


def test_an_answer_is_tidied_or_refused():
    assert validate({"title": ' "Planning a  trip\nto Rome." '}) == "Planning a trip to Rome"
    assert validate({"title": "x" * 200}) == "x" * 79 + "…"
    for bad in ({"title": "  ”“ "}, {"name": "x"}, ["x"], {"title": 3}):
        with pytest.raises(ValueError):
            validate(bad)


async def test_the_first_reply_names_the_conversation_in_the_background(serve, fake_openai_proc):
    _, base = serve(openai_env(fake_openai_proc, AGENTIK_AUTO_TITLE="1"))
    # the title call answers late: the next turn does not wait for it, it cuts the call short
    # (a background call yields to user turns), and the call is asked again once they pause
    title = {"text": '{"title": "\\"Saying hello.\\""}', "match": ASKED}
    # (the second answer is slow too, so "not titled yet" right after the turns holds under load)
    await script_fake(fake_openai_proc, {**title, "delay": 2.0}, {**title, "delay": 3.0})
    async with RemoteAgent(base) as agent:
        conv = await agent.create_conversation()
        started = time.monotonic()
        await turn(conv, "hello there")
        await turn(conv, "and again")
        assert time.monotonic() - started < 1.5
        assert await title_of(agent, conv.id) is None  # still being asked
        assert await wait_title(agent, conv.id) == "Saying hello"
        await turn(conv, "a third time")  # titled once: no more calls
        asked = await title_requests(fake_openai_proc)
        assert len(asked) in (1, 2)  # the first one cut short by the second turn, or not
        assert all("hello there" in str(a["messages"]) for a in asked)
        assert not any("and again" in str(a) for a in asked)

        # a title the user gave is kept: no call at all
        named = await agent.create_conversation(title="Mine")
        await turn(named, "hello")
        # and one the user gives while the model is asked wins over the model's
        await script_fake(
            fake_openai_proc, {"text": '{"title": "Model title"}', "match": ASKED, "delay": 1.0}
        )
        raced = await agent.create_conversation()
        await turn(raced, "hello")
        await raced.rename("Chosen meanwhile")
        await asyncio.sleep(2.0)
        # this one asked, "Mine" not
        assert len(await title_requests(fake_openai_proc)) == len(asked) + 1
        assert await title_of(agent, named.id) == "Mine"
        assert await title_of(agent, raced.id) == "Chosen meanwhile"


async def test_off_asks_nothing(serve, fake_openai_proc):
    proc, base = serve(openai_env(fake_openai_proc, AGENTIK_AUTO_TITLE="0"))
    async with RemoteAgent(base) as agent:
        conv = await agent.create_conversation()
        await turn(conv, "hello")
        await asyncio.sleep(0.5)
        assert await title_requests(fake_openai_proc) == []
        assert await title_of(agent, conv.id) is None
    assert "titles: off (AGENTIK_AUTO_TITLE=0)" in proc.output
