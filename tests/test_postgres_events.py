"""Events across instances on one PostgreSQL database (issue 26, item 3): two agents' servers
on one schema, as two processes are; a turn runs on A, its events reach readers on B through
the event table, ids from A stay valid on B, and the agent-level stream has one order on
every instance. On the throwaway server of tests/postgres.py (skipped without PostgreSQL)."""

from __future__ import annotations

import asyncio

import pytest

from agentik.core.app import AGENT
from agentik.core.testing import ScriptedLLM, make_app, run_turn
from tests.conftest import read_sse

TEXT = [{"type": "text", "body": "hello"}]
TOKENS = [f"t{i} " for i in range(20)]


@pytest.fixture
async def instances(postgres_url, monkeypatch, aiohttp_client):
    """``start()``: the client of one more instance's server on the test's schema."""
    from agentik.core import app
    from agentik.core.store.postgres import PgDatabase, PostgresStore

    monkeypatch.setattr(
        app, "make_store", lambda settings: PostgresStore(PgDatabase(postgres_url, exclusive=False))
    )

    async def start():
        return await aiohttp_client(make_app(llm=ScriptedLLM(TOKENS)))

    return start


async def new_conv(client) -> str:
    r = await client.post("/agentik/conversations")
    assert r.status == 201
    return (await r.json())["id"]


async def send(client, cid: str) -> None:
    r = await client.post(f"/agentik/conversations/{cid}/messages", json=TEXT)
    assert r.status == 202, await r.text()


async def stream(client, cid: str, after: str | None = None):
    headers = {"Last-Event-ID": after} if after is not None else {}
    path = f"/agentik/conversations/{cid}/events" if cid else "/agentik/events"
    resp = await client.get(path, headers=headers)
    assert resp.status == 200
    return resp


async def test_a_reader_on_b_gets_a_turn_run_on_a_in_order_with_as_ids(instances):
    a, b = await instances(), await instances()
    cid = await new_conv(a)
    on_a, on_b = await stream(a, cid), await stream(b, cid)
    await send(a, cid)
    seen_a, seen_b = await read_sse(on_a), await read_sse(on_b)
    kinds = [f["event"] for f in seen_b]
    assert kinds == ["UserMessage", "StartResponse", *["AppendText"] * 20, "End"]
    assert seen_b == seen_a  # the same events with the same ids
    ids = [int(f["id"]) for f in seen_b]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert b.app[AGENT].shared_events.relayed >= len(seen_b)


async def test_a_last_event_id_from_a_resumes_on_b_without_loss_or_repeat(instances):
    a, b = await instances(), await instances()
    cid = await new_conv(a)
    on_a = await stream(a, cid)
    await send(a, cid)
    full = await read_sse(on_a)
    for cut in (full[5]["id"], full[0]["id"]):  # B loads the conversation, then holds it
        resumed = await stream(b, cid, cut)
        rest = await read_sse(resumed)
        resumed.close()
        cut_at = [f["id"] for f in full].index(cut)
        assert rest == full[cut_at + 1 :]


async def test_an_id_older_than_the_table_keeps_gets_a_gap(instances):
    a, b = await instances(), await instances()
    cid = await new_conv(a)
    on_a = await stream(a, cid)
    await send(a, cid)
    full = await read_sse(on_a)
    shared = a.app[AGENT].shared_events
    await shared.flush()
    shared.keep_seconds = 0.0  # the window closes on every row
    await shared.prune()
    resumed = await stream(b, cid, full[3]["id"])
    frames = await read_sse(resumed, until="Gap")
    assert frames[0]["data"] == {"type": "Gap", "after": int(full[3]["id"])}


async def test_the_agent_stream_has_one_order_on_every_instance(instances):
    a, b = await instances(), await instances()
    on_a, on_b = await stream(a, ""), await stream(b, "")
    cid = await new_conv(a)
    await send(a, cid)
    seen_a = await read_sse(on_a, until="TurnEnded")
    seen_b = await read_sse(on_b, until="TurnEnded")
    assert [f["event"] for f in seen_b] == [
        "ConversationCreated",
        "UserMessage",
        "ConversationUpdated",
        "TurnStarted",
        "TurnEnded",
    ]
    assert seen_b == seen_a and {f["data"]["conversationId"] for f in seen_b} == {cid}
    # an id from A's stream resumes on B: the rest, once
    resumed = await stream(b, "", seen_a[1]["id"])
    assert await read_sse(resumed, until="TurnEnded") == seen_a[2:]


async def test_ids_grow_across_a_takeover_and_an_id_from_the_old_owner_stays_valid(instances):
    a, b = await instances(), await instances()
    cid = await new_conv(a)
    on_a = await stream(a, cid)
    await send(a, cid)
    first = await read_sse(on_a)
    agent_b = b.app[AGENT]
    conv = await agent_b.get_conversation(cid)
    await agent_b.produce_events(conv)  # B takes the conversation over
    resumed = await stream(b, cid, first[-1]["id"])  # a client of A comes back through B
    turn = await run_turn(conv, "again")
    assert turn.text == "".join(TOKENS)
    second = await read_sse(resumed)
    assert second[0]["event"] == "UserMessage" and second[-1]["event"] == "End"
    assert min(int(f["id"]) for f in second) > max(int(f["id"]) for f in first)
    # and A's readers get B's events through A's relay
    assert await read_sse(on_a) == second


async def test_a_stopping_instance_sends_what_it_had_not_sent(instances):
    a, b = await instances(), await instances()
    cid = await new_conv(a)
    on_b = await stream(b, cid)
    shared = a.app[AGENT].shared_events
    await shared.flush()
    shared.interval = 60.0  # nothing goes out on its own
    sent = shared.batches
    await send(a, cid)
    await asyncio.wait_for(a.app[AGENT].live_conversation(cid).wait_idle(), 10)
    assert shared.batches == sent
    await a.close()
    assert [f["event"] for f in await read_sse(on_b)][-1] == "End"
