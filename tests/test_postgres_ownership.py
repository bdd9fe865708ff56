"""Conversation ownership on PostgreSQL at the store's level (issue 26, item 2): an instance's
heartbeat, a lease with an epoch per conversation, writes fenced by the epoch, queued turns
claimed once. Each "instance" is a store of its own on one database, as two processes are."""

from __future__ import annotations

import asyncio

import pytest

from agentik.core.turns import TurnState, TurnUpdate
from tests.store_contract import conv, msg, send


@pytest.fixture
async def stores(postgres_url):
    from agentik.core.store.postgres import PgDatabase, PostgresStore

    opened = []

    async def start():
        store = PostgresStore(PgDatabase(postgres_url, exclusive=False))
        await store.open()
        opened.append(store)
        return store

    yield start
    for store in opened:
        await store.close()


async def test_a_lease_is_held_while_its_owner_beats_and_taken_over_after(stores):
    a, b = await stores(), await stores()
    await a.create_conversation(conv())
    await a.heartbeat("A", 0.5)
    await b.heartbeat("B", 30)
    first = await a.acquire("c1", "A")
    assert first is not None and first.epoch == 1
    assert (await a.acquire("c1", "A")).epoch == 1  # its own again: the same epoch
    assert await b.acquire("c1", "B") is None  # A is alive
    await asyncio.sleep(0.7)  # A's heartbeat expired
    taken = await b.acquire("c1", "B")
    assert taken is not None and taken.epoch == 2
    await a.heartbeat("A", 30)  # A comes back: the conversation is B's now
    assert await a.acquire("c1", "A") is None
    await b.release(taken)
    assert (await a.acquire("c1", "A")).epoch == 1  # released: a new lease


async def test_a_stale_owners_fenced_write_is_refused_and_stores_nothing(stores):
    from agentik.core.store.postgres import LeaseLost

    a, b = await stores(), await stores()
    await a.create_conversation(conv())
    await a.heartbeat("A", 0.3)
    await b.heartbeat("B", 30)
    lease_a = await a.acquire("c1", "A")
    await send(a, "u1")
    with a.fenced(lease_a):
        await a.append("c1", [msg("a1", "assistant")], turn_id="u1",
                       turn=TurnUpdate(TurnState.RUNNING, 1))  # fmt: skip
    await asyncio.sleep(0.5)
    lease_b = await b.acquire("c1", "B")
    assert lease_b is not None and lease_b.epoch == lease_a.epoch + 1
    with a.fenced(lease_a), pytest.raises(LeaseLost):  # A was stopped (SIGSTOP) and woke up
        await a.append("c1", [msg("a2", "assistant")], turn_id="u1",
                       turn=TurnUpdate(TurnState.DONE, 2))  # fmt: skip
    with a.fenced(lease_a), pytest.raises(LeaseLost):
        await a.fail_turn("c1", "u1", msg("e1", "error"))
    assert [m.id for m in await b.list_messages("c1", None, 0, 10)] == ["u1", "a1"]
    with b.fenced(lease_b):  # the new owner's writes go through
        await b.append("c1", [msg("a3", "assistant")], turn_id="u1",
                       turn=TurnUpdate(TurnState.DONE, 2))  # fmt: skip
    assert (await b.get_turn("u1")).state is TurnState.DONE
    await a.append("c1", [msg("x", "assistant")])  # an unfenced write (not a turn's) is taken


async def test_queued_turns_are_claimed_once_in_each_conversations_order(stores):
    instances = [await stores() for _ in range(3)]
    first = instances[0]
    for cid in ("a", "b", "c"):
        await first.create_conversation(conv(cid))
    for i in range(4):
        for cid in ("a", "b", "c"):
            await send(first, f"{cid}{i}", cid)
    for n, s in enumerate(instances):
        await s.heartbeat(f"I{n}", 30)
    claimed: list[tuple[str, str]] = []

    async def work(n: int) -> None:
        store, me = instances[n], f"I{n}"
        while True:
            got = await store.claim_turn(me)
            if got is None:
                if not await first.open_turns():
                    return
                await asyncio.sleep(0.01)
                continue
            turn, lease = got
            assert lease.owner == me and turn.state is TurnState.RUNNING
            claimed.append((turn.id, me))
            with store.fenced(lease):  # the turn runs, then ends
                await store.append(turn.user.conversation_id, [msg(f"r-{turn.id}", "assistant",
                                   cid=turn.user.conversation_id)], turn_id=turn.id,
                                   turn=TurnUpdate(TurnState.DONE, 1))  # fmt: skip

    await asyncio.wait_for(asyncio.gather(*(work(n) for n in range(3))), 30)
    ids = [t for t, _ in claimed]
    assert sorted(ids) == sorted(f"{c}{i}" for c in "abc" for i in range(4))  # each once
    for cid in "abc":  # each conversation's turns in order, all by its one owner
        mine = [(t, who) for t, who in claimed if t.startswith(cid)]
        assert [t for t, _ in mine] == [f"{cid}{i}" for i in range(4)]
        assert len({who for _, who in mine}) == 1
    assert await first.open_turns() == []


async def test_a_conversation_whose_owner_is_alive_is_not_claimed_by_another(stores):
    a, b = await stores(), await stores()
    await a.create_conversation(conv())
    await a.heartbeat("A", 30)
    await b.heartbeat("B", 30)
    assert await a.acquire("c1", "A") is not None
    await send(a, "u1")
    assert await b.claim_turn("B") is None  # A owns c1: its queue is A's to run
    turn, lease = await a.claim_turn("A")
    assert (turn.id, lease.owner) == ("u1", "A")


async def test_two_answers_to_one_step_through_two_instances_both_count(stores):
    """Each instance reads the waiting turn and adds its answer: in one transaction with the
    conversation's row locked, so the second sees the first's (never the last write wins)."""
    from agentik.core.turns import Wait

    a, b = await stores(), await stores()
    await a.create_conversation(conv())
    await send(a, "u1")
    waits = (Wait("c1", "approval"), Wait("c2", "approval"))
    await a.append("c1", turn_id="u1", turn=TurnUpdate(TurnState.WAITING, 1, waits))
    first, second = await asyncio.gather(
        a.answer_wait("c1", "u1", "c1", {"approve": True}),
        b.answer_wait("c1", "u1", "c2", {"approve": False}),
    )
    stored = await a.get_turn("u1")
    assert stored.state is TurnState.RUNNING
    assert [(w.call_id, w.answered) for w in stored.waits] == [("c1", True), ("c2", True)]
    assert {first.state, second.state} == {TurnState.WAITING, TurnState.RUNNING}


async def test_a_waiting_conversation_is_swept_only_when_its_owner_is_gone(stores):
    """A turn waits for an approval, a send is queued behind it: its live owner's sweep leaves
    it alone (the answer takes the queue up; a sweep refreshed it at every beat), another
    instance's too; once the owner is gone the sweep takes it up (free, it waits on)."""
    from agentik.core.turns import Wait

    a, b = await stores(), await stores()
    for cid in ("w", "q"):
        await a.create_conversation(conv(cid))
    await a.heartbeat("A", 0.5)
    await b.heartbeat("B", 30)
    lease = await a.acquire("w", "A")
    assert lease is not None and await a.acquire("q", "A") is not None
    await send(a, "u1", "w")
    waiting = TurnUpdate(TurnState.WAITING, 1, (Wait("k1", "approval"),))
    with a.fenced(lease):
        await a.append("w", turn_id="u1", turn=waiting)
    await send(a, "u2", "w")  # queued behind the waiting turn
    await send(a, "q1", "q")  # a queued turn alone: its holder's sweep takes it up
    assert await a.orphaned("A") == [("q", True)]
    assert await b.orphaned("B") == []  # A is alive
    await asyncio.sleep(0.7)  # A's heartbeat expired: gone
    assert sorted(await b.orphaned("B")) == [("q", False), ("w", False)]
    await a.heartbeat("A", 30)
    await a.release(lease)  # a stop hands it over: free (q is A's again), and it waits:
    assert await b.orphaned("B") == []  # the answer, through any instance, takes it up


async def test_a_delete_and_a_fenced_write_lock_the_lease_in_one_order(stores, postgres_url):
    """The owner's fenced write locks the lease (FOR SHARE), then the conversation's row (the
    foreign key of its message); a delete through another instance takes the lease's row
    first too, so it waits for that write instead of locking the conversation's row and then
    waiting for the lease (a deadlock, one of the two aborted by the server)."""
    import asyncpg

    from agentik.core.store.postgres import _FENCE, Shape

    a, b = await stores(), await stores()
    await a.create_conversation(conv())
    await a.heartbeat("A", 30)
    lease = await a.acquire("c1", "A")
    await send(a, "u1")
    writer = await asyncpg.connect(postgres_url)
    try:
        async with writer.transaction():  # the owner's fenced write, step by step
            assert await writer.fetch(Shape(_FENCE).sql, "c1", "A", lease.epoch)
            deleting = asyncio.create_task(b.delete_conversation("c1"))

            async def delete_waits() -> bool:  # for a lock of the writer's
                pid = writer.get_server_pid()
                return bool(await writer.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
                    pid))  # fmt: skip

            for _ in range(500):
                if await delete_waits() or deleting.done():
                    break
                await asyncio.sleep(0.01)
            await writer.execute(
                "INSERT INTO message (id, conversation_id, kind, turn_id, created_at, "
                "payload_json) VALUES ('a1', 'c1', 'assistant', 'u1', now()::text, '{}')"
            )
        assert await deleting is True
    finally:
        await writer.close()
    assert await a.get_conversation("c1") is None


async def test_a_free_lock_counts_as_gone_only_where_locks_are_trusted(stores):
    """The session that holds A's liveness lock ends while A's heartbeat is valid (its
    process died, or the server restarted and A has not beaten yet): a take that trusts locks
    takes A's lease; one made while the taker is quiet (its own connection was lost: every
    instance looks gone by its lock until it beats again) does not."""
    a, b = await stores(), await stores()
    await a.create_conversation(conv("c1"))
    await a.heartbeat("A", 30)
    await b.heartbeat("B", 30)
    assert await a.acquire("c1", "A") is not None
    a.db._beating.terminate()  # A's lock goes with that session
    await asyncio.sleep(0.1)
    assert await b.acquire("c1", "B", by_lock=False) is None  # A's heartbeat is valid
    taken = await b.acquire("c1", "B")
    assert taken is not None and taken.epoch == 2 and taken.inherited
