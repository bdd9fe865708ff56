"""Events across instances on one PostgreSQL database (issue 26, item 3): two agents' servers
on one schema, as two processes are; a turn runs on A, its events reach readers on B through
the event table, ids from A stay valid on B, and the agent-level stream has one order on
every instance. On the throwaway server of tests/postgres.py (skipped without PostgreSQL)."""

from __future__ import annotations

import asyncio

import pytest

from agentik.core.app import AGENT
from agentik.core.testing import ScriptedLLM, make_app, run_turn
from agentik.core.types import AppendText
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


async def first_turn(client):
    """A conversation with one turn run on ``client``'s instance: its id, a stream still open
    on it, and the turn's frames."""
    cid = await new_conv(client)
    events = await stream(client, cid)
    await send(client, cid)
    return cid, events, await read_sse(events)


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
    cid, _, full = await first_turn(a)
    for cut in (full[5]["id"], full[0]["id"]):  # B loads the conversation, then holds it
        resumed = await stream(b, cid, cut)
        rest = await read_sse(resumed)
        resumed.close()
        cut_at = [f["id"] for f in full].index(cut)
        assert rest == full[cut_at + 1 :]


async def test_an_id_older_than_the_table_keeps_gets_a_gap(instances):
    a, b = await instances(), await instances()
    cid, _, full = await first_turn(a)
    shared = a.app[AGENT].shared_events
    await shared.flush()
    persistence = "SELECT relpersistence::text FROM pg_class WHERE oid = 'agentik_event'::regclass"
    assert await shared.db.read(lambda: shared.db.execute(persistence).fetchone()[0]) == "u"
    count = "SELECT count(*) FROM agentik_event"
    shared.keep_rows = 5  # beyond a count
    await shared.prune()
    assert await shared.db.read(lambda: shared.db.execute(count).fetchone()[0]) <= 5
    shared.keep_seconds = 0.0  # and by age: the window closes on every row
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
    cid, on_a, first = await first_turn(a)
    agent_a, agent_b = a.app[AGENT], b.app[AGENT]
    lease = agent_a.ownership.leases.pop(cid)  # A gives the conversation up (its readers stay)
    await agent_a.store.release(lease)
    conv = await agent_b.get_conversation(cid)
    resumed = await stream(b, cid, first[-1]["id"])  # a client of A comes back through B
    turn = await run_turn(conv, "again")  # B takes it over
    assert agent_b.ownership.owns(cid) and turn.text == "".join(TOKENS)
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


async def test_a_send_through_b_runs_on_its_owner_a_and_b_streams_it(instances):
    a, b = await instances(), await instances()
    cid, on_a, _ = await first_turn(a)  # A ran it: A owns the conversation now
    await a.app[AGENT].shared_events.flush()  # B's "from now on" is what the table holds
    on_b = await stream(b, cid)
    await send(b, cid)  # stored through B; A announces and runs it
    seen_b, seen_a = await read_sse(on_b), await read_sse(on_a)
    kinds = [f["event"] for f in seen_b]
    assert kinds[:2] == ["UserMessage", "StartResponse"] and kinds[-1] == "End"
    assert seen_b[0]["data"]["via"] == {"transport": "http"}
    assert seen_b == seen_a
    assert a.app[AGENT].ownership.owns(cid) and not b.app[AGENT].ownership.owns(cid)


async def test_agent_events_of_two_producers_come_in_one_order_everywhere(instances):
    a, b = await instances(), await instances()
    on_a, on_b = await stream(a, ""), await stream(b, "")
    made = await asyncio.gather(*(new_conv(c) for _ in range(6) for c in (a, b)))

    async def created(resp) -> list[dict]:
        frames: list[dict] = []
        while len(frames) < len(made):
            frames += await read_sse(resp, until="ConversationCreated")
        return frames

    seen_a, seen_b = await created(on_a), await created(on_b)
    assert seen_a == seen_b
    assert sorted(f["data"]["conversationId"] for f in seen_a) == sorted(made)
    ids = [int(f["id"]) for f in seen_a]
    assert ids == sorted(ids)


async def test_events_published_while_the_database_restarts_reach_the_other_instance():
    """A batch the server refused goes out again once it is back, in order; the other
    instance's listener, opened again, reads what it missed."""
    from agentik.core.agent import ChatAgent
    from agentik.core.store.postgres import PgDatabase, PostgresStore
    from tests.postgres import start_server

    server = start_server()
    if isinstance(server, str):
        pytest.skip(server)
    url, agents = server.fresh_url(), []
    try:
        for _ in range(2):
            agent = ChatAgent(store=PostgresStore(PgDatabase(url)), llm=ScriptedLLM())
            await agent.open()
            agents.append(agent)
        conv = await agents[0].create_conversation()
        follower = await agents[1].get_conversation(conv.id)
        texts = [f"before{i}" for i in range(3)] + [f"during{i}" for i in range(3)]
        got: list[str] = []

        async def read() -> None:
            async for event in follower.events():
                got.append(event.text)
                if len(got) == len(texts):
                    return

        reader = asyncio.ensure_future(read())
        await asyncio.sleep(0)
        for text in texts[:3]:
            conv.log.publish(AppendText(text))
        restart = asyncio.ensure_future(asyncio.to_thread(server.restart))
        await asyncio.sleep(0.05)  # going down
        for text in texts[3:]:
            conv.log.publish(AppendText(text))
        await restart
        await asyncio.wait_for(reader, 30)
        assert got == texts
    finally:
        for agent in agents:
            await agent.close()
        server.stop()


async def test_an_instance_that_holds_nothing_of_a_batch_skips_it_unread(instances):
    """With the consistent hash a conversation lives on its owner: the others, holding none
    of its batches' streams and with nobody reading the agent stream, read none of them; the
    agent stream's log moves past them all the same, so a reader that comes to B then starts
    at the newest agent-level event, and one resuming from an older id reads it from the
    table."""
    a, b = await instances(), await instances()
    shared_b = b.app[AGENT].shared_events
    on_a = await stream(a, "")
    reads = shared_b.reads
    cid, _, _ = await first_turn(a)
    turn = await read_sse(on_a, until="TurnEnded")
    await a.app[AGENT].shared_events.flush()
    await asyncio.sleep(0.2)  # the notifications reached B
    assert shared_b.reads == reads  # none of A's batches was read on B
    on_b = await stream(b, "")  # from now on
    await send(a, cid)
    second = await read_sse(on_b, until="TurnEnded")
    assert second == await read_sse(on_a, until="TurnEnded")  # no Gap, nothing older
    resumed = await stream(b, "", turn[0]["id"])
    assert await read_sse(resumed, until="TurnEnded") == turn[1:]
    resumed.close()
    # B holds the conversation now (a reader of it): A's next batches are read there
    on_b_conv = await stream(b, cid)
    await send(a, cid)
    assert [f["event"] for f in await read_sse(on_b_conv)][-1] == "End"
    assert shared_b.reads > reads


async def test_a_conversation_held_where_nobody_reads_it_has_its_batches_skipped(instances):
    """The create went to B (it holds the conversation), its turns run on A: with nobody
    reading it on B, B reads none of A's batches, and its log moves past them (their newest
    ids are in the notification): a reader that comes to B from now on gets the next turn and
    nothing older, one resuming from an id of the skipped turn reads the rest from the table."""
    a, b = await instances(), await instances()
    shared_b = b.app[AGENT].shared_events
    cid = await new_conv(b)
    on_a = await stream(a, cid)
    reads = shared_b.reads
    await send(a, cid)
    turn = await read_sse(on_a)
    await a.app[AGENT].shared_events.flush()
    await asyncio.sleep(0.2)  # the notifications reached B
    assert shared_b.reads == reads  # held there, read by nobody: skipped
    on_b = await stream(b, cid)  # from now on
    await send(a, cid)
    second = await read_sse(on_b)
    assert second == await read_sse(on_a)  # no Gap, nothing of the first turn
    resumed = await stream(b, cid, turn[0]["id"])
    assert await read_sse(resumed) == turn[1:]
    resumed.close()


async def test_one_batch_at_a_time_whoever_sends_it(instances):
    """A flush asked for (a hand-off, a reader of the agent stream from now on) and the
    timer's next batch never go out together: two in flight could commit out of order, and
    the other instances would drop the earlier one's events as repeats."""
    shared = (await instances()).app[AGENT].shared_events
    send_batch = shared._flush
    flying = peak = 0

    async def slow_batch() -> None:  # a slow database: the timer's next batch falls due
        nonlocal flying, peak
        flying += 1
        peak = max(peak, flying)
        try:
            await asyncio.sleep(0.05)
            await send_batch()
        finally:
            flying -= 1

    shared._flush = slow_batch
    shared.put("c", 1, AppendText("first"), None)
    asked = asyncio.ensure_future(shared.flush())
    await asyncio.sleep(0.01)
    shared.put("c", 2, AppendText("second"), None)  # its batch waits for the first
    await asked
    await asyncio.sleep(0.15)  # the timer sent the second
    assert peak == 1
    after_first = await shared.replay("c", 1)  # None: the first is not in the table
    assert after_first is not None and [i.event.text for i in after_first] == ["second"]
