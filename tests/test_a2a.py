"""The A2A transport in process: the JSON-RPC envelope and its error table, the version rules,
the 0.3 names, the agent card, tasks on the agent (send, get, list, cancel, subscribe) over raw
JSON-RPC. The a2a-sdk client against ``agentik serve`` is in test_a2a_e2e.py."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys

import pytest

from agentik.core.testing import ScriptedLLM, make_app
from tests.conftest import ROOT

KEY = "a2a-test-key-0123456789"
BUILTINS = ("agentik_transport_http", "agentik_transport_a2a")
INFO = "type.googleapis.com/google.rpc.ErrorInfo"


def a2a_app(tmp_path, llm=None, **env):
    return make_app(
        llm=llm or ScriptedLLM(),
        builtins=BUILTINS,
        env={"AGENTIK_DB_PATH": str(tmp_path / "a2a.db"), **env},
    )


def text_message(text: str, **extra) -> dict:
    return {"role": "ROLE_USER", "messageId": f"m-{text}", "parts": [{"text": text}], **extra}


async def rpc(client, method, params=None, *, version="1.0", rid=1, headers=None, raw=None):
    h = {"A2A-Version": version} if version else {}
    h.update(headers or {})
    body = raw if raw is not None else {"jsonrpc": "2.0", "id": rid, "method": method}
    if raw is None and params is not None:
        body["params"] = params
    r = await client.post("/a2a/", json=body, headers=h)
    assert r.status == 200, await r.text()
    return await r.json()


async def sse(resp) -> list[dict]:
    """The JSON-RPC responses of an SSE answer, until it ends."""
    out = []
    async for raw in resp.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("data: "):
            out.append(json.loads(line[6:]))
    return out


def stored_states(db_path, task_id: str) -> list[str]:
    """The task's status history as stored (``a2a_task_status``), read from the file."""
    with sqlite3.connect(db_path) as db:
        rows = db.execute(
            "SELECT state FROM a2a_task_status WHERE task_id = ? ORDER BY seq", (task_id,)
        ).fetchall()
    return [state for (state,) in rows]


def reason(answer: dict) -> str:
    (info,) = [d for d in answer["error"]["data"] if d["@type"] == INFO]
    assert info["domain"] == "a2a-protocol.org"
    return info["reason"]


# --- the envelope and the error table ---------------------------------------------------------


async def test_every_envelope_error_has_its_code_and_reason(aiohttp_client, tmp_path):
    client = await aiohttp_client(a2a_app(tmp_path))

    async def post(data: bytes, ctype="application/json", version="1.0"):
        r = await client.post(
            "/a2a", data=data, headers={"Content-Type": ctype, "A2A-Version": version}
        )
        assert r.status == 200
        return await r.json()

    answer = await post(b"{not json")
    assert answer["error"]["code"] == -32700 and answer["id"] is None
    answer = await post(b'[{"jsonrpc": "2.0", "id": 1, "method": "GetTask"}]')
    assert answer["error"]["code"] == -32600 and reason(answer) == "INVALID_REQUEST"
    assert "batch" in answer["error"]["message"]
    answer = await post(b'{"jsonrpc": "1.0", "id": 7, "method": "GetTask"}')
    assert answer["error"]["code"] == -32600 and answer["id"] == 7
    for bad_id in (b"true", b"1.5", b"{}", b"[1]"):
        answer = await post(b'{"jsonrpc": "2.0", "id": ' + bad_id + b', "method": "GetTask"}')
        assert answer["error"]["code"] == -32600 and answer["id"] is None, bad_id
    answer = await post(b'{"jsonrpc": "2.0", "id": "x", "method": "NoSuchMethod"}')
    assert answer["error"]["code"] == -32601 and reason(answer) == "METHOD_NOT_FOUND"
    assert answer["id"] == "x"
    answer = await post(b'{"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": [1]}')
    assert answer["error"]["code"] == -32602 and reason(answer) == "INVALID_PARAMS"
    answer = await post(b'{"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": 5}}')
    assert answer["error"]["code"] == -32602
    # a body that is not JSON: the spec's content-type error, not the middleware's 415
    answer = await post(b'{"jsonrpc": "2.0", "id": 3, "method": "GetTask"}', ctype="text/plain")
    assert answer["error"]["code"] == -32005 and reason(answer) == "CONTENT_TYPE_NOT_SUPPORTED"


async def test_a2a_errors_have_their_codes_and_reasons(aiohttp_client, tmp_path):
    client = await aiohttp_client(a2a_app(tmp_path))
    cases = [
        ("GetTask", {"id": "nope"}, -32001, "TASK_NOT_FOUND"),
        ("CancelTask", {"id": "nope"}, -32001, "TASK_NOT_FOUND"),
        ("SubscribeToTask", {"id": "nope"}, -32001, "TASK_NOT_FOUND"),
        (
            "CreateTaskPushNotificationConfig",
            {"taskId": "t", "url": "https://example.com/hook"},
            -32003,
            "PUSH_NOTIFICATION_NOT_SUPPORTED",
        ),
        ("GetTaskPushNotificationConfig", {"taskId": "t", "id": "c"}, -32003, None),
        ("ListTaskPushNotificationConfigs", {"taskId": "t"}, -32003, None),
        ("DeleteTaskPushNotificationConfig", {"taskId": "t", "id": "c"}, -32003, None),
        ("GetExtendedAgentCard", {}, -32007, "EXTENDED_AGENT_CARD_NOT_CONFIGURED"),
        (
            "SendMessage",
            {"message": {**text_message("x"), "parts": [{"url": "https://x/y.png"}]}},
            -32005,
            "CONTENT_TYPE_NOT_SUPPORTED",
        ),
        (
            "SendMessage",
            {"message": {**text_message("x"), "parts": [{"data": {"a": 1}}]}},
            -32005,
            None,
        ),
        ("SendMessage", {"message": {**text_message("x"), "parts": []}}, -32602, "INVALID_PARAMS"),
        # the sender's role is required, and must be the user's (as the reference answers)
        ("SendMessage", {"message": {"messageId": "r", "parts": [{"text": "x"}]}}, -32602, None),
        ("SendMessage", {"message": text_message("x", role="ROLE_UNSPECIFIED")}, -32602, None),
        ("SendMessage", {"message": text_message("x", role="ROLE_AGENT")}, -32602, None),
        ("SendMessage", {}, -32602, None),
        ("SendMessage", {"message": text_message("x", contextId="c" * 256)}, -32602, None),
        ("SendMessage", {"message": {**text_message("x"), "taskId": "nope"}}, -32001, None),
        ("ListTasks", {"pageSize": 1000}, -32602, None),
        ("ListTasks", {"pageToken": "garbage"}, -32602, None),
        ("GetTask", {"id": "x", "historyLength": -1}, -32602, None),
    ]
    for method, params, code, why in cases:
        answer = await rpc(client, method, params)
        assert answer["error"]["code"] == code, (method, params, answer)
        if why:
            assert reason(answer) == why, (method, answer)


async def test_version_rules(aiohttp_client, tmp_path):
    client = await aiohttp_client(a2a_app(tmp_path))
    # no header = 0.3: the 1.0 names are refused, the 0.3 names served
    answer = await rpc(client, "GetTask", {"id": "t"}, version=None)
    assert answer["error"]["code"] == -32009 and reason(answer) == "VERSION_NOT_SUPPORTED"
    answer = await rpc(client, "tasks/get", {"id": "t"}, version=None)
    assert answer["error"]["code"] == -32001  # served: the task does not exist
    assert "data" not in answer["error"] or not isinstance(answer["error"]["data"], list)
    answer = await rpc(client, "tasks/get", {"id": "t"}, version="0.3")
    assert answer["error"]["code"] == -32001
    for version in ("2.0", "banana", "0.3"):
        answer = await rpc(client, "GetTask", {"id": "t"}, version=version)
        assert answer["error"]["code"] == -32009, version
    answer = await rpc(client, "message/send", {}, version="1.0")
    assert answer["error"]["code"] == -32009
    assert (await rpc(client, "GetTask", {"id": "t"}, version="1.0.2"))["error"]["code"] == -32001


# --- the agent card -----------------------------------------------------------------------


def strict_card(card: dict):
    """The card read as the A2A 1.0 ``AgentCard`` protobuf with unknown fields refused, every
    field the proto marks REQUIRED (``google.api.field_behavior``) present, at every depth."""
    from a2a.types import a2a_pb2 as pb
    from google.api import field_behavior_pb2
    from google.protobuf.json_format import ParseDict

    parsed = ParseDict(card, pb.AgentCard(), ignore_unknown_fields=False)

    def missing(message, where: str) -> list[str]:
        out = []
        for field in message.DESCRIPTOR.fields:
            behaviors = field.GetOptions().Extensions[field_behavior_pb2.field_behavior]
            value = getattr(message, field.name)
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                values = field.message_type.fields_by_name["value"]
                children = list(value.values()) if values.message_type is not None else []
                present = bool(value)
            elif field.is_repeated:
                children = list(value) if field.message_type is not None else []
                present = bool(value)
            elif field.message_type is not None:
                present = message.HasField(field.name)
                children = [value] if present else []
            else:
                present, children = value != field.default_value, []
            if field_behavior_pb2.REQUIRED in behaviors and not present:
                out.append(where + field.name)
            for child in children:
                out += missing(child, f"{where}{field.name}.")
        return out

    assert missing(parsed, "") == []
    return parsed


async def test_agent_card_without_a_key(aiohttp_client, tmp_path):
    from a2a.compat.v0_3 import types as v03

    client = await aiohttp_client(a2a_app(tmp_path, AGENTIK_A2A_NAME="Ada"))
    url = str(client.make_url("/a2a/"))
    # a 1.0 client (A2A-Version 1.0, or the 1.0 discovery path at the root): the pure 1.0 card
    for path, headers in (
        ("/a2a/.well-known/agent-card.json", {"A2A-Version": "1.0"}),
        ("/.well-known/agent-card.json", {}),
    ):
        r = await client.get(path, headers=headers)
        assert r.status == 200 and r.headers["Vary"] == "A2A-Version"
        card = await r.json()
        assert strict_card(card).name == "Ada"  # nothing the 1.0 schema does not have
        assert {
            (i["url"], i["protocolBinding"], i["protocolVersion"])
            for i in card["supportedInterfaces"]
        } == {(url, "JSONRPC", "1.0"), (url, "JSONRPC", "0.3")}
        assert card["capabilities"] == {"streaming": True, "pushNotifications": False}
        assert "securitySchemes" not in card and card["skills"][0]["id"] == "chat"
    # a 0.3 client (no header at the seeds' path, or A2A-Version 0.3): the 0.3 fields as well
    for path, headers in (
        ("/a2a/.well-known/agent-card.json", {}),
        ("/.well-known/agent-card.json", {"A2A-Version": "0.3"}),
    ):
        r = await client.get(path, headers=headers)
        old = await r.json()
        assert old["url"] == url and old["protocolVersion"] == "0.3.0"
        assert v03.AgentCard.model_validate(old).url == url  # as a 0.3 client reads it
    # it names the Host the client used: that client's own, not for shared caches
    assert r.headers["Cache-Control"].startswith("private, max-age=")
    tag = {"If-None-Match": r.headers["ETag"]}
    again = await client.get("/.well-known/agent-card.json", headers={**tag, "A2A-Version": "0.3"})
    assert again.status == 304
    other = await client.get("/.well-known/agent-card.json", headers=tag)
    assert other.status == 200  # the 1.0 shape has a tag of its own
    # Last-Modified, and If-Modified-Since (only without If-None-Match)
    modified = r.headers["Last-Modified"]
    since = {"If-Modified-Since": modified}
    r = await client.get("/a2a/.well-known/agent-card.json", headers=since)
    assert r.status == 304 and r.headers["Last-Modified"] == modified
    r = await client.get(
        "/a2a/.well-known/agent-card.json",
        headers={"If-Modified-Since": "Mon, 01 Jan 2001 00:00:00 GMT"},
    )
    assert r.status == 200 and (await r.json())["name"] == "Ada"


async def test_agent_card_with_a_key_is_public_and_declares_bearer(aiohttp_client, tmp_path):
    from a2a.client.card_resolver import parse_agent_card
    from a2a.compat.v0_3 import types as v03

    client = await aiohttp_client(
        a2a_app(tmp_path, AGENTIK_API_KEY=KEY, AGENTIK_PUBLIC_URL="https://agent.example.com/")
    )
    card = await (await client.get("/.well-known/agent-card.json")).json()
    parsed = strict_card(card)
    assert card["securitySchemes"] == {"bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer"}}}
    assert card["securityRequirements"] == [{"schemes": {"bearer": {"list": []}}}]
    assert parsed.supported_interfaces[0].url == "https://agent.example.com/a2a/"
    r = await client.get("/a2a/.well-known/agent-card.json", headers={"Host": "evil.example"})
    assert r.status == 200
    assert r.headers["Cache-Control"].startswith("public, max-age=")  # the same for everyone
    old = await r.json()
    assert old["url"] == "https://agent.example.com/a2a/" and old["security"] == [{"bearer": []}]
    assert v03.AgentCard.model_validate(old).security_schemes["bearer"].root.scheme == "Bearer"
    # the 1.x SDK reads the 0.3 shape too
    assert parse_agent_card(old).security_schemes["bearer"].http_auth_security_scheme.scheme == (
        "Bearer"
    )
    # the endpoint itself needs the key
    r = await client.post("/a2a/", json={"jsonrpc": "2.0", "id": 1, "method": "GetTask"})
    assert r.status == 401
    answer = await rpc(client, "GetTask", {"id": "t"}, headers={"Authorization": f"Bearer {KEY}"})
    assert answer["error"]["code"] == -32001


async def test_a_card_derived_from_the_request_names_only_allowed_hosts(aiohttp_client, tmp_path):
    """With a key any Host reaches the server; without AGENTIK_PUBLIC_URL the card would echo
    whatever Host a client sends. It names loopback names, IP addresses and
    AGENTIK_ALLOWED_HOSTS, and is private to the client that asked."""
    client = await aiohttp_client(a2a_app(tmp_path, AGENTIK_API_KEY=KEY))
    r = await client.get("/.well-known/agent-card.json", headers={"Host": "evil.example"})
    assert r.status == 403 and (await r.json())["error"]["code"] == "host_not_allowed"
    assert "AGENTIK_PUBLIC_URL" in (await r.json())["error"]["message"]
    r = await client.get("/.well-known/agent-card.json", headers={"Host": "10.1.2.3:8080"})
    assert r.status == 200
    assert (await r.json())["supportedInterfaces"][0]["url"] == "http://10.1.2.3:8080/a2a/"
    assert r.headers["Cache-Control"].startswith("private")
    listed = await aiohttp_client(  # a database of its own: one process per database
        a2a_app(tmp_path / "listed", AGENTIK_API_KEY=KEY, AGENTIK_ALLOWED_HOSTS="agent.lan")
    )
    r = await listed.get("/.well-known/agent-card.json", headers={"Host": "agent.lan"})
    assert r.status == 200
    assert (await r.json())["supportedInterfaces"][0]["url"] == "http://agent.lan/a2a/"


async def test_agent_card_lists_the_skills_catalogue(aiohttp_client, tmp_path):
    skills = tmp_path / "skills" / "greet"
    skills.mkdir(parents=True)
    (skills / "SKILL.md").write_text(
        "---\nname: greet\ndescription: Greets people.\n---\nSay hi.\n"
    )
    app = make_app(
        llm=ScriptedLLM(),
        builtins=(*BUILTINS, "agentik_skills"),
        env={
            "AGENTIK_DB_PATH": str(tmp_path / "a2a.db"),
            "AGENTIK_SKILLS_DIR": str(tmp_path / "skills"),
            "AGENTIK_SKILLS_RESCAN": "0",
        },
    )
    client = await aiohttp_client(app)
    card = await (await client.get("/a2a/.well-known/agent-card.json")).json()
    assert [(s["id"], s["description"]) for s in card["skills"]] == [("greet", "Greets people.")]
    more = tmp_path / "skills" / "part"
    more.mkdir()
    (more / "SKILL.md").write_text("---\nname: part\ndescription: Says bye.\n---\nBye.\n")
    card = await (await client.get("/a2a/.well-known/agent-card.json")).json()
    assert sorted(s["id"] for s in card["skills"]) == ["greet", "part"]


# --- tasks on the agent -------------------------------------------------------------------


@pytest.mark.sqlite_file
async def test_send_get_and_the_conversation(aiohttp_client, tmp_path):
    client = await aiohttp_client(a2a_app(tmp_path, llm=ScriptedLLM(["Hello", " there"])))
    answer = await rpc(client, "SendMessage", {"message": text_message("hi")})
    task = answer["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert task["artifacts"][0]["parts"] == [{"text": "Hello there"}]
    assert [m["role"] for m in task["history"]] == ["ROLE_USER", "ROLE_AGENT"]
    cid = task["metadata"]["agentikConversationId"]
    context = task["contextId"]
    assert stored_states(tmp_path / "a2a.db", task["id"]) == [  # the status history, durable
        "TASK_STATE_SUBMITTED",
        "TASK_STATE_WORKING",
        "TASK_STATE_COMPLETED",
    ]
    got = (await rpc(client, "GetTask", {"id": task["id"], "historyLength": 1}))["result"]
    assert got["status"]["state"] == "TASK_STATE_COMPLETED" and len(got["history"]) == 1
    # one agent, many transports: the message is in the conversation's history
    r = await client.get(f"/agentik/conversations/{cid}/messages")
    kinds = [(m["type"], m.get("text")) for m in (await r.json())["items"]]
    assert kinds[0][0] == "user" and kinds[1] == ("assistant", "Hello there")
    # the same context is the same conversation
    again = await rpc(client, "SendMessage", {"message": text_message("more", contextId=context)})
    assert again["result"]["task"]["metadata"]["agentikConversationId"] == cid
    assert again["result"]["task"]["artifacts"][0]["parts"] == [{"text": "echo: more"}]
    # a finished task takes no more messages
    answer = await rpc(client, "SendMessage", {"message": text_message("x", taskId=task["id"])})
    assert answer["error"]["code"] == -32004


async def test_llm_failure_is_a_failed_task(aiohttp_client, tmp_path):
    from agentik.core.llm import LLMError

    client = await aiohttp_client(a2a_app(tmp_path, llm=ScriptedLLM(LLMError("upstream down"))))
    task = (await rpc(client, "SendMessage", {"message": text_message("hi")}))["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_FAILED"
    assert "upstream down" in task["status"]["message"]["parts"][0]["text"]


async def test_streaming_send_in_order(aiohttp_client, tmp_path):
    chunks = [f"w{i} " for i in range(20)]
    client = await aiohttp_client(a2a_app(tmp_path, llm=ScriptedLLM(chunks)))
    r = await client.post(
        "/a2a",
        json={
            "jsonrpc": "2.0",
            "id": "s1",
            "method": "SendStreamingMessage",
            "params": {"message": text_message("go")},
        },
        headers={"A2A-Version": "1.0"},
    )
    assert r.headers["Content-Type"] == "text/event-stream"
    events = [e["result"] for e in await sse(r)]
    assert events[0]["task"]["status"]["state"] == "TASK_STATE_SUBMITTED"
    assert events[1]["statusUpdate"]["status"]["state"] == "TASK_STATE_WORKING"
    texts = [
        e["artifactUpdate"]["artifact"]["parts"][0]["text"] for e in events if "artifactUpdate" in e
    ]
    assert texts == chunks
    appends = [e["artifactUpdate"].get("append", False) for e in events if "artifactUpdate" in e]
    assert appends == [False] + [True] * 19
    lasts = [e["artifactUpdate"].get("lastChunk", False) for e in events if "artifactUpdate" in e]
    assert lasts == [False] * 19 + [True]  # the final chunk says so
    assert events[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"


async def test_0_3_names_and_shapes(aiohttp_client, tmp_path):
    client = await aiohttp_client(a2a_app(tmp_path, llm=ScriptedLLM(["Hi", " 0.3"])))
    message = {
        "role": "user",
        "messageId": "m1",
        "kind": "message",
        "parts": [{"kind": "text", "text": "yo"}],
    }
    task = (await rpc(client, "message/send", {"message": message}, version=None))["result"]
    assert task["kind"] == "task" and task["status"]["state"] == "completed"
    assert task["artifacts"][0]["parts"] == [{"kind": "text", "text": "Hi 0.3"}]
    got = (await rpc(client, "tasks/get", {"id": task["id"]}, version=None))["result"]
    assert got["id"] == task["id"] and got["status"]["state"] == "completed"
    follow_up = {**message, "messageId": "m2", "contextId": task["contextId"]}
    r = await client.post(
        "/a2a/",
        json={
            "jsonrpc": "2.0",
            "id": 9,
            "method": "message/stream",
            "params": {"message": follow_up},
        },
    )
    events = [e["result"] for e in await sse(r)]
    assert events[0]["kind"] == "task"
    assert [e["kind"] for e in events[1:]] == ["status-update", "artifact-update", "status-update"]
    assert events[2]["lastChunk"] is True and events[2]["append"] is False
    assert events[-1]["final"] is True and events[-1]["status"]["state"] == "completed"
    answer = await rpc(client, "tasks/cancel", {"id": task["id"]}, version=None)
    assert answer["error"]["code"] == -32002
    answer = await rpc(client, "tasks/resubscribe", {"id": task["id"]}, version=None)
    assert answer["error"]["code"] == -32004
    answer = await rpc(client, "message/send", {"message": {"role": "user"}}, version=None)
    assert answer["error"]["code"] == -32602
    roleless = {k: v for k, v in message.items() if k != "role"} | {"messageId": "m9"}
    answer = await rpc(client, "message/send", {"message": roleless}, version=None)
    assert answer["error"]["code"] == -32602


async def test_cancel_a_running_task_and_subscribe(aiohttp_client, tmp_path):
    llm = ScriptedLLM([f"c{i} " for i in range(200)], delay=0.01)
    client = await aiohttp_client(a2a_app(tmp_path, llm=llm))
    params = {"message": text_message("long"), "configuration": {"returnImmediately": True}}
    task = (await rpc(client, "SendMessage", params))["result"]["task"]
    assert task["status"]["state"] in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING")
    sub = await client.post(
        "/a2a/",
        json={"jsonrpc": "2.0", "id": 2, "method": "SubscribeToTask", "params": {"id": task["id"]}},
        headers={"A2A-Version": "1.0"},
    )
    reading = asyncio.ensure_future(sse(sub))
    for _ in range(200):
        got = (await rpc(client, "GetTask", {"id": task["id"]}))["result"]
        if got.get("status", {}).get("state") == "TASK_STATE_WORKING":
            break
        await asyncio.sleep(0.01)
    # WORKING is kept in memory until the end; ListTasks filters on what the task is now
    working = (await rpc(client, "ListTasks", {"status": "TASK_STATE_WORKING"}))["result"]
    assert [t["id"] for t in working["tasks"]] == [task["id"]] and working["totalSize"] == 1
    submitted = (await rpc(client, "ListTasks", {"status": "TASK_STATE_SUBMITTED"}))["result"]
    assert submitted.get("totalSize", 0) == 0
    canceled = (await rpc(client, "CancelTask", {"id": task["id"]}))["result"]
    assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
    events = [e["result"] for e in await asyncio.wait_for(reading, 10)]
    assert events[0]["task"]["id"] == task["id"]
    assert events[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_CANCELED"
    again = await rpc(client, "CancelTask", {"id": task["id"]})
    assert again["error"]["code"] == -32002 and reason(again) == "TASK_NOT_CANCELABLE"
    listed = (await rpc(client, "ListTasks", {"status": "TASK_STATE_CANCELED"}))["result"]
    assert [t["id"] for t in listed["tasks"]] == [task["id"]] and listed["totalSize"] == 1


async def test_cancel_a_queued_task(aiohttp_client, tmp_path):
    llm = ScriptedLLM([f"q{i} " for i in range(100)], ["never"], delay=0.01)
    client = await aiohttp_client(a2a_app(tmp_path, llm=llm))
    first = (
        await rpc(
            client,
            "SendMessage",
            {"message": text_message("one"), "configuration": {"returnImmediately": True}},
        )
    )["result"]["task"]
    context = first["contextId"]
    second = (
        await rpc(
            client,
            "SendMessage",
            {
                "message": text_message("two", contextId=context),
                "configuration": {"returnImmediately": True},
            },
        )
    )["result"]["task"]
    canceled = (await rpc(client, "CancelTask", {"id": second["id"]}))["result"]
    assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
    for _ in range(500):
        done = (await rpc(client, "GetTask", {"id": first["id"]}))["result"]
        if done["status"]["state"] == "TASK_STATE_COMPLETED":
            break
        await asyncio.sleep(0.02)
    assert done["status"]["state"] == "TASK_STATE_COMPLETED"  # the running one was left alone
    for _ in range(200):
        got = (await rpc(client, "GetTask", {"id": second["id"]}))["result"]
        await asyncio.sleep(0.02)
        if "artifacts" not in got and got["status"]["state"] == "TASK_STATE_CANCELED":
            break
    assert got["status"]["state"] == "TASK_STATE_CANCELED"
    # its turn never ran, and never will: closed in the audit log, nothing left for a restart
    assert [i[0].text for i in llm.received] == ["one"]
    cid = first["metadata"]["agentikConversationId"]
    items = (await (await client.get(f"/agentik/conversations/{cid}/messages")).json())["items"]
    # (recorded as they happened: "two" arrived and was cancelled while "one" ran)
    assert [m["type"] for m in items] == ["user", "user", "error", "assistant"]
    assert items[2]["code"] == "cancelled" and items[2]["userMessageId"] == items[1]["id"]
    from agentik.core.app import AGENT

    assert await client.app[AGENT].store.open_turns() == []


async def test_list_tasks_paged_and_filtered(aiohttp_client, tmp_path):
    client = await aiohttp_client(a2a_app(tmp_path))
    first = (await rpc(client, "SendMessage", {"message": text_message("a")}))["result"]["task"]
    context = first["contextId"]
    for word in ("b", "c"):
        await rpc(client, "SendMessage", {"message": text_message(word, contextId=context)})
    await rpc(client, "SendMessage", {"message": text_message("elsewhere")})
    page = (await rpc(client, "ListTasks", {"contextId": context, "pageSize": 2}))["result"]
    assert page["totalSize"] == 3 and len(page["tasks"]) == 2 and page["nextPageToken"]
    assert all("artifacts" not in t for t in page["tasks"])
    rest = (
        await rpc(
            client,
            "ListTasks",
            {
                "contextId": context,
                "pageSize": 2,
                "pageToken": page["nextPageToken"],
                "includeArtifacts": True,
            },
        )
    )["result"]
    assert len(rest["tasks"]) == 1 and rest["nextPageToken"] == ""
    assert rest["tasks"][0]["artifacts"][0]["parts"] == [{"text": "echo: a"}]
    everything = (await rpc(client, "ListTasks", {}))["result"]
    assert everything["totalSize"] == 4
    since = {"statusTimestampAfter": "2000-01-01T00:00:00Z"}
    assert (await rpc(client, "ListTasks", since))["result"]["totalSize"] == 4
    later = {"statusTimestampAfter": "2999-01-01T00:00:00Z"}
    assert (await rpc(client, "ListTasks", later))["result"] == {
        "tasks": [],
        "nextPageToken": "",
        "pageSize": 50,
        "totalSize": 0,
    }
    # the parse error of a2a-sdk's own table (it gives the reason UNKNOWN_ERROR)
    r = await client.post("/a2a/", data=b"{", headers={"Content-Type": "application/json"})
    assert reason(await r.json()) == "UNKNOWN_ERROR"


async def test_a_queued_task_survives_a_clean_restart(aiohttp_client, tmp_path):
    """A stop interrupts the running turn (its task ends CANCELED, as the turn was) and keeps
    the queued one, which runs after the next start: its task is followed again to its end."""
    llm = ScriptedLLM([f"s{i} " for i in range(500)], delay=0.01)
    client = await aiohttp_client(a2a_app(tmp_path, llm=llm))
    now = {"configuration": {"returnImmediately": True}}
    first = (await rpc(client, "SendMessage", {"message": text_message("one"), **now}))["result"]
    context = first["task"]["contextId"]
    second = (
        await rpc(client, "SendMessage", {"message": text_message("two", contextId=context), **now})
    )["result"]["task"]
    await asyncio.sleep(0.1)
    await client.close()  # a clean stop
    client = await aiohttp_client(a2a_app(tmp_path, llm=ScriptedLLM(["after", " restart"])))
    for _ in range(300):
        got = (await rpc(client, "GetTask", {"id": second["id"]}))["result"]
        if got["status"]["state"] == "TASK_STATE_COMPLETED":
            break
        await asyncio.sleep(0.02)
    assert got["status"]["state"] == "TASK_STATE_COMPLETED", got["status"]["message"]["parts"]
    assert got["artifacts"][0]["parts"] == [{"text": "after restart"}]
    old = (await rpc(client, "GetTask", {"id": first["task"]["id"]}))["result"]
    assert old["status"]["state"] == "TASK_STATE_CANCELED"


async def test_image_parts_only_for_a_model_that_takes_images(aiohttp_client, tmp_path):
    llm = ScriptedLLM(["a red dot"])
    llm.capabilities = {"image_input": True}
    client = await aiohttp_client(a2a_app(tmp_path, llm=llm))
    image = {"raw": "iVBORw0KGgo=", "mediaType": "image/png"}
    params = {"message": {**text_message("what is it"), "parts": [{"text": "what?"}, image]}}
    task = (await rpc(client, "SendMessage", params))["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    (sent,) = llm.received
    assert [(i.mime_type, i.data) for i in sent[0].images] == [("image/png", "iVBORw0KGgo=")]
    cid = task["metadata"]["agentikConversationId"]
    first = (await (await client.get(f"/agentik/conversations/{cid}/messages")).json())["items"][0]
    assert first["content"][1] == {"type": "image", "mimeType": "image/png", "data": "iVBORw0KGgo="}
    # a file that is not an image is refused all the same
    pdf = {"raw": "JVBERi0=", "mediaType": "application/pdf"}
    params = {"message": {**text_message("doc"), "parts": [pdf]}}
    answer = await rpc(client, "SendMessage", params)
    assert answer["error"]["code"] == -32005 and "application/pdf" in answer["error"]["message"]


@pytest.mark.sqlite_file
async def test_numbers_no_json_reader_takes_back_are_refused_before_the_turn(
    aiohttp_client, tmp_path
):
    """``1e999`` reads as infinity: stored, the task could not be served back (it failed after
    its turn ran). Refused at the door with the parse error, nothing stored, no turn run."""
    llm = ScriptedLLM()
    client = await aiohttp_client(a2a_app(tmp_path, llm=llm))
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {"message": {**text_message("x"), "metadata": {"n": 1.5}}},
    }
    for bad in ("1e999", "-1e999", "NaN", "Infinity"):
        raw = json.dumps(body).replace("1.5", bad).encode()
        r = await client.post(
            "/a2a/", data=raw, headers={"Content-Type": "application/json", "A2A-Version": "1.0"}
        )
        answer = await r.json()
        assert answer["error"]["code"] == -32700, (bad, answer)
    assert llm.received == []
    with sqlite3.connect(tmp_path / "a2a.db") as db:
        assert db.execute("SELECT count(*) FROM message").fetchone()[0] == 0


async def test_image_urls_other_than_http_and_data_are_refused(aiohttp_client, tmp_path):
    llm = ScriptedLLM()
    llm.capabilities = {"image_input": True}
    client = await aiohttp_client(a2a_app(tmp_path, llm=llm))
    for url in ("file:///etc/passwd", "javascript:alert(1)", "ftp://x/y.png"):
        part = {"url": url, "mediaType": "image/png"}
        params = {"message": {**text_message(url), "parts": [part]}}
        answer = await rpc(client, "SendMessage", params)
        assert answer["error"]["code"] == -32602 and "http" in answer["error"]["message"], answer
    assert llm.received == []


def test_a2a_sdk_is_loaded_at_the_first_call_not_at_start(tmp_path):
    """Start-up stays fast: the card and the server need no a2a-sdk; the first JSON-RPC call
    loads it."""
    script = f"""
import asyncio, sys
from aiohttp.test_utils import TestClient, TestServer
from agentik.core.testing import make_app, ScriptedLLM
async def main():
    app = make_app(llm=ScriptedLLM(), builtins={BUILTINS!r},
                   env={{"AGENTIK_DB_PATH": {str(tmp_path / "lazy.db")!r}}})
    async with TestClient(TestServer(app)) as client:
        await client.get("/a2a/.well-known/agent-card.json")
        print("a2a.types" in sys.modules)
        await client.post("/a2a/", json={{"jsonrpc": "2.0", "id": 1, "method": "GetTask"}},
                          headers={{"A2A-Version": "1.0"}})
        print("a2a.types" in sys.modules)
asyncio.run(main())
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert out.stdout.split() == ["False", "True"], out.stderr[-2000:]


async def test_without_a2a_sdk_the_endpoint_says_what_to_install(
    aiohttp_client, tmp_path, monkeypatch
):
    client = await aiohttp_client(a2a_app(tmp_path))
    monkeypatch.setitem(sys.modules, "agentik_transport_a2a.endpoint", None)  # import fails
    answer = await rpc(client, "GetTask", {"id": "t"})
    assert answer["error"]["code"] == -32603
    assert "pip install 'agentik-runtime[a2a]'" in answer["error"]["message"]
    assert (await client.get("/a2a/.well-known/agent-card.json")).status == 200


async def test_a_resent_message_is_the_same_task_not_a_second_turn(aiohttp_client, tmp_path):
    """A client that got no answer sends the same message (same messageId) again: the task
    that answers it, while it runs and after it ended; one user message in the conversation."""
    client = await aiohttp_client(a2a_app(tmp_path, llm=ScriptedLLM(delay=0.05)))
    first = await rpc(
        client,
        "SendMessage",
        {"message": text_message("once"), "configuration": {"returnImmediately": True}},
    )
    task = first["result"]["task"]
    context = {"contextId": task["contextId"]}
    again = await rpc(client, "SendMessage", {"message": text_message("once", **context)})
    assert again["result"]["task"]["id"] == task["id"]
    assert again["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    later = await rpc(client, "SendMessage", {"message": text_message("once", **context)})
    assert later["result"]["task"]["id"] == task["id"]
    cid = task["metadata"]["agentikConversationId"]
    r = await client.get(f"/agentik/conversations/{cid}/messages")
    assert [m["type"] for m in (await r.json())["items"]] == ["user", "assistant"]


def test_a_hand_written_chunk_is_what_the_sdk_writes():
    """The reply's chunks are written without protobuf (the hot path): the same JSON as
    MessageToDict (1.0) and the 0.3 model, with lastChunk and append."""
    from a2a.compat.v0_3 import conversions
    from a2a.types import a2a_pb2 as pb
    from google.protobuf.json_format import MessageToDict

    from agentik_transport_a2a import compat03
    from agentik_transport_a2a.jsonrpc import V03, V10, _artifact_json

    for append, last in ((False, False), (True, False), (True, True), (False, True)):
        event = pb.TaskArtifactUpdateEvent(
            task_id="t",
            context_id="c",
            artifact=pb.Artifact(artifact_id="reply", name="reply", parts=[pb.Part(text='a"é')]),
            append=append,
            last_chunk=last,
        )
        ours = json.loads(_artifact_json("t", "c", 'a"é', append, last, V10))
        assert ours == MessageToDict(pb.StreamResponse(artifact_update=event))
        ours = json.loads(_artifact_json("t", "c", 'a"é', append, last, V03))
        model = conversions.to_compat_task_artifact_update_event(event)
        assert ours == compat03._dump(model)


def test_chunks_read_together_go_out_as_one_update_with_the_same_text():
    """A follower that fell behind reads several chunks at once: they go out as one artifact
    update (one frame for all); a chunk read alone is an update of its own; the last one says
    lastChunk."""
    from a2a.types import a2a_pb2 as pb

    from agentik_transport_a2a.service import TaskRun

    run = TaskRun(pb.Task(id="t1", context_id="c1"), None, "u1")  # type: ignore[arg-type]
    for chunk in ("Hel", "lo", " wor"):  # one read of the log
        run.add_text(chunk)
    run.read_all()
    run.add_text("ld")  # the next read
    run.read_all()
    run.end_text()
    updates = [u.value for u in run.updates if u.kind == "artifact_update"]
    # (task, context, text, append, last)
    assert updates == [("t1", "c1", "Hello wor", False, False), ("t1", "c1", "ld", True, True)]
    assert run.reply() == "Hello world"
