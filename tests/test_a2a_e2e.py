"""A2A end to end: the a2a-sdk Python client (``create_client``) against the real ``agentik
serve`` with the fake OpenAI server; a crash mid-task and the restart after it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import AsyncIterator

import aiohttp
import httpx
import pytest
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory, create_client
from a2a.server.tasks.task_manager import append_artifact_to_task
from a2a.types import a2a_pb2 as pb

from tests.conftest import ROOT, read_sse, script_fake
from tests.test_a2a import stored_states
from tests.test_serve import openai_env

KEY = "a2a-e2e-key-0123456789"


def message(text: str, context_id: str = "") -> pb.SendMessageRequest:
    return pb.SendMessageRequest(
        message=pb.Message(
            role=pb.ROLE_USER,
            message_id=f"m-{text}",
            context_id=context_id,
            parts=[pb.Part(text=text)],
        )
    )


def wire_message(text: str, message_id: str, context_id: str = "") -> dict:
    return {
        "role": "ROLE_USER",
        "messageId": message_id,
        "contextId": context_id,
        "parts": [{"text": text}],
    }


@contextlib.asynccontextmanager
async def sdk_client(base: str, version: str, *, streaming: bool) -> AsyncIterator[Client]:
    """The a2a-sdk client speaking ``version`` ("1.0", or "0.3": its ``CompatJsonRpcTransport``,
    as it talks to an agent whose card offers only 0.3), built from the served card."""
    async with httpx.AsyncClient(timeout=30) as http:
        card = await A2ACardResolver(http, base + "/a2a").get_agent_card()
        keep = [i for i in card.supported_interfaces if i.protocol_version == version]
        assert keep, card.supported_interfaces
        del card.supported_interfaces[:]
        card.supported_interfaces.extend(keep)
        client = ClientFactory(ClientConfig(streaming=streaming, httpx_client=http)).create(card)
        try:
            yield client
        finally:
            await client.close()


def folded(events: list[pb.StreamResponse]) -> pb.Task:
    """The task a client builds from a stream: the first event's task, then each update folded
    in with a2a-sdk's own ``append_artifact_to_task`` (which refuses an ``append`` to an
    artifact it never got)."""
    task = pb.Task()
    task.CopyFrom(events[0].task)
    for event in events[1:]:
        if event.HasField("artifact_update"):
            append_artifact_to_task(task, event.artifact_update)
        elif event.HasField("status_update"):
            task.status.CopyFrom(event.status_update.status)
    return task


def reply_text(task: pb.Task) -> str:
    return "".join(p.text for a in task.artifacts for p in a.parts)


async def fake_requests(fake: str) -> list[dict]:
    async with (
        aiohttp.ClientSession() as s,
        s.get(fake.removesuffix("/v1") + "/_fake/requests") as r,
    ):
        return await r.json()


async def history(base: str, cid: str, headers=None) -> list[dict]:
    async with (
        aiohttp.ClientSession(headers=headers) as s,
        s.get(f"{base}/agentik/conversations/{cid}/messages?limit=200") as r,
    ):
        return (await r.json())["items"]


async def test_sdk_client_streams_gets_and_continues_a_context(serve, fake_openai_proc):
    proc, base = serve(openai_env(fake_openai_proc))
    banner = proc.wait_output("a2a: JSON-RPC")
    assert f"a2a: agent card {base}/a2a/.well-known/agent-card.json" in banner
    assert f"a2a: JSON-RPC {base}/a2a/ (A2A 1.0 and 0.3)" in banner
    await script_fake(fake_openai_proc, {"text": "Hello from the agent", "chunks": 4})
    client = await create_client(base + "/a2a", client_config=ClientConfig(streaming=True))
    try:
        events = [e async for e in client.send_message(message("hi"))]
        kinds = [e.WhichOneof("payload") for e in events]
        # 4 chunks: one update each, or fewer when they were read together (joined)
        assert kinds[0] == "task" and 1 <= kinds.count("artifact_update") <= 4
        text = "".join(
            e.artifact_update.artifact.parts[0].text
            for e in events
            if e.HasField("artifact_update")
        )
        assert text == "Hello from the agent"
        assert events[-1].status_update.status.state == pb.TASK_STATE_COMPLETED
        task_id, context_id = events[0].task.id, events[0].task.context_id
        task = await client.get_task(pb.GetTaskRequest(id=task_id))
        assert task.status.state == pb.TASK_STATE_COMPLETED
        assert task.artifacts[0].parts[0].text == "Hello from the agent"
        cid = task.metadata["agentikConversationId"]
    finally:
        await client.close()
    # not streaming, the same context: the same conversation, the model sees both turns
    plain = await create_client(base + "/a2a", client_config=ClientConfig(streaming=False))
    try:
        (reply,) = [e async for e in plain.send_message(message("again", context_id))]
        assert reply.task.status.state == pb.TASK_STATE_COMPLETED
        assert reply.task.metadata["agentikConversationId"] == cid
        assert reply.task.artifacts[0].parts[0].text == "echo: again"
        listed = await plain.list_tasks(pb.ListTasksRequest(context_id=context_id))
        assert {t.id for t in listed.tasks} == {task_id, reply.task.id}
    finally:
        await plain.close()
    records = await history(base, cid)
    assert [r["type"] for r in records] == ["user", "assistant", "user", "assistant"]
    last = (await fake_requests(fake_openai_proc))[-1]
    assert [m["role"] for m in last["messages"]][-3:] == ["user", "assistant", "user"]


async def test_sdk_client_with_an_api_key_and_a_cancel(serve, fake_openai_proc):
    _, base = serve({**openai_env(fake_openai_proc), "AGENTIK_API_KEY": KEY})
    await script_fake(fake_openai_proc, {"text": "slow " * 300, "delay": 0.02})
    auth = {"Authorization": f"Bearer {KEY}"}
    http = httpx.AsyncClient(headers=auth, timeout=30)
    client = await create_client(
        base + "/a2a", client_config=ClientConfig(streaming=True, httpx_client=http)
    )
    try:
        stream = client.send_message(message("long"))
        first = await anext(stream)
        task_id = first.task.id
        async for event in stream:
            if event.HasField("artifact_update"):
                break
        # a second client subscribes to the running task
        subscription = client.subscribe(pb.SubscribeToTaskRequest(id=task_id))
        now = await anext(subscription)
        assert now.task.id == task_id and now.task.status.state == pb.TASK_STATE_WORKING
        canceled = await client.cancel_task(pb.CancelTaskRequest(id=task_id))
        assert canceled.status.state == pb.TASK_STATE_CANCELED
        rest = [e async for e in stream]
        assert rest[-1].status_update.status.state == pb.TASK_STATE_CANCELED
        followed = [e async for e in subscription]
        assert followed[-1].status_update.status.state == pb.TASK_STATE_CANCELED
    finally:
        await client.close()
        await http.aclose()
    records = await history(base, canceled.metadata["agentikConversationId"], auth)
    assert records[-1]["type"] == "assistant" and records[-1]["interrupted"] is True
    # 0.3 names over raw JSON-RPC (no A2A-Version header), as the seeds' clients speak
    async with aiohttp.ClientSession(headers=auth) as s:
        v03 = {
            "jsonrpc": "2.0",
            "id": "old",
            "method": "message/send",
            "params": {
                "message": {
                    "kind": "message",
                    "role": "user",
                    "messageId": "legacy-1",
                    "parts": [{"kind": "text", "text": "legacy"}],
                }
            },
        }
        async with s.post(base + "/a2a", json=v03) as r:
            old = (await r.json())["result"]
        assert old["kind"] == "task" and old["status"]["state"] == "completed"
        assert old["artifacts"][0]["parts"] == [{"kind": "text", "text": "echo: legacy"}]
        get = {"jsonrpc": "2.0", "id": "g", "method": "tasks/get", "params": {"id": old["id"]}}
        async with s.post(base + "/a2a/", json=get) as r:
            assert (await r.json())["result"]["status"]["state"] == "completed"
    async with httpx.AsyncClient() as anonymous:  # the card is public, the endpoint is not
        assert (await anonymous.get(base + "/a2a/.well-known/agent-card.json")).status_code == 200
        r = await anonymous.post(
            base + "/a2a/", json={"jsonrpc": "2.0", "id": 1, "method": "GetTask"}
        )
        assert r.status_code == 401


@pytest.mark.sqlite_file
async def test_kill_9_mid_task_then_restart_the_task_completes(serve, fake_openai_proc, tmp_path):
    env = openai_env(fake_openai_proc)
    proc, base = serve(env)
    await script_fake(fake_openai_proc, {"text": "cut " * 500, "delay": 0.02})
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendStreamingMessage",
        "params": {"message": {"role": "ROLE_USER", "messageId": "k1", "parts": [{"text": "go"}]}},
    }
    async with aiohttp.ClientSession(headers={"A2A-Version": "1.0"}) as s:
        r = await s.post(base + "/a2a/", json=body)
        task = None
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            result = json.loads(line[6:])["result"]
            task = task or result["task"]
            if "artifactUpdate" in result:
                break
        proc.stop(signal.SIGKILL)
    _proc2, base2 = serve(env)
    async with aiohttp.ClientSession(headers={"A2A-Version": "1.0"}) as s:
        # its turn had recorded nothing when the process died: it runs again, and the task,
        # followed again after the restart, completes
        get = {"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": task["id"]}}
        for _ in range(400):
            async with s.post(base2 + "/a2a/", json=get) as r:
                got = (await r.json())["result"]
            if got["status"]["state"] == "TASK_STATE_COMPLETED":
                break
            await asyncio.sleep(0.05)
        assert got["status"]["state"] == "TASK_STATE_COMPLETED"
        assert got["artifacts"][0]["parts"][0]["text"] == "echo: go"
        states = stored_states(tmp_path / "agentik.db", task["id"])
        assert states[0] == "TASK_STATE_SUBMITTED" and states[-1] == "TASK_STATE_COMPLETED"
        cid = got["metadata"]["agentikConversationId"]
        records = await history(base2, cid)
        assert records[0]["type"] == "user" and records[0]["content"][0]["body"] == "go"
        # the context goes on in the same conversation after the restart
        more = {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "SendMessage",
            "params": {
                "message": {
                    "role": "ROLE_USER",
                    "messageId": "k2",
                    "contextId": task["contextId"],
                    "parts": [{"text": "after"}],
                }
            },
        }
        async with s.post(base2 + "/a2a/", json=more) as r:
            again = (await r.json())["result"]["task"]
        assert again["metadata"]["agentikConversationId"] == cid
        assert again["status"]["state"] == "TASK_STATE_COMPLETED"
    await asyncio.sleep(0)


async def test_the_a2a_js_client(serve, fake_openai_proc):
    """@a2a-js/sdk (tests/a2a/client.mjs): send, stream in the same context, get, list, and a
    missing task's error as its typed error, with an API key."""
    _, base = serve({**openai_env(fake_openai_proc), "AGENTIK_API_KEY": KEY})
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(ROOT / "tests" / "a2a" / "client.mjs"),
        base,
        KEY,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    seen = json.loads(out)
    assert seen["sent"]["state"] == pb.TASK_STATE_COMPLETED
    assert seen["sent"]["text"] == "echo: hello js"
    assert seen["sent"]["conversationId"].startswith("conv-")
    assert seen["stream"]["kinds"][0] == "task" and seen["stream"]["kinds"][-1] == "statusUpdate"
    assert "artifactUpdate" in seen["stream"]["kinds"]
    assert seen["stream"]["text"] == "echo: stream js" and seen["stream"]["last"] == 3
    assert seen["got"] == {"state": pb.TASK_STATE_COMPLETED, "text": "echo: stream js"}
    assert seen["listed"] == {"ids": [seen["stream"]["id"], seen["sent"]["id"]], "total": 2}
    assert seen["missing"]["name"] == "JsonRpcTaskNotFoundError"
    records = await history(
        base, seen["sent"]["conversationId"], {"Authorization": f"Bearer {KEY}"}
    )
    assert [r["type"] for r in records] == ["user", "assistant", "user", "assistant"]


async def test_20_a2a_streams_and_20_sse_listeners(serve, fake_openai_proc):
    """20 A2A clients stream at once, each in its own context, while an HTTP SSE listener
    follows each conversation: every A2A stream and every SSE stream is complete and ordered."""
    _, base = serve(openai_env(fake_openai_proc))
    n, chunks = 20, 30
    words = " ".join(f"w{i}" for i in range(chunks))
    async with aiohttp.ClientSession(headers={"A2A-Version": "1.0"}) as s:
        # a first turn in each context makes the conversations to listen to
        contexts = [f"ctx-{i}" for i in range(n)]
        cids = []
        for ctx in contexts:
            body = {
                "jsonrpc": "2.0",
                "id": ctx,
                "method": "SendMessage",
                "params": {"message": wire_message("first", ctx, ctx)},
            }
            async with s.post(base + "/a2a/", json=body) as r:
                cids.append((await r.json())["result"]["task"]["metadata"]["agentikConversationId"])

        async def listen(cid: str) -> list[str]:
            async with s.get(f"{base}/agentik/conversations/{cid}/events") as r:
                frames = await read_sse(r, timeout=60)
            return [f["data"]["text"] for f in frames if f["event"] == "AppendText"]

        async def stream(ctx: str) -> list[dict]:
            body = {
                "jsonrpc": "2.0",
                "id": ctx,
                "method": "SendStreamingMessage",
                "params": {"message": wire_message("second", ctx + "-2", ctx)},
            }
            results = []
            async with s.post(base + "/a2a/", json=body) as r:
                async for raw in r.content:
                    line = raw.decode().strip()
                    if line.startswith("data: "):
                        results.append(json.loads(line[6:])["result"])
            return results

        await script_fake(fake_openai_proc, *[{"text": words, "chunks": chunks}] * n)
        listeners = [asyncio.ensure_future(listen(cid)) for cid in cids]
        await asyncio.sleep(0.3)  # the listeners are subscribed
        streams = await asyncio.wait_for(asyncio.gather(*(stream(c) for c in contexts)), 90)
        heard = await asyncio.wait_for(asyncio.gather(*listeners), 30)
    expected = words.split(" ")
    for ctx, results, sse_text in zip(contexts, streams, heard, strict=True):
        assert results[0]["task"]["contextId"] == ctx
        text = [
            r["artifactUpdate"]["artifact"]["parts"][0]["text"]
            for r in results
            if "artifactUpdate" in r
        ]
        assert "".join(text).split() == expected, ctx
        assert results[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
        assert "".join(sse_text) == "".join(text)


# --- turns in which the model calls a tool (memory tools are on by default) -----------------

SAVED = "I will remember Bruno."


def memory_env(fake: str, tmp_path) -> dict[str, str]:
    return openai_env(
        fake,
        AGENTIK_MEMORY_BACKEND="md",
        AGENTIK_MEMORY_DIR=str(tmp_path / "memory"),
        AGENTIK_MEMORY_REVIEW="0",
    )


async def script_tool_turn(fake: str) -> None:
    note = {"category": "user", "text": "The user's dog is named Bruno"}
    await script_fake(fake, {"tool_calls": [["memory_save", note]]}, {"text": SAVED, "chunks": 3})


@pytest.mark.parametrize("version", ["1.0", "0.3"])
async def test_a_turn_that_calls_a_tool_completes(serve, fake_openai_proc, tmp_path, version):
    """The model calls memory_save, then answers: streamed, the client sees the tool call as a
    WORKING update and the reply; not streamed, the finished task; in 1.0 and in 0.3."""
    _, base = serve(memory_env(fake_openai_proc, tmp_path))
    await script_tool_turn(fake_openai_proc)
    async with sdk_client(base, version, streaming=True) as client:
        events = [e async for e in client.send_message(message(f"remember {version}"))]
    calls = [
        e.status_update.status.message
        for e in events
        if e.HasField("status_update") and e.status_update.status.message.parts
    ]
    assert [m.parts[0].text for m in calls] == ["calling memory_save"]
    assert calls[0].metadata["toolCall"]["name"] == "memory_save"
    assert events[-1].status_update.status.state == pb.TASK_STATE_COMPLETED
    task = folded(events)
    assert task.status.state == pb.TASK_STATE_COMPLETED and reply_text(task) == SAVED
    chunks = [e.artifact_update for e in events if e.HasField("artifact_update")]
    # the reply's chunks (joined when read together): the last one says so
    assert chunks and [c.last_chunk for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert "".join(c.artifact.parts[0].text for c in chunks) == SAVED
    assert "Bruno" in (tmp_path / "memory" / "user.md").read_text()

    await script_tool_turn(fake_openai_proc)
    async with sdk_client(base, version, streaming=False) as client:
        (reply,) = [e async for e in client.send_message(message(f"again {version}"))]
    assert reply.task.status.state == pb.TASK_STATE_COMPLETED
    assert reply_text(reply.task) == SAVED
    records = await history(base, reply.task.metadata["agentikConversationId"])
    assert [r["type"] for r in records] == ["user", "tool_call", "tool_result", "assistant"]


# --- subscribing to a running task, reading it mid-turn ------------------------------------


@pytest.mark.parametrize("version", ["1.0", "0.3"])
async def test_a_subscription_mid_turn_gets_the_whole_reply(serve, fake_openai_proc, version):
    """A second client subscribes while the reply streams: its first event is the task with the
    text so far, the appends continue it, and it ends with the whole reply; GetTask during the
    turn shows the text so far."""
    _, base = serve(openai_env(fake_openai_proc))
    words = " ".join(f"w{i}" for i in range(80))
    await script_fake(fake_openai_proc, {"text": words, "delay": 0.03})
    async with sdk_client(base, version, streaming=True) as client:
        stream = client.send_message(message(f"talk {version}"))
        task_id = (await anext(stream)).task.id
        seen = 0
        async for event in stream:
            seen += event.HasField("artifact_update")
            if seen == 5:
                break
        await stream.aclose()  # the first client leaves; the task goes on
        now = await client.get_task(pb.GetTaskRequest(id=task_id))
        assert now.status.state == pb.TASK_STATE_WORKING
        partial = reply_text(now)
        assert len(partial.split()) >= 4 and words.startswith(partial)
        events = [e async for e in client.subscribe(pb.SubscribeToTaskRequest(id=task_id))]
    assert events[0].task.id == task_id and words.startswith(reply_text(events[0].task))
    assert reply_text(events[0].task)  # the text streamed before the subscription
    task = folded(events)
    assert task.status.state == pb.TASK_STATE_COMPLETED
    assert reply_text(task) == words
