"""Three ``agentik serve`` instances on one PostgreSQL behind HAProxy (issue 26, item 6), in hash
and round-robin modes (``tests/cluster.py``, ``docs/haproxy.cfg``): the failure cases of the
issue. Real processes, real HAProxy, real PostgreSQL; the fake OpenAI server is the model.

Many instances on one schema need the agent's ownership of conversations (leases, wake and
control between instances, the sweeper); events across instances need the event table and its
relay: the tests that need what is not built yet say so and are skipped (:func:`needs`)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agentik.core.store import Store
from tests.cluster import (
    DOCS_CONFIG,
    HASH,
    MISSING,
    MODES,
    ROUND_ROBIN,
    Cluster,
    haproxy_bin,
    haproxy_config,
)
from tests.conftest import read_sse
from tests.test_turns_e2e import env_for, reset_fake

OWNERSHIP = "conversation ownership across instances (issue 26 item 2, branch i26-own)"
EVENTS = "events across instances (issue 26 item 3, branch i26-events)"


def needs(*what: str) -> pytest.MarkDecorator:
    """Skip when a piece many instances need is not in this checkout (see the module doc)."""
    built = {OWNERSHIP: hasattr(Store, "shared"), EVENTS: hasattr(Store, "shared_events")}
    missing = [w for w in what if not built[w]]
    return pytest.mark.skipif(bool(missing), reason=f"not built yet: {', '.join(missing)}")


@pytest.fixture
def cluster(tmp_path, postgres_server, fake_openai_proc, request) -> Iterator[Cluster]:
    if haproxy_bin() is None:
        pytest.skip(MISSING)
    made = Cluster(tmp_path, postgres_server.fresh_url(), env_for(fake_openai_proc, tmp_path))
    try:
        yield made
    finally:
        made.close()
        keep = os.environ.get("AGENTIK_CLUSTER_LOGS")  # a folder to keep the logs in
        if keep:
            skip = shutil.ignore_patterns("*.db*", "models", "plugins")
            shutil.copytree(tmp_path, Path(keep) / request.node.name, dirs_exist_ok=True,
                            ignore=skip)  # fmt: skip


# --- helpers ------------------------------------------------------------------------------


async def post(s: aiohttp.ClientSession, url: str, body: Any = None, status: int = 0) -> Any:
    async with s.post(url, json=body) as r:
        text = await r.text()
        assert (r.status == status) if status else r.status < 300, f"{r.status} {text}"
        return json.loads(text) if text else None


async def create(s: aiohttp.ClientSession, base: str) -> str:
    return str((await post(s, f"{base}/agentik/conversations"))["id"])


async def send(s: aiohttp.ClientSession, base: str, cid: str, text: str) -> dict[str, Any]:
    """A send acknowledged (202): from then on it may not be lost."""
    url = f"{base}/agentik/conversations/{cid}/messages"
    return dict(await post(s, url, [{"type": "text", "body": text}], status=202))


async def history(s: aiohttp.ClientSession, base: str, cid: str) -> list[dict[str, Any]]:
    async with s.get(f"{base}/agentik/conversations/{cid}/messages?limit=200") as r:
        assert r.status == 200, await r.text()
        return list((await r.json())["items"])


def texts(items: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(type, text) of each record: a user message's text, an assistant's reply."""
    out = []
    for item in items:
        if item["type"] == "user":
            out.append(("user", " ".join(p.get("body", "") for p in item["content"])))
        elif item["type"] in ("assistant", "error"):
            out.append((item["type"], item.get("text") or item.get("message") or ""))
    return out


async def settled(s: aiohttp.ClientSession, base: str, cid: str, sends: int,
                  timeout: float = 30) -> list[dict[str, Any]]:  # fmt: skip
    """The history once each of ``sends`` user messages has its end recorded."""
    deadline = time.monotonic() + timeout
    while True:
        async with s.get(f"{base}/agentik/conversations/{cid}/messages?limit=200") as r:
            if r.status == 503:  # no instance up behind HAProxy right now (kills): again
                assert time.monotonic() < deadline, "503 until the end"
                await asyncio.sleep(0.1)
                continue
            assert r.status == 200, await r.text()
            items = list((await r.json())["items"])
        kinds = [t for t, _ in texts(items)]
        ends = len(kinds) - kinds.count("user")
        if kinds.count("user") >= sends and ends >= kinds.count("user"):
            return items
        assert time.monotonic() < deadline, f"not settled: {texts(items)}"
        await asyncio.sleep(0.05)


def turn_pairs(items: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Each user message with the reply that ended its turn, in order (the log keeps a send
    when it is accepted, and a turn's end when it ends: ends come in the turns' order)."""
    seq = texts(items)
    users = [x for t, x in seq if t == "user"]
    ends = [x for t, x in seq if t != "user"]
    assert len(users) == len(ends), seq
    return list(zip(users, ends, strict=True))


async def model_saw(fake: str) -> list[list[str]]:
    """What the model was given at each turn's request: the conversation's texts, in order.
    Turn k of a conversation that ran one turn at a time saw each earlier turn's reply."""
    async with (
        aiohttp.ClientSession() as s,
        s.get(fake.removesuffix("/v1") + "/_fake/requests") as r,
    ):
        sent = await r.json()
    return [
        [m["content"] for m in body["messages"] if m["role"] in ("user", "assistant")]
        for body in sent
        if body.get("stream")
    ]


# --- the configuration users copy ---------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_the_harness_runs_the_documented_haproxy_config(mode, tmp_path):
    """No drift: the harness' configuration is docs/haproxy.cfg but for its ports and servers
    (and, round-robin, its balance lines); both are configurations HAProxy takes."""
    found = haproxy_bin()
    if found is None:
        pytest.skip(MISSING)
    documented = DOCS_CONFIG.read_text().splitlines()
    ours = haproxy_config(9999, [7001, 7002], mode).splitlines()

    def own(line: str) -> bool:
        word = line.split()[0] if line.split() else ""
        return word in ("server", "bind") or (mode == ROUND_ROBIN and word in
                                              ("balance", "hash-type"))  # fmt: skip

    assert [x for x in documented if not own(x)] == [x for x in ours if not own(x)]
    for line in ("option http-no-delay", "balance uri path-only depth 3", "hash-type consistent",
                 "option httpchk GET /health/ready"):  # fmt: skip
        assert f"    {line}" in documented
    assert ("    balance roundrobin" in ours) == (mode == ROUND_ROBIN)
    assert ours[-2:] == ["    server agentik1 127.0.0.1:7001", "    server agentik2 127.0.0.1:7002"]
    for text in ("\n".join(documented), "\n".join(ours)):
        path = tmp_path / "check.cfg"
        path.write_text(text + "\n")
        checked = subprocess.run([found, "-c", "-f", str(path)], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stdout + checked.stderr


async def test_a_turn_streams_through_haproxy(cluster, fake_openai_proc):
    """One instance behind the documented config: SSE passes unbuffered, the hash keeps a
    conversation's requests on one instance."""
    cluster.start(1)
    await reset_fake(fake_openai_proc, {"text": "one two three four", "delay": 0.02})
    async with aiohttp.ClientSession() as s:
        cid = await create(s, cluster.url)
        events = await s.get(f"{cluster.url}/agentik/conversations/{cid}/events")
        assert events.headers["X-Agentik-Instance"] == "agentik1"
        await send(s, cluster.url, cid, "hello")
        frames = await read_sse(events)
        events.close()
    kinds = [f["event"] for f in frames]
    assert kinds[0] == "UserMessage" and kinds[-1] == "End" and kinds.count("End") == 1
    assert "".join(f["data"]["text"] for f in frames if f["event"] == "AppendText") == (
        "one two three four"
    )


@needs(OWNERSHIP)
async def test_the_hash_sends_a_conversations_requests_to_one_instance(cluster):
    cluster.start(3, HASH)
    async with aiohttp.ClientSession() as s:
        served: dict[str, set[str]] = {}
        for _ in range(6):
            cid = await create(s, cluster.instances[0].base)
            for path in ("", "/messages", "/stats"):
                async with s.get(f"{cluster.url}/agentik/conversations/{cid}{path}") as r:
                    assert r.status == 200
                    served.setdefault(cid, set()).add(r.headers["X-Agentik-Instance"])
    assert all(len(who) == 1 for who in served.values()), served
    assert len(set().union(*served.values())) > 1  # and the conversations spread


# --- turns across instances ---------------------------------------------------------------


@needs(OWNERSHIP)
async def test_two_sends_to_one_conversation_through_two_instances(cluster, fake_openai_proc):
    cluster.start(3)
    a, b, _ = cluster.instances
    await reset_fake(fake_openai_proc)  # echo
    async with aiohttp.ClientSession() as s:
        cid = await create(s, a.base)
        await asyncio.gather(send(s, a.base, cid, "first"), send(s, b.base, cid, "second"))
        pairs = turn_pairs(await settled(s, cluster.url, cid, 2))
    # one turn at a time, each answered once (whichever send committed first ran first)
    assert sorted(pairs) == [("first", "echo: first"), ("second", "echo: second")]
    (u1, r1), (u2, _) = pairs
    assert await model_saw(fake_openai_proc) == [[u1], [u1, r1, u2]]


@needs(OWNERSHIP)
@pytest.mark.parametrize("mode", MODES)
async def test_twenty_sends_spread_over_three_instances_run_one_at_a_time_in_order(
    cluster, fake_openai_proc, mode
):
    cluster.start(3, mode)
    await reset_fake(fake_openai_proc)
    async with aiohttp.ClientSession() as s:
        cid = await create(s, cluster.url)
        for i in range(20):  # each acknowledged before the next: their order is known
            await send(s, cluster.instances[i % 3].base, cid, f"m{i}")
        pairs = turn_pairs(await settled(s, cluster.url, cid, 20))
    assert pairs == [(f"m{i}", f"echo: m{i}") for i in range(20)]
    # one turn at a time: each turn's model request holds every earlier turn's reply
    expected = [[x for j in range(i) for x in (f"m{j}", f"echo: m{j}")] + [f"m{i}"]
                for i in range(20)]  # fmt: skip
    assert await model_saw(fake_openai_proc) == expected


@needs(OWNERSHIP, EVENTS)
async def test_sse_on_one_instance_for_a_turn_on_another(cluster, fake_openai_proc):
    cluster.start(3)
    a, b, _ = cluster.instances
    await reset_fake(fake_openai_proc, {"text": "streamed from elsewhere", "delay": 0.01})
    async with aiohttp.ClientSession() as s:
        cid = await create(s, a.base)
        events = await s.get(f"{b.base}/agentik/conversations/{cid}/events")
        await send(s, a.base, cid, "hi")
        frames = await read_sse(events)
        events.close()
    kinds = [f["event"] for f in frames]
    assert kinds[0] == "UserMessage" and kinds.count("End") == 1
    assert "".join(f["data"]["text"] for f in frames if f["event"] == "AppendText") == (
        "streamed from elsewhere"
    )
    ids = [int(f["id"]) for f in frames]
    assert ids == sorted(ids)


@needs(OWNERSHIP, EVENTS)
async def test_last_event_id_resumes_on_another_instance(cluster, fake_openai_proc):
    cluster.start(3)
    a, b, _ = cluster.instances
    await reset_fake(fake_openai_proc, {"text": " ".join(f"w{i}" for i in range(30)),
                                        "delay": 0.02})  # fmt: skip
    async with aiohttp.ClientSession() as s:
        cid = await create(s, a.base)
        first = await s.get(f"{a.base}/agentik/conversations/{cid}/events")
        await send(s, a.base, cid, "go")
        head = await read_sse(first, until="AppendText")
        first.close()  # the client lost its connection to A
        resumed = await s.get(f"{b.base}/agentik/conversations/{cid}/events",
                              headers={"Last-Event-ID": head[-1]["id"]})  # fmt: skip
        rest = await read_sse(resumed)
        resumed.close()
    frames = head + rest
    ids = [int(f["id"]) for f in frames]
    assert ids == sorted(set(ids))  # nothing twice
    assert "".join(f["data"]["text"] for f in frames if f["event"] == "AppendText") == (
        " ".join(f"w{i}" for i in range(30))
    )  # nothing missed
    assert [f["event"] for f in frames].count("End") == 1


# --- failures -----------------------------------------------------------------------------


@needs(OWNERSHIP, EVENTS)
async def test_kill_9_of_the_owner_mid_turn_another_resumes_it(cluster, fake_openai_proc):
    cluster.start(3, HASH)
    await reset_fake(fake_openai_proc, {"text": "cut " * 200, "delay": 0.02}, {"text": "done"})
    async with aiohttp.ClientSession() as s:
        cid = await create(s, cluster.url)
        await send(s, cluster.url, cid, "long one")
        async with s.get(f"{cluster.url}/agentik/conversations/{cid}") as r:
            owner = next(i for i in cluster.instances if i.n == int(
                r.headers["X-Agentik-Instance"].removeprefix("agentik")))  # fmt: skip
        await asyncio.sleep(0.5)  # mid-reply
        cluster.kill(owner)
        other = next(i for i in cluster.instances if i.alive)
        items = await settled(s, other.base, cid, 1, timeout=30)
    ends = [t for t, _ in texts(items) if t != "user"]
    assert len(ends) == 1, texts(items)  # End once


@needs(OWNERSHIP)
async def an_instance_up(s: aiohttp.ClientSession, cluster: Cluster, prefer: int) -> Any:
    """The first instance from ``prefer`` on whose /health answers (waiting for one)."""
    deadline = time.monotonic() + 30
    while True:
        for instance in cluster.instances[prefer:] + cluster.instances[:prefer]:
            try:
                async with s.get(f"{instance.base}/health") as r:
                    if r.status == 200:
                        return instance
            except aiohttp.ClientError:
                pass
        assert time.monotonic() < deadline, "no instance came up"
        await asyncio.sleep(0.05)


async def test_twenty_kills_lose_no_acknowledged_message(cluster, fake_openai_proc):
    """kill -9 of an instance right after it acknowledged a send, twenty times, a new one
    started in its place each time: every acknowledged message is answered, once."""
    cluster.start(3, ROUND_ROBIN)
    # replies that take ~0.15 s: the kill comes mid-turn (then the echo, once they run out)
    await reset_fake(fake_openai_proc, *[{"text": "a b c d e", "delay": 0.03}] * 60)
    acked: dict[str, list[str]] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        cids = [await create(s, cluster.url) for _ in range(4)]
        for k in range(20):
            cid = cids[k % len(cids)]
            target = await an_instance_up(s, cluster, prefer=k % 3)
            try:
                await send(s, target.base, cid, f"k{k}")
                acked.setdefault(cid, []).append(f"k{k}")
            except (aiohttp.ClientError, AssertionError):
                pass  # refused while it died: not acknowledged, may be lost
            cluster.kill(target)  # its turn just queued or started
            cluster.start_instance(port=target.port, wait=False)
        for cid in cids:
            items = await settled(s, cluster.url, cid, len(acked.get(cid, [])), timeout=60)
            got = [u for u, _ in turn_pairs(items)]
            mine = acked.get(cid, [])
            assert [u for u in got if u in mine] == mine, (got, mine)  # each once, in order
    assert sum(map(len, acked.values())) >= 15, acked


@needs(OWNERSHIP)
async def test_an_instance_starting_while_others_run_turns_leaves_them_alone(
    cluster, fake_openai_proc
):
    cluster.start(2)
    a, _ = cluster.instances
    await reset_fake(fake_openai_proc, {"text": "slow " * 60, "delay": 0.02})
    async with aiohttp.ClientSession() as s:
        cid = await create(s, a.base)
        await send(s, a.base, cid, "slow please")
        await asyncio.sleep(0.2)
        cluster.start_instance()  # its start-up must not close or take A's live turn
        items = await settled(s, a.base, cid, 1)
    assert turn_pairs(items) == [("slow please", "slow " * 60)]


@needs(OWNERSHIP)
async def test_interrupt_through_a_non_owner(cluster, fake_openai_proc):
    cluster.start(2)
    a, b = cluster.instances
    await reset_fake(fake_openai_proc, {"text": "never " * 500, "delay": 0.02})
    async with aiohttp.ClientSession() as s:
        cid = await create(s, a.base)
        await send(s, a.base, cid, "go on forever")
        await asyncio.sleep(0.5)
        assert (await post(s, f"{b.base}/agentik/conversations/{cid}/interrupt"))["interrupted"]
        items = await settled(s, b.base, cid, 1, timeout=10)
    assert items[-1]["type"] == "assistant" and items[-1].get("interrupted") is True


@needs(OWNERSHIP)
async def test_approval_through_a_non_owner(cluster, fake_openai_proc, tmp_path):
    cluster.env["AGENTIK_TOOL_APPROVAL"] = "launch"
    cluster.start(2)
    a, b = cluster.instances
    await reset_fake(fake_openai_proc, {"tool_calls": [["launch", {"target": "moon"}]]},
                     {"text": "launched"})  # fmt: skip
    async with aiohttp.ClientSession() as s:
        cid = await create(s, a.base)
        await send(s, a.base, cid, "launch it")
        deadline = time.monotonic() + 10
        while True:
            async with s.get(f"{b.base}/agentik/conversations/{cid}/approvals") as r:
                waiting = (await r.json())["items"]
            if waiting:
                break
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        call = waiting[0]["callId"]
        await post(s, f"{b.base}/agentik/conversations/{cid}/approvals/{call}", {"approve": True})
        items = await settled(s, a.base, cid, 1)
    assert texts(items)[-1] == ("assistant", "launched")
    assert (tmp_path / "runs.txt").read_text() == "launch moon\n"  # run once


@needs(OWNERSHIP)
async def test_rename_and_delete_across_instances(cluster, fake_openai_proc):
    cluster.start(3)
    a, b, c = cluster.instances
    await reset_fake(fake_openai_proc)
    async with aiohttp.ClientSession() as s:
        cid = await create(s, a.base)
        await send(s, a.base, cid, "hello")
        await settled(s, a.base, cid, 1)  # live on A
        async with s.patch(f"{b.base}/agentik/conversations/{cid}", json={"title": "Trip"}) as r:
            assert r.status == 200
        for base in (a.base, c.base):  # the owner A hears of it (a notification): soon
            deadline = time.monotonic() + 2
            while True:
                async with s.get(f"{base}/agentik/conversations/{cid}") as r:
                    if (await r.json())["title"] == "Trip":
                        break
                assert time.monotonic() < deadline, base
                await asyncio.sleep(0.02)
        async with s.delete(f"{c.base}/agentik/conversations/{cid}") as r:
            assert r.status == 204
        for base in (a.base, b.base, c.base):  # the owner A forgets it when told: soon
            deadline = time.monotonic() + 2
            while True:
                async with s.get(f"{base}/agentik/conversations/{cid}") as r:
                    if r.status == 404:
                        break
                assert time.monotonic() < deadline, base
                await asyncio.sleep(0.02)
            async with s.post(f"{base}/agentik/conversations/{cid}/messages",
                              json=[{"type": "text", "body": "x"}]) as r:  # fmt: skip
                assert r.status == 404


@needs(OWNERSHIP)
async def test_sigterm_hands_running_turns_to_another_instance(cluster, fake_openai_proc):
    cluster.start(2)
    a, b = cluster.instances
    await reset_fake(fake_openai_proc, {"text": "cut " * 300, "delay": 0.02}, {"text": "resumed"})
    async with aiohttp.ClientSession() as s:
        cid = await create(s, a.base)
        await send(s, a.base, cid, "long")
        await asyncio.sleep(0.5)
        assert cluster.kill(a, signal.SIGTERM) == 0
        items = await settled(s, b.base, cid, 1)
    ends = [(t, x) for t, x in texts(items) if t != "user"]
    assert ends == [("assistant", "resumed")], ends  # not cancelled: resumed elsewhere


@needs(OWNERSHIP)
async def test_postgresql_restart_503_then_recovery_nothing_lost(
    cluster, fake_openai_proc, postgres_server
):
    cluster.start(2)
    await reset_fake(fake_openai_proc)
    async with aiohttp.ClientSession() as s:
        cid = await create(s, cluster.url)
        await send(s, cluster.url, cid, "before")
        await settled(s, cluster.url, cid, 1)
        postgres_server.restart()
        statuses = []
        acked = ["before"]
        for i in range(40):
            async with s.post(f"{cluster.url}/agentik/conversations/{cid}/messages",
                              json=[{"type": "text", "body": f"after{i}"}]) as r:  # fmt: skip
                statuses.append(r.status)
                if r.status == 202:
                    acked.append(f"after{i}")
                    if len(acked) >= 3:
                        break
                else:
                    assert r.status == 503, await r.text()
            await asyncio.sleep(0.1)
        items = await settled(s, cluster.url, cid, len(acked))
    assert [u for u, _ in turn_pairs(items)] == acked


@needs(OWNERSHIP)
async def test_a_note_saved_on_one_instance_is_prefetched_on_another(cluster, fake_openai_proc):
    cluster.env.update(AGENTIK_MEMORY_BACKEND="vector", AGENTIK_EMBEDDING_BACKEND="http",
                       AGENTIK_EMBEDDING_DIMENSION="256", AGENTIK_MEMORY_REVIEW="0")  # fmt: skip
    cluster.start(2)
    a, b = cluster.instances
    note = {"category": "user", "text": "The user's cat is called Murka."}
    await reset_fake(fake_openai_proc, {"tool_calls": [["memory_save", note]]}, {"text": "ok"})
    async with aiohttp.ClientSession() as s:
        cid = await create(s, a.base)
        await send(s, a.base, cid, "Remember: my cat is Murka.")
        await settled(s, a.base, cid, 1)
        other = await create(s, b.base)
        await send(s, b.base, other, "What is my cat called?")
        await settled(s, b.base, other, 1)
        async with s.get(fake_openai_proc.removesuffix("/v1") + "/_fake/requests") as r:
            last = [body for body in await r.json() if body.get("stream")][-1]
    asked = json.dumps(last["messages"])
    assert "The user's cat is called Murka." in asked  # B's prefetch found A's note


@needs(OWNERSHIP)
async def test_an_a2a_task_created_on_one_instance_is_fetched_and_cancelled_on_another(
    cluster, fake_openai_proc
):
    cluster.start(2)
    a, b = cluster.instances
    await reset_fake(fake_openai_proc, {"text": "slow " * 500, "delay": 0.02})
    message = {"kind": "message", "role": "user", "messageId": "m1",
               "parts": [{"kind": "text", "text": "take your time"}]}  # fmt: skip
    body = {"jsonrpc": "2.0", "id": 1, "method": "message/send",
            "params": {"message": message, "configuration": {"blocking": False}}}  # fmt: skip
    async with aiohttp.ClientSession() as s:
        task = (await post(s, f"{a.base}/a2a/", body))["result"]
        get = {"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": task["id"]}}
        fetched = (await post(s, f"{b.base}/a2a/", get))["result"]
        assert fetched["id"] == task["id"]
        cancel = {"jsonrpc": "2.0", "id": 3, "method": "tasks/cancel",
                  "params": {"id": task["id"]}}  # fmt: skip
        cancelled = await post(s, f"{b.base}/a2a/", cancel)
        assert cancelled.get("result", {}).get("status", {}).get("state") == "canceled", cancelled
        deadline = time.monotonic() + 10
        while (seen := await post(s, f"{a.base}/a2a/", get))["result"]["status"]["state"] != (
            "canceled"
        ):
            assert time.monotonic() < deadline, seen["result"]["status"]
            await asyncio.sleep(0.1)


@needs(OWNERSHIP, EVENTS)
async def test_an_a2a_task_queued_on_one_instance_and_cancelled_through_another_settles(
    cluster, fake_openai_proc
):
    """Two tasks of one context sent through A: the first runs (slowly), the second waits in
    A's queue. CancelTask through B takes the second out of it: A, whose follower settles on
    the turn's End, says CANCELED as B does, and the first runs to its end."""
    cluster.start(2)
    a, b = cluster.instances
    await reset_fake(fake_openai_proc, {"text": "slow " * 100, "delay": 0.02}, {"text": "no"})

    def send_body(n: int, context: str | None = None) -> dict[str, Any]:
        message = {"kind": "message", "role": "user", "messageId": f"m{n}",
                   "parts": [{"kind": "text", "text": f"task {n}"}]}  # fmt: skip
        if context is not None:
            message["contextId"] = context
        return {"jsonrpc": "2.0", "id": n, "method": "message/send",
                "params": {"message": message, "configuration": {"blocking": False}}}  # fmt: skip

    async def state_on(s: aiohttp.ClientSession, base: str, task_id: str, want: str) -> Any:
        get = {"jsonrpc": "2.0", "id": 9, "method": "tasks/get", "params": {"id": task_id}}
        deadline = time.monotonic() + 10
        while (seen := (await post(s, f"{base}/a2a/", get))["result"])["status"]["state"] != want:
            assert time.monotonic() < deadline, seen["status"]
            await asyncio.sleep(0.1)
        return seen

    async with aiohttp.ClientSession() as s:
        first = (await post(s, f"{a.base}/a2a/", send_body(1)))["result"]
        second = (await post(s, f"{a.base}/a2a/", send_body(2, first["contextId"])))["result"]
        cancel = {"jsonrpc": "2.0", "id": 3, "method": "tasks/cancel",
                  "params": {"id": second["id"]}}  # fmt: skip
        cancelled = await post(s, f"{b.base}/a2a/", cancel)
        assert cancelled.get("result", {}).get("status", {}).get("state") == "canceled", cancelled
        await state_on(s, a.base, second["id"], "canceled")  # its follower on A settled
        done = await state_on(s, b.base, first["id"], "completed")
    assert done["artifacts"][0]["parts"][0]["text"] == "slow " * 100
    assert len(await model_saw(fake_openai_proc)) == 1  # the cancelled task never ran


def test_docs_say_how_to_run_many_instances():
    text = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text()
    section = text.split("## Running many instances", 1)[1]
    for needed in ("AGENTIK_DATABASE_URL", "haproxy.cfg", "nginx", "proxy_buffering off",
                   "http-no-delay", "same plugins"):  # fmt: skip
        assert needed in section, needed


@needs(OWNERSHIP)
async def test_a_temporary_conversation_is_served_by_every_instance(cluster, fake_openai_proc):
    """Round-robin: a temporary conversation's requests reach every instance, not only the one
    that created it (temporary conversations are owned like the others)."""
    cluster.start(2, ROUND_ROBIN)
    a, b = cluster.instances
    await reset_fake(fake_openai_proc)
    async with aiohttp.ClientSession() as s:
        cid = str((await post(s, f"{a.base}/agentik/conversations", {"temp": True}))["id"])
        async with s.get(f"{b.base}/agentik/conversations/{cid}") as r:
            assert r.status == 200, await r.text()
        await send(s, b.base, cid, "short-lived")
        pairs = turn_pairs(await settled(s, a.base, cid, 1))
    assert pairs == [("short-lived", "echo: short-lived")]


#: (reader, sender) as offsets from the instance that made the conversation
PLACES = ((1, 2), (2, 1), (0, 1), (0, 2), (1, 0), (2, 0))


@needs(OWNERSHIP, EVENTS)
async def test_round_robin_turns_end_for_a_reader_on_a_third_instance(cluster, fake_openai_proc):
    """The round-robin pattern of B30: the conversations made first (spread over the
    instances), then for each one the SSE stream opened on one instance and the send posted to
    another, a new conversation per turn: every reader gets its turn's End. (The placements
    are chosen, not left to HAProxy: with the reader on the instance that made the
    conversation and a new owner that does not move its log above every id issued before,
    the reader's log drops the owner's events as repeats: B30's lost Ends.)"""
    cluster.start(3, ROUND_ROBIN)
    nodes = cluster.instances
    await reset_fake(fake_openai_proc, {"text": "a b c d e f g h", "delay": 0.005})
    turns = int(os.environ.get("AGENTIK_TEST_RR_TURNS", "24"))
    missing = []
    async with aiohttp.ClientSession() as s:
        cids = [await create(s, nodes[i % 3].base) for i in range(turns)]
        for i, cid in enumerate(cids):
            # every placement: the reader and the sender each on a third instance, or one
            # of them on the instance that made the conversation
            r, w = PLACES[(i // 3) % len(PLACES)]
            reader, sender = nodes[(i + r) % 3], nodes[(i + w) % 3]
            events = await s.get(f"{reader.base}/agentik/conversations/{cid}/events")
            await send(s, sender.base, cid, f"turn {i}")
            try:
                frames = await read_sse(events, timeout=10)
            except TimeoutError:
                missing.append(i)
                continue
            finally:
                events.close()
            assert [f["event"] for f in frames].count("End") == 1
    assert not missing, f"turns whose End never came: {missing} of {turns}"
