"""Many agentik instances on one PostgreSQL schema (issue 26, items 2 and 4): each a real app
with its HTTP API on loopback, in this test process. A conversation's turns run on the instance
that holds its lease, one at a time, in the order they were stored, whichever instance took the
send; another takes over when its owner stops beating, stops, or is told (interrupt, approval,
delete, rename) through any instance."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from agentik.core.app import AGENT
from agentik.core.llm import LLMChunk, LLMInput, TextDelta, ToolCallRequest, UserInput
from agentik.core.records import new_id, utcnow
from agentik.core.testing import ScriptedConversation, ScriptedLLM, make_app
from agentik.core.tools import tool
from agentik.core.types import AgentEvent, Message
from agentik.hookspecs import hookimpl
from tests.conftest import read_sse, wait_until

TEXT = {"content": [{"type": "text", "body": "hi"}]}


class Room:
    """What the instances' models share: which turns run now (at most one per conversation)."""

    def __init__(self) -> None:
        self.running: dict[str, str] = {}  # conversation's text -> instance
        self.overlaps: list[str] = []
        self.ran: list[tuple[str, str]] = []  # (user text, instance)
        self.hang: set[str] = set()  # user texts whose model call hangs
        self.release = asyncio.Event()


class RoomLLM(ScriptedLLM):
    """Echoes ``echo: <text>`` a little slowly, noting who runs what; hangs on a text in
    ``room.hang`` until ``room.release`` is set."""

    def __init__(self, room: Room, name: str, *steps: Any) -> None:
        super().__init__(*steps)
        self.room, self.name = room, name

    def create_conversation(self, system_prompt, history, tools):  # type: ignore[no-untyped-def]
        return RoomConversation(self, history)


class RoomConversation(ScriptedConversation):
    backend: RoomLLM

    async def stream(self, inputs: Sequence[LLMInput]) -> AsyncIterator[LLMChunk]:
        room, me = self.backend.room, self.backend.name
        # the user's text (after what before_turn put before it); "" after tool results
        text = inputs[0].text if inputs and isinstance(inputs[0], UserInput) else ""
        text = text.rsplit("\n\n", 1)[-1]
        if "tool" in room.running:
            room.overlaps.append(text)
        room.running["tool"] = me
        try:
            room.ran.append((text, me))
            if text in room.hang:
                await room.release.wait()
            if self.backend.steps:
                step = self.backend.steps.pop(0)
                for chunk in step:  # type: ignore[union-attr]
                    await asyncio.sleep(0.01)
                    yield TextDelta(chunk) if isinstance(chunk, str) else chunk
                return
            await asyncio.sleep(0.02)
            yield TextDelta(f"echo: {text}")
        finally:
            room.running.pop("tool", None)


@pytest.fixture
async def instances(postgres_url, aiohttp_client):
    """start(name, **env) -> (client, agent): an instance on the test's schema."""
    room = Room()

    async def start(
        name: str,
        *steps: Any,
        plugins: Sequence[Any] = (),
        builtins: Sequence[str] = ("agentik_transport_http",),
        **env: str,
    ):
        app = make_app(
            llm=RoomLLM(room, name, *steps),
            plugins=plugins,
            builtins=builtins,
            env={"AGENTIK_DATABASE_URL": postgres_url, **env},
        )
        client = await aiohttp_client(app)
        return client, app[AGENT]

    start.room = room  # type: ignore[attr-defined]
    return start


async def new_conversation(client) -> str:
    return (await (await client.post("/agentik/conversations")).json())["id"]


async def send(client, cid: str, text: str) -> dict[str, Any]:
    body = {"content": [{"type": "text", "body": text}]}
    r = await client.post(f"/agentik/conversations/{cid}/messages", json=body)
    assert r.status == 202, await r.text()
    return await r.json()


async def history(client, cid: str) -> list[dict[str, Any]]:
    r = await client.get(f"/agentik/conversations/{cid}/messages", params={"limit": "200"})
    assert r.status == 200
    return (await r.json())["items"]


async def replies(client, cid: str, n: int, timeout: float = 20) -> list[dict[str, Any]]:
    async def done():
        items = await history(client, cid)
        return items if sum(m["type"] in ("assistant", "error") for m in items) >= n else None

    found = None
    for _ in range(int(timeout / 0.05)):
        found = await done()
        if found:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"not {n} replies: {await history(client, cid)}")


def text_of(m: dict[str, Any]) -> str:
    return m.get("text") or "".join(p.get("body", "") for p in m.get("content", []))


def texts(items: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["type"], text_of(m)) for m in items if m["type"] in ("user", "assistant")]


async def test_several_instances_start_on_one_schema_and_each_beats(instances):
    (a_client, a), (b_client, b) = await instances("A"), await instances("B")
    assert a.instance_id != b.instance_id and a.ownership.shared
    cid = await new_conversation(b_client)
    await send(b_client, cid, "hello")
    items = await replies(a_client, cid, 1)
    assert texts(items) == [("user", "hello"), ("assistant", "echo: hello")]


async def test_two_sends_through_two_instances_run_one_at_a_time_in_order(instances):
    (a_client, a), (b_client, b) = await instances("A"), await instances("B")
    room = instances.room
    cid = await new_conversation(a_client)
    await send(a_client, cid, "first")  # A takes the lease: it owns the conversation
    await send(b_client, cid, "second")  # stored by B, run by A
    items = await replies(a_client, cid, 2)
    said = texts(items)
    assert [t for t in said if t[0] == "user"] == [("user", "first"), ("user", "second")]
    assert [t for t in said if t[0] == "assistant"] == [
        ("assistant", "echo: first"), ("assistant", "echo: second")
    ]  # fmt: skip
    assert room.overlaps == [] and room.ran == [("first", "A"), ("second", "A")]
    assert a.ownership.owns(cid) and not b.ownership.owns(cid)


async def test_twenty_sends_spread_over_three_instances_run_in_order_each_once(instances):
    started = [await instances(name) for name in "ABC"]
    room = instances.room
    cid = await new_conversation(started[0][0])
    sent = []
    for i in range(20):
        client = started[i % 3][0]
        sent.append((await send(client, cid, f"m{i}"))["id"])
    items = await replies(started[1][0], cid, 20, timeout=40)
    users = [m["id"] for m in items if m["type"] == "user"]
    assert users == sent  # stored in the order they were acknowledged
    assert [t for t, _ in room.ran] == [f"m{i}" for i in range(20)]  # each once, in order
    assert room.overlaps == []
    answers = [m["text"] for m in items if m["type"] == "assistant"]
    assert answers == [f"echo: m{i}" for i in range(20)]
    assert len({who for _, who in room.ran}) == 1  # one owner ran them all


async def test_an_owner_that_stops_beating_is_taken_over_and_its_late_write_refused(instances):
    room = instances.room
    a_client, a = await instances("A", AGENTIK_LEASE_TTL="0.6")
    b_client, b = await instances("B", AGENTIK_LEASE_TTL="0.6")
    cid = await new_conversation(a_client)
    room.hang.add("stuck")
    await send(a_client, cid, "stuck")
    await wait_until(lambda: ("stuck", "A") in room.ran)
    # A hangs (SIGSTOP): its heartbeat stops; B's sweeper takes the conversation over
    for task in a.jobs._periodic:
        task.cancel()
    room.hang.discard("stuck")
    await wait_until(lambda: ("stuck", "B") in room.ran, timeout=10)
    items = await replies(b_client, cid, 1)
    assert texts(items) == [("user", "stuck"), ("assistant", "echo: stuck")]
    room.release.set()  # A wakes up: its late reply is refused, it drops the conversation
    await wait_until(lambda: a.live_conversation(cid) is None, timeout=5)
    await asyncio.sleep(0.2)
    assert texts(await history(b_client, cid)) == texts(items)  # one reply: B's
    assert b.ownership.owns(cid) and not a.ownership.owns(cid)


async def test_interrupt_through_a_non_owner_reaches_the_owners_turn(instances):
    room = instances.room
    a_client, _a = await instances("A")
    b_client, _b = await instances("B")
    cid = await new_conversation(a_client)
    room.hang.add("long")
    await send(a_client, cid, "long")
    await wait_until(lambda: ("long", "A") in room.ran)
    r = await b_client.get(f"/agentik/conversations/{cid}")
    assert (await r.json())["busy"] is True  # from the turn table: A runs it
    listed = (await (await b_client.get("/agentik/conversations")).json())["items"]
    assert [c["busy"] for c in listed if c["id"] == cid] == [True]
    r = await b_client.post(f"/agentik/conversations/{cid}/interrupt")
    assert (await r.json())["interrupted"] is True
    items = await replies(b_client, cid, 1)
    assert items[-1]["type"] == "assistant" and items[-1].get("interrupted") is True
    r = await b_client.get(f"/agentik/conversations/{cid}")
    assert (await r.json())["busy"] is False


class Tools:
    def __init__(self) -> None:
        self.ran: list[str] = []

    @hookimpl
    def register_tools(self, register: Any) -> None:
        def launch(target: str) -> str:
            """Launch at a target."""
            self.ran.append(f"launch {target}")
            return f"launched at {target}"

        register(tool(launch, name="guarded", requires_approval=True))


async def test_an_approval_through_a_non_owner_lets_the_owner_go_on(instances):
    room = instances.room
    tools = Tools()
    call = ToolCallRequest("c1", "guarded", json.dumps({"target": "moon"}))
    plugins = [("tools", tools), ("approvals", __import__("agentik_approvals"))]
    a_client, _a = await instances("A", [call], ["landed"], plugins=plugins)
    b_client, _b = await instances("B", plugins=plugins)
    cid = await new_conversation(a_client)
    await send(a_client, cid, "go")

    async def pending():
        r = await b_client.get(f"/agentik/conversations/{cid}/approvals")
        return (await r.json())["items"]

    items: list[Any] = []
    for _ in range(200):
        items = await pending()
        if items:
            break
        await asyncio.sleep(0.05)
    assert [i["callId"] for i in items] == ["c1"]
    r = await b_client.post(f"/agentik/conversations/{cid}/approvals/c1", json={"approve": True})
    assert r.status == 200, await r.text()
    done = await replies(a_client, cid, 1)
    assert done[-1]["type"] == "assistant" and done[-1]["text"] == "landed"
    assert tools.ran == ["launch moon"]
    assert [who for _, who in room.ran] == ["A", "A"]  # the owner went on with it


async def test_delete_and_rename_through_one_instance_reach_the_others(instances):
    a_client, a = await instances("A")
    b_client, b = await instances("B")
    cid = await new_conversation(a_client)
    await send(a_client, cid, "hi")
    await replies(a_client, cid, 1)
    await history(b_client, cid)  # B holds a copy in memory too
    assert b.live_conversation(cid) is not None
    r = await b_client.patch(f"/agentik/conversations/{cid}", json={"title": "renamed"})
    assert r.status == 200
    await wait_until(lambda: a.live_conversation(cid).title == "renamed")
    r = await b_client.delete(f"/agentik/conversations/{cid}")
    assert r.status == 204
    await wait_until(lambda: a.live_conversation(cid) is None)
    assert (await a_client.get(f"/agentik/conversations/{cid}")).status == 404
    assert not a.ownership.owns(cid)


async def busy_in_list(client, cid: str) -> bool:
    listed = (await (await client.get("/agentik/conversations")).json())["items"]
    (busy,) = [c["busy"] for c in listed if c["id"] == cid]
    return bool(busy)


async def test_a_non_owners_list_says_busy_from_the_store_not_from_its_copy(instances):
    """B loads the conversation (a reader) while A runs its turn, past its tool's step: B's
    copy holds the turn as it was then. B's list says busy from the turn table, not from that
    copy, so it says idle once A's turn ends (the copy said busy for as long as it lived)."""
    room = instances.room
    tools = Tools()
    call = ToolCallRequest("c1", "guarded", json.dumps({"target": "moon"}))
    a_client, a = await instances("A", [call], plugins=[("tools", tools)])
    b_client, b = await instances("B", plugins=[("tools", tools)])
    cid = await new_conversation(a_client)
    room.hang.add("")  # the model's call after the tool's result hangs
    await send(a_client, cid, "go")
    await wait_until(lambda: ("", "A") in room.ran)
    await history(b_client, cid)  # B holds a copy in memory now
    assert b.live_conversation(cid) is not None and not b.ownership.owns(cid)
    assert await busy_in_list(b_client, cid) is True
    room.release.set()
    await replies(a_client, cid, 1)
    await wait_until(lambda: not a.is_busy(cid))
    assert await busy_in_list(b_client, cid) is False
    assert await busy_in_list(a_client, cid) is False


async def test_a_rename_through_a_non_owner_says_busy_from_the_store(instances):
    """A runs a turn (its first model call: the turn table says queued); a rename through B,
    which loads the conversation then, answers busy from the turn table, during the turn and
    after it."""
    room = instances.room
    a_client, _a = await instances("A")
    b_client, b = await instances("B")
    cid = await new_conversation(a_client)
    room.hang.add("long")
    await send(a_client, cid, "long")
    await wait_until(lambda: ("long", "A") in room.ran)
    r = await b_client.patch(f"/agentik/conversations/{cid}", json={"title": "during"})
    assert r.status == 200 and (await r.json())["busy"] is True
    assert not b.ownership.owns(cid)
    room.release.set()
    await replies(a_client, cid, 1)
    r = await b_client.patch(f"/agentik/conversations/{cid}", json={"title": "after"})
    assert r.status == 200 and (await r.json())["busy"] is False


async def test_a_stop_hands_its_running_turn_to_another_instance(instances):
    """A stop (SIGTERM) cuts the running turn as a crash would and releases its lease: another
    instance resumes it from its last recorded step (the tool's result), and it ends once."""
    room = instances.room
    call = ToolCallRequest("c1", "guarded", json.dumps({"target": "moon"}))
    tools = Tools()
    a_client, _a = await instances("A", [call], plugins=[("tools", tools)])
    b_client, _b = await instances("B", plugins=[("tools", tools)])
    cid = await new_conversation(a_client)
    room.hang.add("")  # the model's call after the tool's result hangs
    await send(a_client, cid, "go")
    await wait_until(lambda: ("", "A") in room.ran)
    await a_client.close()  # the stop hands the turn over
    await wait_until(lambda: ("", "B") in room.ran, timeout=10)
    room.release.set()
    items = await replies(b_client, cid, 1)
    assert [m["type"] for m in items] == ["user", "tool_call", "tool_result", "assistant"]
    assert tools.ran == ["launch moon"]  # recorded before the stop: never again
    assert [who for _, who in room.ran] == ["A", "A", "B"]


async def test_a_killed_owners_turn_is_taken_over_before_its_heartbeat_expires(instances):
    """kill -9: the server drops the dead instance's session lock at once, so the sweeper
    (every third of the lease's 10 s) takes its conversation without waiting for the lease."""
    room = instances.room
    a_client, a = await instances("A")
    b_client, _b = await instances("B")
    cid = await new_conversation(a_client)
    room.hang.add("stuck")
    await send(a_client, cid, "stuck")
    await wait_until(lambda: ("stuck", "A") in room.ran)
    a.store.db.terminate()  # the process dies: nothing more of it reaches the server
    for task in a.jobs._periodic:
        task.cancel()
    room.hang.discard("stuck")
    await wait_until(lambda: ("stuck", "B") in room.ran, timeout=8)
    items = await replies(b_client, cid, 1)
    assert texts(items) == [("user", "stuck"), ("assistant", "echo: stuck")]


async def test_a_cancel_through_a_non_owner_goes_to_the_owner(instances):
    """A turn is recorded running only at its first step: while the owner's first model call
    runs, the table still says queued. A cancel through another instance asks the owner, which
    refuses it for the turn it runs (it ends once, with its reply and one End) and cancels the
    one still in its queue (never run: it ends with its Error and End)."""
    room = instances.room
    a_client, a = await instances("A")
    b_client, b = await instances("B")
    cid = await new_conversation(a_client)
    room.hang.add("first")
    first = await send(a_client, cid, "first")
    await wait_until(lambda: ("first", "A") in room.ran)
    second = await send(b_client, cid, "second")
    third = await send(a_client, cid, "third")
    on_a = a.live_conversation(cid)
    assert on_a is not None
    ends: list[str | None] = []
    reader = on_a.event_items()

    async def read() -> None:
        async for item in reader:
            if item.event.type == "End":
                ends.append(item.turn_id)

    reading = asyncio.create_task(read())
    conv_b = await b.get_conversation(cid)
    assert conv_b is not None and not b.ownership.owns(cid)
    assert (await conv_b.turn(first["id"])).state.value == "queued"  # (its first model call)
    assert await conv_b.cancel_queued(first["id"]) is False  # A runs it
    assert await conv_b.cancel_queued(second["id"]) is True  # still queued on A
    room.release.set()
    items = await replies(b_client, cid, 3)
    assert texts(items) == [
        ("user", "first"),
        ("user", "second"),
        ("user", "third"),
        ("assistant", "echo: first"),
        ("assistant", "echo: third"),
    ]
    assert [m.get("code") for m in items if m["type"] == "error"] == ["cancelled"]
    assert [t for t, _ in room.ran] == ["first", "third"]
    assert (await conv_b.turn(first["id"])).state.value == "done"
    await wait_until(lambda: len(ends) >= 2)
    await asyncio.sleep(0.2)
    reading.cancel()
    # the cancelled one ends at once with its Error and End (a follower elsewhere settles)
    assert ends == [second["id"], first["id"], third["id"]]


async def test_a_starting_instance_does_not_follow_an_a2a_task_another_runs(
    instances, postgres_url, aiohttp_client
):
    """A2A's recover() runs on every instance that starts: a task whose conversation another
    live instance runs is followed there, not a second time by the new one (two followers
    both recorded its end)."""
    from tests.test_a2a import BUILTINS, rpc, text_message

    room = instances.room
    room.hang.add("long")

    async def a2a_instance(name: str):
        app = make_app(llm=RoomLLM(room, name), builtins=BUILTINS,
                       env={"AGENTIK_DATABASE_URL": postgres_url})  # fmt: skip
        return await aiohttp_client(app), app[AGENT]

    a_client, _a = await a2a_instance("A")
    params = {"message": text_message("long"), "configuration": {"returnImmediately": True}}
    task = (await rpc(a_client, "SendMessage", params))["result"]["task"]
    await wait_until(lambda: ("long", "A") in room.ran)
    _b_client, b = await a2a_instance("B")
    tasks_b = b.state["agentik_transport_a2a"]
    followed = tasks_b._service.runs if tasks_b._service is not None else {}
    assert task["id"] not in followed
    room.release.set()

    for _ in range(200):  # its follower on A records its end
        got = (await rpc(a_client, "GetTask", {"id": task["id"]}))["result"]
        if got["status"]["state"] == "TASK_STATE_COMPLETED":
            break
        await asyncio.sleep(0.05)
    assert got["status"]["state"] == "TASK_STATE_COMPLETED"


async def test_a_task_whose_follower_is_gone_is_settled_by_another_instance(
    instances, postgres_url, aiohttp_client, monkeypatch
):
    """An A2A task is followed by the instance it was sent through; when that one is gone (its
    follower cancelled, as by its death) while the conversation's owner runs the turn, one of
    the instances records the task's end from the audit log."""
    import agentik_transport_a2a
    from tests.test_a2a import BUILTINS, rpc, text_message

    monkeypatch.setattr(agentik_transport_a2a, "ORPHANS_EVERY", 0.2)
    monkeypatch.setattr(agentik_transport_a2a, "ORPHAN_GRACE", 0.0)
    room = instances.room
    room.hang.add("second")

    async def a2a_instance(name: str):
        app = make_app(llm=RoomLLM(room, name), builtins=BUILTINS,
                       env={"AGENTIK_DATABASE_URL": postgres_url})  # fmt: skip
        return await aiohttp_client(app), app[AGENT]

    b_client, _b = await a2a_instance("B")
    first = (await rpc(b_client, "SendMessage", {"message": text_message("first")}))["result"]
    context = first["task"]["contextId"]
    await wait_until(lambda: ("first", "B") in room.ran)  # B owns the conversation now
    a_client, a = await a2a_instance("A")
    params = {
        "message": text_message("second", contextId=context),
        "configuration": {"returnImmediately": True},
    }
    task = (await rpc(a_client, "SendMessage", params))["result"]["task"]
    await wait_until(lambda: ("second", "B") in room.ran)  # its owner runs it, A follows it
    await a.state["agentik_transport_a2a"].close()  # A's follower is gone
    room.release.set()

    for _ in range(200):
        got = (await rpc(b_client, "GetTask", {"id": task["id"]}))["result"]
        if got["status"]["state"] == "TASK_STATE_COMPLETED":
            break
        await asyncio.sleep(0.05)
    assert got["status"]["state"] == "TASK_STATE_COMPLETED"
    assert got["artifacts"][0]["parts"][0]["text"] == "echo: second"


async def test_a_database_restart_does_not_make_live_instances_take_each_others_turns(
    aiohttp_client,
):
    """A restart of the server frees every instance's lock until its next beat: an instance
    that swept as soon as it was back would take the live others' conversations (their turns
    redone, non-idempotent calls cut). None is taken: the owner finishes its turn."""
    from tests.postgres import start_server

    server = start_server()
    if isinstance(server, str):
        pytest.skip(server)
    url = server.fresh_url()
    room = Room()
    clients = []

    async def start(name: str):
        env = {"AGENTIK_DATABASE_URL": url, "AGENTIK_LEASE_TTL": "1.5"}
        app = make_app(llm=RoomLLM(room, name), env=env)
        clients.append(await aiohttp_client(app))
        return clients[-1], app[AGENT]

    try:
        a_client, a = await start("A")
        _b_client, b = await start("B")
        cid = await new_conversation(a_client)
        room.hang.add("long")
        await send(a_client, cid, "long")
        await wait_until(lambda: ("long", "A") in room.ran)
        await asyncio.to_thread(server.restart)
        await asyncio.sleep(3)  # six beats: each instance swept after it beat again
        assert ("long", "B") not in room.ran and not b.ownership.owns(cid)
        room.release.set()
        items = await replies(a_client, cid, 1, timeout=20)
        assert texts(items) == [("user", "long"), ("assistant", "echo: long")]
        assert a.ownership.owns(cid)
    finally:
        for client in clients:  # before their database goes
            await client.close()
        server.stop()


async def test_an_approval_through_an_instance_that_saw_the_turn_run_runs_the_tool(instances):
    """B loaded the conversation while A ran its turn; the turn then waits for an approval, A
    stops (its lease is handed over), and the user approves through B: B takes the turn up
    as the answer says (the approved tool runs), not as a turn a crash cut."""
    room = instances.room
    tools = Tools()
    call = ToolCallRequest("c1", "guarded", json.dumps({"target": "moon"}))
    plugins = [("tools", tools), ("approvals", __import__("agentik_approvals"))]
    a_client, _a = await instances("A", [call], plugins=plugins)
    b_client, b = await instances("B", ["landed"], plugins=plugins)
    cid = await new_conversation(a_client)
    room.hang.add("go")
    await send(a_client, cid, "go")
    await wait_until(lambda: ("go", "A") in room.ran)
    await history(b_client, cid)  # B loads it while A runs the turn
    assert b.live_conversation(cid) is not None
    room.release.set()

    async def pending():
        r = await b_client.get(f"/agentik/conversations/{cid}/approvals")
        return (await r.json())["items"]

    items: list[Any] = []
    for _ in range(200):
        items = await pending()
        if items:
            break
        await asyncio.sleep(0.05)
    assert [i["callId"] for i in items] == ["c1"]
    await a_client.close()  # A stops: the waiting turn's lease is handed over
    r = await b_client.post(f"/agentik/conversations/{cid}/approvals/c1", json={"approve": True})
    assert r.status == 200, await r.text()
    done = await replies(b_client, cid, 1)
    assert done[-1]["type"] == "assistant" and done[-1]["text"] == "landed"
    assert tools.ran == ["launch moon"]  # approved: it runs


async def test_a_send_while_the_sweeper_takes_over_runs_each_turn_once(instances):
    """B's sweeper takes over a killed owner's conversation; a send through B lands while the
    take-over reads the store (its read is held back here to widen that window): B's worker
    runs the cut turn and the send, each once, and nothing the take-over read before is run
    again or drops the send."""
    room = instances.room
    a_client, a = await instances("A")
    b_client, b = await instances("B")
    cid = await new_conversation(a_client)
    room.hang.add("stuck")
    await send(a_client, cid, "stuck")
    await wait_until(lambda: ("stuck", "A") in room.ran)
    await history(b_client, cid)  # B has it in memory (a reader there)
    read, go_on = asyncio.Event(), asyncio.Event()
    open_turns = b.store.open_turns

    async def held_back(*args: Any, **kwargs: Any) -> Any:
        turns = await open_turns(*args, **kwargs)
        if b.ownership.owns(cid) and not read.is_set():  # the sweeper's read, after its take
            read.set()
            await go_on.wait()
        return turns

    b.store.open_turns = held_back  # type: ignore[method-assign]
    a.store.db.terminate()  # kill -9
    for task in a.jobs._periodic:
        task.cancel()
    room.hang.discard("stuck")
    try:
        await wait_until(read.is_set, timeout=8)
        await send(b_client, cid, "after")  # while the read is held
    finally:
        go_on.set()  # the held read may be the worker's own (a held read holds the close too)
    await wait_until(lambda: ("after", "B") in room.ran, timeout=8)
    await asyncio.sleep(0.5)
    items = await replies(b_client, cid, 2)
    assert sorted(texts(items)) == [
        ("assistant", "echo: after"),
        ("assistant", "echo: stuck"),
        ("user", "after"),
        ("user", "stuck"),
    ]
    assert [t for t, who in room.ran if who == "B"] == ["stuck", "after"]


async def store_a_send(agent, cid: str, text: str) -> None:
    """What an instance does with a send before it tells the conversation's owner: store it
    (then it is killed, and the owner is never told)."""
    payload = {"content": [{"type": "text", "body": text}]}
    await agent.store.add_user_message(Message(new_id("msg"), cid, "user", utcnow(), payload))


async def test_a_send_the_owner_never_heard_of_is_run_by_its_sweep(instances):
    room = instances.room
    a_client, _a = await instances("A", AGENTIK_LEASE_TTL="0.6")
    _b_client, b = await instances("B", AGENTIK_LEASE_TTL="0.6")
    cid = await new_conversation(a_client)
    await send(a_client, cid, "first")
    await replies(a_client, cid, 1)  # A owns it, idle
    await store_a_send(b, cid, "second")  # B stored it and was killed before its wake
    items = await replies(a_client, cid, 2, timeout=10)
    assert texts(items)[-2:] == [("user", "second"), ("assistant", "echo: second")]
    assert room.ran == [("first", "A"), ("second", "A")]


async def test_a_lease_left_behind_by_a_failed_release_is_taken_up_by_its_holder(instances):
    room = instances.room
    a_client, a = await instances("A", AGENTIK_LEASE_TTL="0.6")
    _b_client, b = await instances("B", AGENTIK_LEASE_TTL="0.6")
    cid = await new_conversation(a_client)
    await send(a_client, cid, "first")
    await replies(a_client, cid, 1)
    # evicted while its release failed: the store still says A holds it, A's memory does not
    a.ownership.leases.pop(cid)
    a.drop(cid)
    await store_a_send(b, cid, "second")
    items = await replies(a_client, cid, 2, timeout=10)
    assert texts(items)[-2:] == [("user", "second"), ("assistant", "echo: second")]
    assert room.ran == [("first", "A"), ("second", "A")]


async def test_a_waiting_turn_with_a_send_behind_it_is_swept_only_once_its_owner_is_gone(
    instances,
):
    """A turn waits for an approval on A, a send through B is queued behind it: while A lives,
    no sweep touches the conversation (A's refreshed its inbox at every beat, a read of the
    store each time, for as long as the turn waited); once A is killed, B's sweep takes it up,
    and the approval through B runs the tool and then the send."""
    room = instances.room
    tools = Tools()
    call = ToolCallRequest("c1", "guarded", json.dumps({"target": "moon"}))
    plugins = [("tools", tools), ("approvals", __import__("agentik_approvals"))]
    a_client, a = await instances("A", [call], plugins=plugins)
    b_client, b = await instances("B", plugins=plugins)
    cid = await new_conversation(a_client)
    await send(a_client, cid, "go")
    on_a = a.live_conversation(cid)
    assert on_a is not None
    await wait_until(lambda: on_a.inbox.held is not None and not on_a.inbox.running, timeout=10)
    await send(b_client, cid, "second")  # stored by B: A takes it up behind the waiting turn
    await wait_until(lambda: len(on_a.inbox.queue) == 1 and not on_a.inbox.running)
    refreshed: list[str] = []
    refresh = on_a.inbox.refresh

    def noted(**kwargs: Any) -> None:
        refreshed.append(cid)
        refresh(**kwargs)

    on_a.inbox.refresh = noted  # type: ignore[method-assign]
    for _ in range(3):  # three beats' sweeps on each
        assert await a.ownership.sweep() == 0
        assert await b.ownership.sweep() == 0
    assert refreshed == [] and not on_a.inbox.running
    assert a.ownership.owns(cid) and not b.ownership.owns(cid)
    a.store.db.terminate()  # kill -9: the waiting conversation is B's sweep's to take up
    for task in a.jobs._periodic:
        task.cancel()
    for _ in range(500):
        if await b.ownership.sweep() or b.ownership.owns(cid):
            break
        await asyncio.sleep(0.01)
    assert b.ownership.owns(cid)
    r = await b_client.post(f"/agentik/conversations/{cid}/approvals/c1", json={"approve": True})
    assert r.status == 200, await r.text()
    await replies(b_client, cid, 2)
    assert tools.ran == ["launch moon"]
    assert [t for t, who in room.ran if who == "B"] == ["", "second"]


# --- A2A cancels through another instance than the owner ----------------------------------

A2A = ("agentik_transport_http", "agentik_transport_a2a")
LATER = {"returnImmediately": True}


async def task_state(client, task_id: str, want: str, timeout: float = 10) -> dict[str, Any]:
    """The task as ``client``'s instance says, once it is ``want`` (or as it is at the end)."""
    from tests.test_a2a import rpc

    got: dict[str, Any] = {}
    for _ in range(int(timeout / 0.05)):
        got = (await rpc(client, "GetTask", {"id": task_id}))["result"]
        if got["status"]["state"] == want:
            break
        await asyncio.sleep(0.05)
    return got


async def test_an_a2a_cancel_through_a_non_owner_interrupts_no_other_turn(instances, monkeypatch):
    """CancelTask through an instance that neither runs the conversation nor follows the task:
    the owner is asked to take the task's turn out of its queue. When its answer does not come
    (the question is lost here, as by a notification missed while A's listener reconnects), it
    is not known whether the turn is queued or running: the interrupt sent to the owner names
    the turn (the one running there, another task's, goes on) and the owner is asked again."""
    from agentik.core import ownership
    from tests.test_a2a import rpc, text_message

    monkeypatch.setattr(ownership, "ASK_TIMEOUT", 0.5)
    room = instances.room
    room.hang.add("long")
    a_client, a = await instances("A", builtins=A2A)
    b_client, _b = await instances("B", builtins=A2A)
    params = {"message": text_message("long"), "configuration": LATER}
    first = (await rpc(a_client, "SendMessage", params))["result"]["task"]
    await wait_until(lambda: ("long", "A") in room.ran)
    params = {"message": text_message("second", contextId=first["contextId"]),
              "configuration": LATER}  # fmt: skip
    second = (await rpc(a_client, "SendMessage", params))["result"]["task"]
    lost: list[str] = []
    answer = a.ownership._answer

    async def missed_once(conv: Any, question: dict[str, Any]) -> None:
        if not lost:
            lost.append(question["turn"])
            return
        await answer(conv, question)

    a.ownership._answer = missed_once
    cancelled = await rpc(b_client, "CancelTask", {"id": second["id"]})
    assert cancelled.get("result", {}).get("status", {}).get("state") == "TASK_STATE_CANCELED", (
        cancelled
    )
    assert lost  # the first question had no answer
    room.release.set()
    got = await task_state(a_client, first["id"], "TASK_STATE_COMPLETED")
    assert got["status"]["state"] == "TASK_STATE_COMPLETED"  # not interrupted
    assert got["artifacts"][0]["parts"][0]["text"] == "echo: long"
    got = await task_state(a_client, second["id"], "TASK_STATE_CANCELED")
    assert got["status"]["state"] == "TASK_STATE_CANCELED"
    await asyncio.sleep(0.3)
    assert [t for t, _ in room.ran] == ["long"]  # the cancelled one never ran


@pytest.mark.parametrize("ahead", ["running", "waiting"])
async def test_an_a2a_task_cancelled_through_the_owner_settles_its_follower_elsewhere(
    instances, ahead
):
    """A task sent through B (its follower there) is queued on A behind a turn that runs (A
    has not taken the task's turn up yet) or behind one that waits for an approval (A holds
    it in its queue), and is cancelled through A, which runs the conversation but does not
    follow the task. Its turn is taken out of the queue; its Error and End reach B through
    the event relay, and B's follower settles: B says CANCELED too, and lets the task go."""
    from tests.test_a2a import rpc, text_message

    room = instances.room
    tools = Tools()
    plugins = [("tools", tools), ("approvals", __import__("agentik_approvals"))]
    call = ToolCallRequest("c1", "guarded", json.dumps({"target": "moon"}))
    steps = [[call]] if ahead == "waiting" else []
    if ahead == "running":
        room.hang.add("first")
    a_client, a = await instances("A", *steps, plugins=plugins, builtins=A2A)
    b_client, b = await instances("B", plugins=plugins, builtins=A2A)
    params = {"message": text_message("first"), "configuration": LATER}
    first = (await rpc(a_client, "SendMessage", params))["result"]["task"]
    cid = first["metadata"]["agentikConversationId"]
    if ahead == "running":
        await wait_until(lambda: ("first", "A") in room.ran)
    else:
        await task_state(a_client, first["id"], "TASK_STATE_INPUT_REQUIRED")
    params = {"message": text_message("second", contextId=first["contextId"]),
              "configuration": LATER}  # fmt: skip
    second = (await rpc(b_client, "SendMessage", params))["result"]["task"]
    if ahead == "waiting":  # A took it up: its queue holds it behind the waiting turn
        await wait_until(lambda: len(a.live_conversation(cid).inbox.queue) == 1)
    cancelled = (await rpc(a_client, "CancelTask", {"id": second["id"]}))["result"]
    assert cancelled["status"]["state"] == "TASK_STATE_CANCELED"
    got = await task_state(b_client, second["id"], "TASK_STATE_CANCELED")
    assert got["status"]["state"] == "TASK_STATE_CANCELED"
    service = b.state["agentik_transport_a2a"]._service
    await wait_until(lambda: second["id"] not in service.runs)
    assert a.ownership.owns(cid)
    if ahead == "running":
        room.release.set()
        got = await task_state(b_client, first["id"], "TASK_STATE_COMPLETED")
        assert got["status"]["state"] == "TASK_STATE_COMPLETED"
    else:
        got = await task_state(b_client, first["id"], "TASK_STATE_INPUT_REQUIRED")
        assert got["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"  # still waits
    await asyncio.sleep(0.3)
    assert "second" not in [t for t, _ in room.ran]


async def test_a_stale_owner_does_not_cancel_the_turn_its_successor_runs(instances):
    """A hangs (SIGSTOP) past its lease with a send in its queue; another instance takes the
    conversation over and runs that send (its first model call: the turn table still says
    queued). A cancel through the third instance asks the owner, and A, which still thinks it
    owns the conversation, hears the question too: its answer is fenced (refused, A lets the
    conversation go), so the turn its successor runs goes on to its end."""
    room = instances.room
    ttl = {"AGENTIK_LEASE_TTL": "0.6"}
    a_client, a = await instances("A", **ttl)
    others = [await instances(name, **ttl) for name in "BC"]
    cid = await new_conversation(a_client)
    room.hang.add("stuck")
    await send(a_client, cid, "stuck")
    await wait_until(lambda: ("stuck", "A") in room.ran)
    second = await send(a_client, cid, "second")  # queued on A
    for task in a.jobs._periodic:  # A hangs: its heartbeat stops
        task.cancel()
    room.hang.discard("stuck")
    room.hang.add("second")
    await wait_until(lambda: any(t == "second" for t, _ in room.ran), timeout=10)
    owner = next(agent for _, agent in others if agent.ownership.owns(cid))
    client, asker = next((c, agent) for c, agent in others if agent is not owner)
    assert a.ownership.owns(cid)  # as A sees it
    conv = await asker.get_conversation(cid)
    assert conv is not None
    assert await conv.cancel_queued(second["id"]) is False  # its new owner runs it
    room.release.set()
    items = await replies(client, cid, 2)
    assert texts(items) == [
        ("user", "stuck"),
        ("user", "second"),
        ("assistant", "echo: stuck"),
        ("assistant", "echo: second"),
    ]
    assert [m for m in items if m["type"] == "error"] == []
    assert (await conv.turn(second["id"])).state.value == "done"


async def test_an_agui_run_through_a_non_owner_sees_the_turn_as_the_store_has_it(instances):
    """AG-UI: B loaded the thread while its turn waited on A (B's memory holds the waiting
    turn); the approval is answered through A and the turn ends there. A new message through B
    is then a new turn, not refused as if the old one still waited (409 turn_waiting)."""
    tools = Tools()
    call = ToolCallRequest("c1", "guarded", json.dumps({"target": "moon"}))
    plugins = [("tools", tools), ("approvals", __import__("agentik_approvals"))]
    builtins = ("agentik_transport_http", "agentik_transport_agui")
    steps = ([call], ["landed"], ["again"])
    a_client, _a = await instances("A", *steps, plugins=plugins, builtins=builtins)
    b_client, _b = await instances("B", plugins=plugins, builtins=builtins)

    def run_input(run_id: str, *texts: str, **extra: Any) -> dict[str, Any]:
        messages = [{"id": f"u-{i}", "role": "user", "content": t} for i, t in enumerate(texts)]
        return {"threadId": "t-1", "runId": run_id, "messages": messages, "tools": [],
                "context": [], "state": {}, "forwardedProps": {}, **extra}  # fmt: skip

    async def events(client, body: dict[str, Any]) -> list[dict[str, Any]]:
        r = await client.post("/agui", json=body)
        assert r.status == 200, await r.text()
        text = await r.text()
        return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]

    def text_of(items: list[dict[str, Any]]) -> str:
        return "".join(e["delta"] for e in items if e["type"] == "TEXT_MESSAGE_CONTENT")

    asked = await events(a_client, run_input("r-1", "go"))
    assert asked[-1]["outcome"]["type"] == "interrupt", asked[-1]
    on_b = await b_client.server.app[AGENT].aliased_conversation("agui", "t-1")
    assert not on_b.ownership.owns(on_b.id) and await on_b.waiting_turn() is not None
    resume = [{"interruptId": "c1", "status": "resolved", "payload": {"approve": True}}]
    done = await events(a_client, run_input("r-2", "go", resume=resume))
    assert text_of(done) == "landed" and "outcome" not in done[-1], done
    again = await events(b_client, run_input("r-3", "go", "once more"))
    assert text_of(again) == "again" and "outcome" not in again[-1], again
    assert tools.ran == ["launch moon"]


# --- temporary conversations (issue 26, item 5) -----------------------------------------------


async def in_database(agent, sql: str, *params: Any) -> int:
    """A count read straight from the instances' schema."""
    db = agent.store.db
    return int(await db.read(lambda: db.execute(sql, params).fetchone()[0]))


async def listed(client) -> list[str]:
    return [c["id"] for c in (await (await client.get("/agentik/conversations")).json())["items"]]


def deletions(agent) -> tuple[list[str], asyncio.Task[None]]:
    """The conversations the agent's event stream says were deleted, from now on."""
    seen: list[str] = []
    events = agent.events()

    async def read() -> None:
        async for event in events:
            if isinstance(event, AgentEvent) and event.kind == "ConversationDeleted":
                seen.append(event.conversation_id)

    return seen, asyncio.create_task(read())


async def test_a_temporary_conversation_is_served_by_every_instance_and_ends_when_idle(
    instances,
):
    """Made on A, it is served on B (a send through B runs on A, its owner), listed and
    counted on neither; when A lets it go idle (its memory is full) it is deleted from the
    database, and B drops its copy and tells its readers."""
    room = instances.room
    a_client, a = await instances("A", AGENTIK_LIVE_CONVERSATIONS="1")
    b_client, b = await instances("B")
    kept = await new_conversation(a_client)
    r = await a_client.post("/agentik/conversations", json={"temp": True})
    cid = (await r.json())["id"]
    r = await b_client.get(f"/agentik/conversations/{cid}")
    assert r.status == 200, await r.text()
    assert (await r.json())["temp"] is True
    await send(b_client, cid, "short-lived")
    items = await replies(b_client, cid, 1)
    assert texts(items) == [("user", "short-lived"), ("assistant", "echo: short-lived")]
    assert room.ran == [("short-lived", "A")] and a.ownership.owns(cid)
    for client in (a_client, b_client):
        assert await listed(client) == [kept]
        stats = await (await client.get("/agentik/stats")).json()
        assert stats["conversations"] == 1 and stats["turns"] == 0
    seen, reading = deletions(b)
    await new_conversation(a_client)  # A's memory holds one conversation: the idle one goes
    await wait_until(lambda: b.live_conversation(cid) is None)
    await wait_until(lambda: cid in seen)
    reading.cancel()
    for client in (a_client, b_client):
        assert (await client.get(f"/agentik/conversations/{cid}")).status == 404
    assert await in_database(b, "SELECT count(*) FROM conversation WHERE id = ?", cid) == 0
    assert await in_database(b, "SELECT count(*) FROM message WHERE conversation_id = ?", cid) == 0
    assert await in_database(b, "SELECT count(*) FROM temporary_conversation") == 0


async def test_the_temporary_conversations_of_a_killed_instance_are_deleted(instances):
    """kill -9 of the instance that made a temporary conversation: nobody is left to let it go
    idle, so the periodic job of one instance deletes it (no garbage), and the copies the
    others hold go."""
    a_client, a = await instances("A", AGENTIK_LEASE_TTL="0.6")
    b_client, b = await instances("B", AGENTIK_LEASE_TTL="0.6")
    r = await a_client.post("/agentik/conversations", json={"temp": True})
    cid = (await r.json())["id"]
    await send(a_client, cid, "hi")
    await replies(b_client, cid, 1)  # B holds a copy
    assert b.live_conversation(cid) is not None
    assert await in_database(b, "SELECT count(*) FROM temporary_conversation") == 1
    a.store.db.terminate()  # the process dies: nothing more of it reaches the server
    a.jobs.leader._lost()  # (the session of its periodic jobs' locks too)
    for task in a.jobs._periodic:
        task.cancel()
    await wait_until(lambda: b.live_conversation(cid) is None, timeout=10)
    assert (await b_client.get(f"/agentik/conversations/{cid}")).status == 404
    assert await in_database(b, "SELECT count(*) FROM conversation WHERE id = ?", cid) == 0
    assert await in_database(b, "SELECT count(*) FROM temporary_conversation") == 0


class SlowTools:
    """``guarded`` (needs approval) runs until its instance stops."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.started = asyncio.Event()

    @hookimpl
    def register_tools(self, register: Any) -> None:
        async def launch(target: str) -> str:
            """Launch at a target."""
            self.ran.append(f"launch {target}")
            self.started.set()
            await asyncio.Event().wait()
            return "launched"

        register(tool(launch, name="guarded", requires_approval=True))


async def test_an_approved_call_a_stop_cut_is_not_run_again_by_the_next_owner(instances):
    """A runs the approved call; a stop (SIGTERM) hands the turn over while it runs: B cuts
    it (the model is told it may have taken effect), it does not run it a second time. (The
    store still says the turn's waits are answered: without the mark A wrote before the call,
    B took the turn as one nobody had gone on with.)"""
    from agentik.core.tool_steps import CUT_CALL

    tools = SlowTools()
    call = ToolCallRequest("c1", "guarded", json.dumps({"target": "moon"}))
    plugins = [("tools", tools), ("approvals", __import__("agentik_approvals"))]
    a_client, _a = await instances("A", [call], plugins=plugins)
    b_client, _b = await instances("B", ["understood"], plugins=plugins)
    cid = await new_conversation(a_client)
    await send(a_client, cid, "go")
    for _ in range(200):
        r = await a_client.get(f"/agentik/conversations/{cid}/approvals")
        if (await r.json())["items"]:
            break
        await asyncio.sleep(0.05)
    r = await a_client.post(f"/agentik/conversations/{cid}/approvals/c1", json={"approve": True})
    assert r.status == 200, await r.text()
    await asyncio.wait_for(tools.started.wait(), 5)
    await a_client.close()  # the stop hands the turn over, its call cut
    items = await replies(b_client, cid, 1)
    assert tools.ran == ["launch moon"]
    assert [m["text"] for m in items if m["type"] == "tool_result"] == [CUT_CALL]
    assert items[-1]["type"] == "assistant" and items[-1]["text"] == "understood"


async def test_a_send_that_takes_a_killed_owners_conversation_settles_it_as_a_crash(instances):
    """kill -9 of A while its turn runs; before any sweep (every 20 s here), a send through B
    takes the conversation: B settles what A left as a crash would, not as a clean hand-off:
    with AGENTIK_RESUME_TURNS=0 the cut turn ends with a restart error instead of running
    again, then the send runs."""
    room = instances.room
    a_client, a = await instances("A", AGENTIK_LEASE_TTL="60")
    b_client, _b = await instances("B", AGENTIK_LEASE_TTL="60", AGENTIK_RESUME_TURNS="0")
    cid = await new_conversation(a_client)
    room.hang.add("stuck")
    await send(a_client, cid, "stuck")
    await wait_until(lambda: ("stuck", "A") in room.ran)
    a.store.db.terminate()  # the process dies: nothing more of it reaches the server
    for task in a.jobs._periodic:
        task.cancel()
    room.hang.discard("stuck")
    await send(b_client, cid, "next")
    items = await replies(b_client, cid, 2)
    # (the error is recorded when B settles the cut turn: after the send it took it with)
    assert [m["type"] for m in items] == ["user", "user", "error", "assistant"], items
    assert items[2]["code"] == "restart" and text_of(items[-1]) == "echo: next"
    assert ("stuck", "B") not in room.ran


async def test_a_live_instance_whose_connection_blipped_keeps_its_temporary_conversations(
    instances,
):
    """The connection that holds A's liveness lock drops (a network blip: A beats again
    within its lease): its lock looks free, but its heartbeat has not expired, so the job that
    ends the temporary conversations of dead instances leaves A's alone."""
    a_client, a = await instances("A", AGENTIK_LEASE_TTL="30")
    _b_client, b = await instances("B", AGENTIK_LEASE_TTL="30")
    r = await a_client.post("/agentik/conversations", json={"temp": True})
    cid = (await r.json())["id"]
    a.store.db._beating.terminate()  # A's lock goes with that session
    await asyncio.sleep(0.1)
    assert await b.store.end_temporaries() == []
    assert await in_database(b, "SELECT count(*) FROM conversation WHERE id = ?", cid) == 1


async def test_a_worker_a_database_error_stopped_is_started_again_by_the_sweep(instances):
    """A turn waits for an approval on A. While the database is away a moment, a send through
    B wakes A and A's interrupt of the waiting turn starts its worker: both reads of the store
    fail, and the worker stops. No sweep of the store finds the conversation (its turn still
    waits there), so A's own sweep starts the worker again from memory: the turn ends, and
    the send runs."""
    tools = Tools()
    call = ToolCallRequest("c1", "guarded", json.dumps({"target": "moon"}))
    plugins = [("tools", tools), ("approvals", __import__("agentik_approvals"))]
    a_client, a = await instances("A", [call], plugins=plugins)
    b_client, _b = await instances("B", plugins=plugins)
    cid = await new_conversation(a_client)
    await send(a_client, cid, "go")
    conv = a.live_conversation(cid)
    await wait_until(lambda: conv.inbox.held is not None and not conv.inbox.running)
    store, read = conv.store, conv.store.open_turns
    failed: list[str | None] = []

    async def away(conversation_id: str | None = None) -> Any:
        failed.append(conversation_id)
        raise ConnectionError("the database is away")

    store.open_turns = away  # type: ignore[method-assign]
    try:
        await send(b_client, cid, "after")  # queued behind the waiting turn; A is woken
        await wait_until(lambda: failed and not conv.inbox.running)
        r = await a_client.post(f"/agentik/conversations/{cid}/interrupt")
        assert (await r.json())["interrupted"] is True
        await wait_until(lambda: len(failed) >= 2 and not conv.inbox.running)
    finally:
        store.open_turns = read  # type: ignore[method-assign]
    await a.ownership.sweep()
    items = await replies(a_client, cid, 2)
    assert texts(items)[-1] == ("assistant", "echo: after") and tools.ran == []


async def test_a_temporary_conversation_a_send_came_to_does_not_end(instances):
    """A lets its temporary conversation go idle; a send through B was stored meanwhile (a
    queued turn): the end deletes only A's lease, the acknowledged send stays and runs."""
    a_client, a = await instances("A")
    b_client, b = await instances("B")
    r = await a_client.post("/agentik/conversations", json={"temp": True})
    cid = (await r.json())["id"]
    body = {"content": [{"type": "text", "body": "meanwhile"}], "context": {"origin": "user"}}
    sent = Message(new_id("msg"), cid, "user", utcnow(), body)
    await b.store.add_user_message(sent)  # B's send, stored before A's end
    await a.forget_temporary(cid)  # what A's eviction of it runs
    assert await in_database(b, "SELECT count(*) FROM conversation WHERE id = ?", cid) == 1
    lease = "SELECT count(*) FROM conversation_lease WHERE conversation_id = ?"
    assert await in_database(b, lease, cid) == 0
    await b.ownership.sweep()  # (its wake was not sent here: the sweep finds it)
    items = await replies(b_client, cid, 1)
    assert texts(items) == [("user", "meanwhile"), ("assistant", "echo: meanwhile")]


async def test_a_send_that_takes_a_killed_owners_idle_conversation_runs(instances):
    """A ran a turn and holds the conversation idle; it is killed. A send through B takes the
    conversation from the dead owner (settled as after a crash), but the send is B's own: it
    runs, even with AGENTIK_RESUME_TURNS=0 and AGENTIK_RESUME_QUEUED=0 (no restart error for
    a send the dead owner never had), and readers get no Gap (nothing of it was cut)."""
    a_client, a = await instances("A", AGENTIK_LEASE_TTL="60")
    off = {"AGENTIK_RESUME_TURNS": "0", "AGENTIK_RESUME_QUEUED": "0"}
    b_client, _b = await instances("B", AGENTIK_LEASE_TTL="60", **off)
    cid = await new_conversation(a_client)
    await send(a_client, cid, "first")
    await replies(a_client, cid, 1)
    a.store.db.terminate()  # the process dies: nothing more of it reaches the server
    for task in a.jobs._periodic:
        task.cancel()
    events = await b_client.get(f"/agentik/conversations/{cid}/events")
    await send(b_client, cid, "second")
    frames = await read_sse(events)
    events.close()
    assert "Gap" not in [f["event"] for f in frames]
    items = await replies(b_client, cid, 2)
    assert texts(items)[-1] == ("assistant", "echo: second"), items
