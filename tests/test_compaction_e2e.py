"""Context compaction over the real OpenAI backend and the fake OpenAI server: 1,000 turns in
process (what the model receives, the audit log, nested summaries, the compaction count the
threshold predicts), and ``agentik serve`` as a process for a few dozen turns, a failing
summary call and a kill -9 in the middle of a slow one.

The 1,000 turns run in process, not through ``agentik serve``, and on an in-memory SQLite
database (the fsync of 1,000 acknowledged messages is not what they test): over HTTP and SSE
they take minutes on a loaded CI machine. The serve test drives the same path for 40 turns.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
from pathlib import Path
from typing import Any

import aiohttp

import agentik_compaction
from agentik.core.app import AGENT
from agentik.core.llm import SUMMARY_PREFIX
from agentik.core.testing import make_app
from agentik.core.types import TextPart
from agentik_llm_openai.backend import OpenAIBackend
from tests.conftest import read_sse, rows
from tests.fake_openai import FakeOpenAI, Reply, echo, usage_of

TOO_LONG = (
    "This model's maximum context length is 600 tokens. However, your messages resulted in "
    "713 tokens. Please reduce the length of the messages."
)
WINDOW = 600
LIMIT = int(WINDOW * 0.8)  # AGENTIK_COMPRESSION_THRESHOLD's default


class Model:
    """The fake's default replies: an echo for turns (streamed), a numbered summary for the
    one-shot summary calls; ``mode`` makes summary calls fail (500) or hang."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.summaries: list[str] = []  # the summaries given, in order
        self.summary_prompts: list[str] = []
        self.failed = 0
        self.hanging = asyncio.Event()

    def __call__(self, body: dict[str, Any]) -> Reply:
        if body.get("stream"):
            return echo(body)
        self.summary_prompts.append(body["messages"][-1]["content"])
        if self.mode == "fail":
            self.failed += 1
            return Reply(status=500)
        if self.mode == "slow":
            self.hanging.set()
            return Reply("too late", delay=60)
        text = f"Goal: keep chatting. Resolved: summary {len(self.summaries) + 1}."
        self.summaries.append(text)
        return Reply(text)


def check_last_turns_intact(streamed: list[dict[str, Any]], first: int = 0) -> None:
    """In every request of turn k the model got turns k-4 .. k-1 whole, then message k."""
    for k, body in enumerate(streamed, start=first):
        messages = body["messages"]
        assert messages[-1] == {"role": "user", "content": f"message {k}"}
        for back in range(1, min(4, k - first) + 1):
            user, answer = messages[-1 - 2 * back], messages[-2 * back]
            assert user == {"role": "user", "content": f"message {k - back}"}, (k, back)
            assert answer == {"role": "assistant", "content": f"echo: message {k - back}"}


async def test_a_thousand_turns_with_a_600_token_window(aiohttp_client, tmp_path):
    model = Model()
    fake = FakeOpenAI(default=model)
    await fake.start()
    llm = OpenAIBackend(
        base_url=fake.base_url, api_key="k", model="fake", context_window=WINDOW, max_retries=0
    )
    app = make_app(
        llm=llm,
        plugins=[("agentik_compaction", agentik_compaction)],
        env={"AGENTIK_DB_PATH": ":memory:"},
    )
    await aiohttp_client(app)
    agent = app[AGENT]
    conv = await agent.create_conversation()
    turns = 1000
    for k in range(turns):
        await conv.send([TextPart(f"message {k}")])
        await conv.wait_idle()
    await fake.close()

    # every turn succeeded and the audit log keeps every message
    records = await conv.get_messages(limit=10_000)
    users = [m for m in records if m.kind == "user"]
    answers = [m for m in records if m.kind == "assistant"]
    assert len(users) == len(answers) == turns and "error" not in {m.kind for m in records}
    assert [a.payload["text"] for a in answers] == [f"echo: message {k}" for k in range(turns)]
    summaries = [m.payload["text"] for m in records if m.kind == "summary"]
    assert summaries == model.summaries and conv.compactions == len(summaries)

    # what the model received: the last 4 turns whole, never more than the window
    streamed = [r for r in fake.requests if r.get("stream")]
    assert len(streamed) == turns
    check_last_turns_intact(streamed)
    assert max(len(json.dumps(r["messages"])) // 4 for r in streamed) < WINDOW

    # the compactions are where the threshold puts them: before turn k exactly when the
    # running estimate (the backend's count of turn k-1, prompt plus reply, and message k at
    # chars/4 + 4) is at or over 80 % of the window, once 5 whole turns are there to cut
    compacted_before, since = [], 0
    for r in fake.requests:
        if r.get("stream"):
            compacted_before.append(since)
            since = 0
        else:
            since += 1
    assert all(n <= 1 for n in compacted_before)  # never two in one send
    predicted = [False]
    for k in range(1, turns):
        usage = usage_of(streamed[k - 1], echo(streamed[k - 1]), [])
        estimate = usage["prompt_tokens"] + usage["completion_tokens"]
        estimate += len(f"message {k}") // 4 + 4
        predicted.append(estimate >= LIMIT and k >= 5)
    assert [bool(n) for n in compacted_before] == predicted
    assert 50 < sum(predicted) < 150  # ~ one compaction every 10 turns

    # summaries nest: each summary call was given the summary before it
    for before, prompt in zip(model.summaries, model.summary_prompts[1:], strict=False):
        assert before in prompt
    memory = await agent.store.list_memory(conv.id)
    assert memory[0].item.role == "summary" and memory[0].item.text == summaries[-1]
    assert [r.item.role for r in memory].count("summary") == 1


async def test_a_refused_context_is_compacted_once_and_the_step_retried(aiohttp_client):
    fake = FakeOpenAI(default=Model())
    await fake.start()
    llm = OpenAIBackend(
        base_url=fake.base_url, api_key="k", model="fake", context_window=100_000, max_retries=0
    )
    app = make_app(llm=llm, plugins=[("agentik_compaction", agentik_compaction)])
    await aiohttp_client(app)
    conv = await app[AGENT].create_conversation()
    for k in range(7):
        if k == 6:  # OpenAI's answer to a request over the model's context length
            fake.script(Reply(status=400, text=TOO_LONG, code="context_length_exceeded"))
        await conv.send([TextPart(f"message {k}")])
        await conv.wait_idle()
    await fake.close()
    last = (await conv.get_messages(limit=100))[-1]
    assert last.kind == "assistant" and last.payload["text"] == "echo: message 6"
    assert conv.compactions == 1
    refused, retried = [r["messages"] for r in fake.requests if r.get("stream")][-2:]
    assert refused[-1] == retried[-1] == {"role": "user", "content": "message 6"}
    # the summary is in the system message: the conversation still alternates user/assistant
    assert SUMMARY_PREFIX in retried[0]["content"] and len(retried) < len(refused)
    roles = [m["role"] for m in retried[1:]]
    assert roles[0] == "user" and all(a != b for a, b in itertools.pairwise(roles))


def memory_rows(db: Path, cid: str) -> list[tuple[Any, ...]]:
    # cid: an id the server made (no quote in it)
    return rows(
        db,
        "SELECT order_idx, role, payload_json FROM working_memory "
        f"WHERE conversation_id = '{cid}' ORDER BY order_idx",
    )


class Client:
    """Turns through the HTTP API of ``agentik serve``, followed on the SSE stream."""

    def __init__(self, session: aiohttp.ClientSession, base: str, cid: str) -> None:
        self.session, self.base, self.cid = session, base, cid
        self.events: aiohttp.ClientResponse | None = None

    async def open(self) -> None:
        self.events = await self.session.get(f"{self.base}/agentik/conversations/{self.cid}/events")

    def send(self, text: str) -> Any:
        body = [{"type": "text", "body": text}]
        return self.session.post(
            f"{self.base}/agentik/conversations/{self.cid}/messages", json=body
        )

    async def turn(self, text: str) -> list[dict[str, Any]]:
        async with self.send(text) as r:
            assert r.status == 202, await r.text()
        assert self.events is not None
        return await read_sse(self.events, timeout=30)

    async def messages(self) -> list[dict[str, Any]]:
        url = f"{self.base}/agentik/conversations/{self.cid}/messages"
        async with self.session.get(url, params={"limit": "200"}) as r:
            return (await r.json())["items"]  # type: ignore[no-any-return]


async def test_serve_compacts_survives_a_failing_summary_and_a_kill(serve, tmp_path):
    model = Model()
    fake = FakeOpenAI(default=model)
    await fake.start()
    env = {
        "OPENAI_BASE_URL": fake.base_url,
        "OPENAI_API_KEY": "k",
        "OPENAI_MODEL": "fake",
        "OPENAI_CONTEXT_WINDOW": str(WINDOW),
        "OPENAI_MAX_RETRIES": "0",
        "AGENTIK_LOAD_PLUGINS": "agentik_compaction,agentik_llm_openai,agentik_transport_http",
    }
    db = tmp_path / "agentik.db"
    proc, base = serve(env)
    proc.wait_output(f"compaction: on at 80% of {WINDOW} tokens")
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{base}/agentik/conversations") as r:
                cid = (await r.json())["id"]
            client = Client(session, base, cid)
            await client.open()

            # 40 turns: every one succeeds, compactions come as events, the model always
            # gets the last 4 turns whole
            compacted = []
            for k in range(40):
                frames = await client.turn(f"message {k}")
                kinds = [f["event"] for f in frames]
                assert "Error" not in kinds and kinds[-1] == "End"
                compacted += [f["data"] for f in frames if f["event"] == "Compacted"]
            assert len(compacted) >= 2 and len(compacted) == len(model.summaries)
            assert all(c["tokensBefore"] > c["tokensAfter"] for c in compacted)
            check_last_turns_intact([r for r in fake.requests if r.get("stream")])
            history = await client.messages()
            assert [m["id"] for m in history if m["type"] == "summary"] == [
                c["summaryId"] for c in compacted
            ]

            # the summary call fails (HTTP 500): memory unchanged, the turn succeeds, a warning
            model.mode = "fail"
            k = 40
            while not model.failed:
                before = memory_rows(db, cid)
                frames = await client.turn(f"message {k}")
                assert "Error" not in [f["event"] for f in frames]
                k += 1
            assert memory_rows(db, cid)[: len(before)] == before
            assert "the summary call failed, working memory is unchanged" in proc.output
            assert len([m for m in await client.messages() if m["type"] == "summary"]) == len(
                compacted
            )

            # a slow summary call, and the server is killed in the middle of it
            model.mode = "slow"
            while True:
                before = memory_rows(db, cid)
                async with client.send(f"message {k}") as r:
                    assert r.status == 202
                assert client.events is not None
                ended = asyncio.ensure_future(read_sse(client.events, timeout=30))
                hanging = asyncio.ensure_future(model.hanging.wait())
                await asyncio.wait([ended, hanging], return_when=asyncio.FIRST_COMPLETED)
                if hanging.done():
                    ended.cancel()
                    break
                hanging.cancel()
                k += 1
            client.events.close()
        proc.stop(signal.SIGKILL)
        assert memory_rows(db, cid) == before  # the old memory, whole

        # restarted: the cut turn had recorded nothing, so it runs again (and compacts first,
        # the summary call answering now); the conversation goes on
        model.mode = "ok"
        proc, base = serve(env)
        async with aiohttp.ClientSession() as session:
            client = Client(session, base, cid)
            await client.open()

            async def summaries() -> int:
                return len([m for m in await client.messages() if m["type"] == "summary"])

            for _ in range(600):
                history = await client.messages()
                if history[-1]["type"] != "user":
                    break
                await asyncio.sleep(0.05)
            assert history[-1]["type"] == "assistant"  # the cut turn, run again
            assert [m["type"] for m in history].count("error") == 0
            for n in range(k + 1, k + 11):  # the rebuilt context is estimated, then counted
                if await summaries() > len(compacted):
                    break
                kinds = [f["event"] for f in await client.turn(f"message {n}")]
                assert "Error" not in kinds
            assert await summaries() > len(compacted)
            client.events.close() if client.events else None
        rows = memory_rows(db, cid)
        assert rows[0][1] == "summary" and [r[1] for r in rows].count("summary") == 1
    finally:
        await fake.close()
