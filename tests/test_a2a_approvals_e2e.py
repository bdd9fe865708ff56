"""Tool approvals over A2A, end to end: the a2a-sdk client (1.0 and 0.3, streaming and not)
against the real ``agentik serve``. A turn that waits for a person makes its task
``INPUT_REQUIRED`` with each request as a data part; a message in the same task answers (the text
yes/no, or data parts with the call ids), and the task ends ``COMPLETED`` with the reply. A bad
answer is an A2A error and changes nothing."""

from __future__ import annotations

import signal
import uuid
from typing import Any

import pytest
from a2a.client import Client
from a2a.types import a2a_pb2 as pb
from google.protobuf.json_format import MessageToDict

from tests.conftest import script_fake
from tests.test_a2a_e2e import folded, history, reply_text, sdk_client
from tests.test_approvals_e2e import env_for, runs

VERSIONS = ["1.0", "0.3"]


def ask(text: str) -> pb.SendMessageRequest:
    return pb.SendMessageRequest(
        message=pb.Message(
            role=pb.ROLE_USER, message_id=str(uuid.uuid4()), parts=[pb.Part(text=text)]
        )
    )


def answer(task: pb.Task, *parts: str | dict[str, Any]) -> pb.SendMessageRequest:
    """A message in ``task``: text parts and data parts."""
    message = pb.Message(
        role=pb.ROLE_USER,
        message_id=str(uuid.uuid4()),
        task_id=task.id,
        context_id=task.context_id,
    )
    for part in parts:
        if isinstance(part, str):
            message.parts.add(text=part)
        else:
            message.parts.add().data.struct_value.update(part)
    return pb.SendMessageRequest(message=message)


async def send(client: Client, request: pb.SendMessageRequest) -> tuple[pb.Task, list[Any]]:
    """The task as the client sees it after one send (streamed: folded from the events), and
    the events."""
    events = [e async for e in client.send_message(request)]
    if len(events) == 1 and events[0].HasField("task"):
        return events[0].task, events
    return folded(events), events


def requests_of(task: pb.Task) -> list[dict[str, Any]]:
    """The approval requests of an ``INPUT_REQUIRED`` task's status message."""
    assert task.status.state == pb.TASK_STATE_INPUT_REQUIRED, pb.TaskState.Name(task.status.state)
    return [
        MessageToDict(p.data)
        for p in task.status.message.parts
        if p.WhichOneof("content") == "data"
    ]


@pytest.mark.parametrize("streaming", [True, False], ids=["stream", "plain"])
@pytest.mark.parametrize("version", VERSIONS)
async def test_a_task_asks_and_yes_completes_it(
    serve, fake_openai_proc, tmp_path, version, streaming
):
    _, base = serve(env_for(fake_openai_proc, tmp_path))
    await script_fake(
        fake_openai_proc,
        {"tool_calls": [["launch", {"target": "moon"}]]},
        {"text": "launched, as you said", "chunks": 3},
    )
    async with sdk_client(base, version, streaming=streaming) as client:
        task, events = await send(client, ask("launch at the moon"))
        [request] = requests_of(task)
        assert request["type"] == "approvalRequest"
        assert request["toolName"] == "launch" and request["args"] == {"target": "moon"}
        assert request["callId"]
        if streaming:  # the stream ended at INPUT_REQUIRED
            assert events[-1].status_update.status.state == pb.TASK_STATE_INPUT_REQUIRED
        assert runs(tmp_path) == []
        stored = await client.get_task(pb.GetTaskRequest(id=task.id))
        assert requests_of(stored) == [request]

        done, events = await send(client, answer(task, "yes"))
        assert done.id == task.id
        assert done.status.state == pb.TASK_STATE_COMPLETED
        assert reply_text(done) == "launched, as you said"
        if streaming:
            states = [e.status_update.status.state for e in events if e.HasField("status_update")]
            if events[0].HasField("task"):  # the task as it stood when the stream began
                states.insert(0, events[0].task.status.state)
            # working, then completed; or, when the turn was over before the stream began
            # (a loaded machine), the completed task alone
            assert states[0] in (pb.TASK_STATE_WORKING, pb.TASK_STATE_COMPLETED), states
            assert states[-1] == pb.TASK_STATE_COMPLETED, states
        again = await client.get_task(pb.GetTaskRequest(id=task.id))
        assert again.status.state == pb.TASK_STATE_COMPLETED
    assert runs(tmp_path) == ["moon"]
    records = await history(base, task.metadata["agentikConversationId"])
    assert [r["type"] for r in records] == [
        "user", "tool_call", "approval", "approval", "tool_result", "assistant"
    ]  # fmt: skip


@pytest.mark.parametrize("version", VERSIONS)
async def test_two_requests_bad_answers_then_an_edit_and_a_denial(
    serve, fake_openai_proc, tmp_path, version
):
    """Two calls in one step: both in one INPUT_REQUIRED status. A bare yes, an unknown call
    id, args that do not fit the tool: each an A2A error, nothing answered. Then one message
    approves the first with other arguments and denies the second with a note."""
    _, base = serve(env_for(fake_openai_proc, tmp_path))
    await script_fake(
        fake_openai_proc,
        {"tool_calls": [["launch", {"target": "moon"}], ["launch", {"target": "sun"}]]},
        {"text": "one of two"},
    )
    async with sdk_client(base, version, streaming=True) as client:
        task, _ = await send(client, ask("launch both"))
        moon, sun = requests_of(task)
        assert (moon["args"], sun["args"]) == ({"target": "moon"}, {"target": "sun"})

        for bad, said in [
            (("yes",), "2 calls wait for approval"),
            (({"approve": True, "callId": "call-nope"},), "no call 'call-nope' waits"),
            (({"approve": True, "callId": moon["callId"], "args": {"target": 5}},),
             "args do not fit launch"),
            (({"approve": True, "callId": moon["callId"]}, "maybe"), "is not an answer"),
        ]:  # fmt: skip
            with pytest.raises(Exception, match=said):
                await send(client, answer(task, *bad))
        still = await client.get_task(pb.GetTaskRequest(id=task.id))
        assert [r["callId"] for r in requests_of(still)] == [moon["callId"], sun["callId"]]
        assert runs(tmp_path) == []

        # one at a time: the first answer leaves the task asking for the other
        edit = {"approve": True, "callId": moon["callId"], "args": {"target": "mars"}}
        half, _ = await send(client, answer(task, edit))
        assert [r["callId"] for r in requests_of(half)] == [sun["callId"]]
        done, _ = await send(client, answer(task, {"approve": False, "note": "too hot"}))
        assert done.status.state == pb.TASK_STATE_COMPLETED
        assert reply_text(done) == "one of two"
    assert runs(tmp_path) == ["mars"]
    records = await history(base, task.metadata["agentikConversationId"])
    results = [r["text"] for r in records if r["type"] == "tool_result"]
    assert results == ["launched at mars", "Error: a person denied this call: too hot"]
    edited = [r for r in records if r["type"] == "approval"][2]
    assert edited["argsJson"] == '{"target": "moon"}'
    assert edited["editedArgsJson"] == '{"target": "mars"}'


async def test_no_denies_and_a_task_asks_again_after_a_restart(serve, fake_openai_proc, tmp_path):
    """Not streamed (1.0): INPUT_REQUIRED survives a kill -9 of the server (the task and the
    turn's wait are both in the store), and "no" answers it then."""
    env = env_for(fake_openai_proc, tmp_path)
    proc, base = serve(env)
    await script_fake(
        fake_openai_proc,
        {"tool_calls": [["launch", {"target": "moon"}]]},
        {"text": "not launched"},
    )
    async with sdk_client(base, "1.0", streaming=False) as client:
        task, _ = await send(client, ask("launch"))
        [request] = requests_of(task)
    proc.stop(signal.SIGKILL)
    _, base = serve(env)
    async with sdk_client(base, "1.0", streaming=False) as client:
        stored = await client.get_task(pb.GetTaskRequest(id=task.id))
        assert requests_of(stored) == [request]
        done, _ = await send(client, answer(task, "No"))
        assert done.status.state == pb.TASK_STATE_COMPLETED
        assert reply_text(done) == "not launched"
        with pytest.raises(Exception, match="TASK_STATE_COMPLETED"):  # over: nothing to answer
            await send(client, answer(task, "yes"))
    assert runs(tmp_path) == []


@pytest.mark.sqlite_file  # edits the task in the SQLite file, as the kill left it
async def test_a_stop_before_the_task_asked_asks_after_the_restart(
    serve, fake_openai_proc, tmp_path
):
    """The turn's wait is written before its task says INPUT_REQUIRED: a kill -9 in between
    leaves a task WORKING whose turn waits. The restart makes it ask (else nothing would)."""
    import json
    import sqlite3

    env = env_for(fake_openai_proc, tmp_path)
    proc, base = serve(env)
    await script_fake(
        fake_openai_proc,
        {"tool_calls": [["launch", {"target": "moon"}]]},
        {"text": "launched after all"},
    )
    async with sdk_client(base, "1.0", streaming=False) as client:
        task, _ = await send(client, ask("launch"))
        [request] = requests_of(task)
    proc.stop(signal.SIGKILL)
    with sqlite3.connect(tmp_path / "agentik.db") as db:  # the task as it was before it asked
        [(raw,)] = db.execute("SELECT task_json FROM a2a_task WHERE id = ?", (task.id,))
        stored = json.loads(raw)
        stored["status"] = {"state": "TASK_STATE_WORKING"}
        db.execute(
            "UPDATE a2a_task SET state = 'TASK_STATE_WORKING', task_json = ? WHERE id = ?",
            (json.dumps(stored), task.id),
        )
    _, base = serve(env)
    async with sdk_client(base, "1.0", streaming=False) as client:
        asked = await client.get_task(pb.GetTaskRequest(id=task.id))
        assert requests_of(asked) == [request]
        done, _ = await send(client, answer(task, "yes"))
        assert done.status.state == pb.TASK_STATE_COMPLETED
        assert reply_text(done) == "launched after all"
    assert runs(tmp_path) == ["moon"]


def test_an_answers_whole_numbers_stay_integers_and_bad_answers_are_named():
    """A data part's numbers travel as doubles (protobuf ``Value``): an edited ``{"n": 5}``
    reaches the tool's schema as 5, not 5.0. Unit test of the reading alone."""
    from a2a.utils import errors

    from agentik.core.approvals import PendingApproval
    from agentik_transport_a2a.approvals import read_answers

    one = [PendingApproval("c1", "count", '{"n": 1}', "msg-1", None)]
    two = [*one, PendingApproval("c2", "count", '{"n": 2}', "msg-1", None)]
    part = pb.Part()
    part.data.struct_value.update({"approve": True, "args": {"n": 5, "xs": [1, 2.5]}})
    [(call_id, raw)] = read_answers("t", [part], one)
    assert call_id == "c1" and raw == {"approve": True, "args": {"n": 5, "xs": [1, 2.5]}}
    assert type(raw["args"]["n"]) is int
    assert read_answers("t", [pb.Part(text=" No. ")], one) == [("c1", {"approve": False})]
    with pytest.raises(errors.InvalidParamsError, match=r"2 calls wait for approval \(c1, c2\)"):
        read_answers("t", [pb.Part(text="yes")], two)
    with pytest.raises(errors.InvalidParamsError, match="answered twice"):
        read_answers("t", [pb.Part(text="yes"), pb.Part(text="no")], one)
    with pytest.raises(errors.InvalidParamsError, match="waits for no approval"):
        read_answers("t", [pb.Part(text="yes")], [])


async def test_answered_over_http_or_cancelled_while_it_asks(serve, fake_openai_proc, tmp_path):
    """A call answered through the agent's HTTP API moves the A2A task on to COMPLETED; a task
    cancelled while it asks ends CANCELED and its call never runs."""
    import asyncio

    from agentik.client import RemoteAgent

    _, base = serve(env_for(fake_openai_proc, tmp_path))
    await script_fake(
        fake_openai_proc,
        {"tool_calls": [["launch", {"target": "moon"}]]},
        {"text": "done over http"},
        {"tool_calls": [["launch", {"target": "sun"}]]},
    )
    async with sdk_client(base, "1.0", streaming=False) as client:
        task, _ = await send(client, ask("launch"))
        [request] = requests_of(task)
        async with RemoteAgent(base) as agent:
            conv = await agent.get_conversation(task.metadata["agentikConversationId"])
            assert conv is not None
            assert await conv.approve(request["callId"]) == "running"
        for _ in range(200):
            now = await client.get_task(pb.GetTaskRequest(id=task.id))
            if now.status.state == pb.TASK_STATE_COMPLETED:
                break
            await asyncio.sleep(0.05)
        assert now.status.state == pb.TASK_STATE_COMPLETED
        assert reply_text(now) == "done over http"

        second, _ = await send(client, ask("launch again"))
        requests_of(second)
        cancelled = await client.cancel_task(pb.CancelTaskRequest(id=second.id))
        assert cancelled.status.state == pb.TASK_STATE_CANCELED
    assert runs(tmp_path) == ["moon"]
