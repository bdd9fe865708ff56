"""Event streams: ordering, resume by id, the bounded buffer, slow and many readers."""

from __future__ import annotations

import asyncio

import pytest

from agentik.core.events import EventIds, EventLog, SharedEventLog, SharedEvents
from agentik.core.types import AppendText, End, Gap, UserMessage
from tests.conftest import ON_POSTGRES


async def read(log: EventLog, after: int | None, n: int) -> list:
    out = []
    async for item in log.subscribe(after):
        out.append(item)
        if len(out) == n:
            break
    return out


async def test_live_readers_get_events_after_they_subscribe():
    log = EventLog()
    log.publish(AppendText("before"))
    reader = asyncio.ensure_future(read(log, None, 2))
    await asyncio.sleep(0)
    log.publish(AppendText("a"))
    log.publish(End())
    got = await reader
    assert [i.event for i in got] == [AppendText("a"), End()]
    assert got[1].seq == got[0].seq + 1


async def test_resume_after_an_id_gets_every_missed_event_once_in_order():
    log = EventLog()
    seqs = [log.publish(AppendText(str(i))) for i in range(10)]
    got = await read(log, seqs[3], 6)
    assert [i.event.text for i in got] == ["4", "5", "6", "7", "8", "9"]


async def test_a_reader_behind_the_buffer_gets_a_gap_then_the_rest():
    log = EventLog(maxlen=4)
    seqs = [log.publish(AppendText(str(i))) for i in range(10)]
    got = await read(log, seqs[1], 5)
    assert isinstance(got[0].event, Gap) and got[0].event.after == seqs[1]
    assert [i.event.text for i in got[1:]] == ["6", "7", "8", "9"]


async def test_an_id_from_an_earlier_log_replays_the_whole_buffer():
    ids = EventIds()  # one agent's counter
    old = EventLog(ids=ids)
    stale = [old.publish(AppendText("old")) for _ in range(5000)][-100]  # the client's last
    log = EventLog(maxlen=4, ids=ids)  # the same stream after an eviction
    for i in range(3):
        log.publish(AppendText(str(i)))
    assert log.last_seq > stale
    got = await read(log, stale, 4)
    assert got[0].event == Gap(stale)  # the end of the old log is gone: read the history
    assert [i.event.text for i in got[1:]] == ["0", "1", "2"]


async def test_an_id_from_an_earlier_log_gets_a_gap_even_when_nothing_is_buffered():
    ids = EventIds()
    old = EventLog(ids=ids)
    stale = old.publish(AppendText("old"))
    old.publish(AppendText("lost with the old log"))
    log = EventLog(ids=ids)
    got = await read(log, stale, 1)
    assert got[0].event == Gap(stale)


async def test_logs_of_one_counter_start_above_every_id_issued():
    ids = EventIds(issued=1000)  # e.g. the mark a restart read from the store
    a, b = EventLog(ids=ids), EventLog(ids=ids)
    assert a.publish(End()) == 1001 and a.publish(End()) == 1002
    assert b.publish(End()) == 1001  # streams count on their own; ids are per stream
    assert EventLog(ids=ids).publish(End()) == 1003  # a new log: above all of them


async def test_an_id_above_the_highest_issued_gets_a_gap_and_the_buffer_never_silence():
    log = EventLog()
    for i in range(3):
        log.publish(AppendText(str(i)))
    too_high = log.last_seq + 10**9  # another server's id, or one from before a reset
    got = await read(log, too_high, 4)
    assert got[0].event == Gap(too_high)
    assert [i.event.text for i in got[1:]] == ["0", "1", "2"]
    # the Gap's id is one the client can resume from: nothing twice, nothing lost
    assert got[0].seq == got[1].seq - 1
    later = asyncio.ensure_future(read(log, log.last_seq + 5, 2))  # and with nothing buffered
    await asyncio.sleep(0)
    empty = EventLog()
    got = await read(empty, 7, 1)
    assert got[0].event == Gap(7) and got[0].seq == empty.last_seq
    log.publish(End())
    first, then = await asyncio.wait_for(later, 2)
    assert isinstance(first.event, Gap) and then.event == AppendText("0")


async def test_the_counter_asks_its_owner_for_a_new_mark_once_half_a_block_before_it():
    asked: list[int] = []
    ids = EventIds(refill=asked.append)
    ids.reserved(100, block=100)  # ids up to 100 are persisted as used
    log = EventLog(ids=ids)
    for _ in range(49):
        log.publish(End())
    assert asked == []
    for _ in range(10):  # past 50: asked once, not at every publish
        log.publish(End())
    assert asked == [50]
    ids.reserved(150, block=100)
    for _ in range(50):
        log.publish(End())
    assert asked == [50, 100]


async def test_readers_are_counted():
    log = EventLog()
    reader = asyncio.ensure_future(read(log, None, 1))
    await asyncio.sleep(0)
    assert log.readers == 1
    log.publish(End())
    await reader
    await asyncio.sleep(0)  # the abandoned generator is finalised by the loop
    assert log.readers == 0


async def test_a_slow_reader_never_blocks_the_publisher_or_others():
    log = EventLog(maxlen=100)
    fast = asyncio.ensure_future(read(log, None, 1000))
    stuck = log.subscribe(None)
    first = asyncio.ensure_future(stuck.__anext__())
    await asyncio.sleep(0)
    for i in range(1000):
        log.publish(AppendText(str(i)))  # never awaits
        if i % 50 == 0:
            await asyncio.sleep(0)
    assert len(await fast) == 1000
    got = [(await first).event]
    while getattr(got[-1], "text", None) != "999":
        got.append((await stuck.__anext__()).event)
    await stuck.aclose()
    # it fell behind: it is told so and skips ahead; nobody waited for it
    assert any(isinstance(e, Gap) for e in got)
    assert len(got) < 1000


async def test_two_hundred_subscribers_all_get_the_whole_turn():
    log = EventLog()
    readers = [asyncio.ensure_future(read(log, None, 51)) for _ in range(200)]
    await asyncio.sleep(0)
    for i in range(50):
        log.publish(AppendText(str(i)))
    log.publish(End())
    results = await asyncio.gather(*readers)
    assert all(
        [i.event for i in r] == [AppendText(str(i)) for i in range(50)] + [End()] for r in results
    )


async def test_close_ends_every_reader():
    log = EventLog()
    reader = asyncio.ensure_future(read(log, None, 5))
    await asyncio.sleep(0)
    log.publish(AppendText("x"))
    log.close()
    assert [i.event.text for i in await asyncio.wait_for(reader, 2)] == ["x"]


@pytest.mark.skipif(ON_POSTGRES, reason="ids from the database's sequence (test_postgres_events)")
async def test_the_agent_keeps_a_mark_ahead_of_its_ids_in_the_store(make_agent, tmp_path):
    from agentik.core.agent import EVENT_ID_BLOCK, EVENT_IDS

    agent = await make_agent(db=str(tmp_path / "ids.db"))
    assert int(await agent.store.read_state(EVENT_IDS)) == EVENT_ID_BLOCK
    for _ in range(EVENT_ID_BLOCK // 2 + 10):  # past half the block: one more write, no more
        agent.publish("ConversationUpdated", "c")
    await agent.jobs.wait_idle()
    mark = int(await agent.store.read_state(EVENT_IDS))
    assert mark == EVENT_ID_BLOCK // 2 + EVENT_ID_BLOCK
    issued = agent.last_event_id
    await agent.close()  # what a kill -9 would leave is the mark: a restart starts above it
    again = await make_agent(db=str(tmp_path / "ids.db"))
    assert again.last_event_id >= issued and again.last_event_id >= mark
    conv = await again.create_conversation()
    assert conv.last_event_id >= mark


class _Alone(SharedEvents):
    """A fake of the database's side (a unit test of SharedEventLog): nothing leaves."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int]] = []

    async def reserve_ids(self) -> int:
        return 0

    async def start(self, logs) -> int:
        return 0

    def put(self, stream, seq, event, turn_id) -> None:
        self.sent.append((stream, seq))

    async def last_seq(self, stream: str) -> int:
        return 0

    async def replay(self, stream: str, after: int):
        return None  # the database holds nothing: a Gap

    async def flush(self) -> None:
        pass

    async def close(self) -> None:
        pass


async def test_a_shared_log_keeps_relayed_ids_and_finds_a_readers_place_by_id():
    shared = _Alone()
    log = SharedEventLog(4, EventIds(), shared, "c1", 0)
    log.relay(90, AppendText("relayed while loading"))
    log.begin_at(100)  # the database's newest when it was loaded
    log.relay(100, AppendText("a repeat"))
    for seq in (101, 102):
        log.relay(seq, AppendText(str(seq)))
    log.skip_to(1000)  # this instance takes the conversation over
    assert log.publish(AppendText("mine")) == 1001 and shared.sent == [("c1", 1001)]
    assert [(i.seq, i.event.text) for i in await read(log, 101, 2)] == [
        (102, "102"),
        (1001, "mine"),
    ]
    for text in ("x", "y", "z"):
        log.publish(AppendText(text))  # the buffer of 4 drops 90, 101 and 102
    got = await read(log, 101, 5)
    assert got[0].event == Gap(101) and [i.seq for i in got[1:]] == [1001, 1002, 1003, 1004]
    assert [i.seq for i in await read(log, 102, 4)] == [1001, 1002, 1003, 1004]  # none lost


async def test_a_send_announced_by_its_owner_and_again_by_the_one_that_took_it_over_is_read_once():
    """An owner whose lease expired silently announces a send it took; the instance that
    took the conversation over announces it again when it takes up the queued turns (and a
    takeover announces every queued one): each reader gets it once."""
    shared = _Alone()
    log = SharedEventLog(16, EventIds(), shared, "c1", 0)
    log.relay(5, UserMessage(id="m1"))  # the old owner's announcement
    log.skip_to(1000)  # this instance takes the conversation over
    log.publish(UserMessage(id="m1"))  # ... and takes up the queued send
    log.publish(UserMessage(id="m2"))
    log.relay(1500, UserMessage(id="m2"))  # another instance's late copy
    log.publish(End())
    got = await read(log, 0, 3)
    assert [(i.seq, type(i.event).__name__) for i in got] == [
        (5, "UserMessage"),
        (1001, "UserMessage"),
        (1002, "End"),
    ]
    assert shared.sent == [("c1", 1001), ("c1", 1002)]
