"""The OpenAPI document of the agent's own API (plugins/transport_http/openapi.json) matches the
real server: every route is documented and every documented operation exists; every response
the test provokes (success, 4xx, SSE frames) validates against the schema the document declares
for that path, method and status; every documented status is provoked at least once; and the
request-body schemas accept exactly what the server accepts."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from jsonschema import Draft202012Validator, FormatChecker

import agentik_transport_http
from agentik import hookimpl
from agentik.core.app import AGENT, READINESS
from agentik.core.llm import LLMError, ReasoningDelta, ToolCallRequest, Usage
from agentik.core.testing import ScriptedLLM, make_app
from agentik.core.tools import tool
from agentik.core.types import Message
from tests.conftest import ON_POSTGRES

DOC_FILE = Path(agentik_transport_http.__file__).with_name("openapi.json")
DOC: dict[str, Any] = json.loads(DOC_FILE.read_text())
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
SSE = "text/event-stream"
MAX_BODY = 1024 * 1024
TEXT = [{"type": "text", "body": "hi"}]
API_KEY = "test-key-0123456789abcdef"

# --- schema helpers -------------------------------------------------------------------------

FORMATS = FormatChecker(formats=())
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$", re.I)


@FORMATS.checks("date-time", raises=ValueError)
def is_datetime(value: object) -> bool:
    if not isinstance(value, str):
        return True
    datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
    return bool(RFC3339.match(value))


def resolve(obj: dict[str, Any]) -> dict[str, Any]:
    """Follow a local ``$ref`` (components/responses, parameters …) to its target."""
    while "$ref" in obj:
        target: Any = DOC
        for part in obj["$ref"].removeprefix("#/").split("/"):
            target = target[part.replace("~1", "/").replace("~0", "~")]
        obj = target
    return obj


def validator(schema: dict[str, Any]) -> Draft202012Validator:
    return Draft202012Validator({**schema, "components": DOC["components"]}, format_checker=FORMATS)


def schema_ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def validate(instance: Any, schema: dict[str, Any], where: str) -> None:
    errors = sorted(validator(schema).iter_errors(instance), key=lambda e: list(e.path))
    assert not errors, f"{where}: {json.dumps(instance)[:500]}\n" + "\n".join(
        f"  at {list(e.absolute_path)}: {e.message[:300]}" for e in errors
    )


def template_of(path: str) -> str:
    """The documented path template a concrete path falls under."""
    path = path.partition("?")[0]
    for template in DOC["paths"]:
        pattern = re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template))
        if re.fullmatch(pattern, path):
            return template
    raise AssertionError(f"{path} matches no documented path")


def operations() -> set[tuple[str, str]]:
    return {
        (path, method.upper())
        for path, item in DOC["paths"].items()
        for method in item
        if method in METHODS
    }


def response_spec(template: str, method: str, status: int) -> dict[str, Any]:
    op = DOC["paths"][template][method.lower()]
    assert str(status) in op["responses"], f"{method} {template} does not document {status}"
    return resolve(op["responses"][str(status)])


def check_headers(spec: dict[str, Any], resp: aiohttp.ClientResponse, where: str) -> None:
    for name, header in spec.get("headers", {}).items():
        header = resolve(header)
        assert name in resp.headers, f"{where}: documented header {name} missing"
        validate(resp.headers[name], header["schema"], f"{where} header {name}")


# --- a client that checks every answer against the document ---------------------------------


class SseStream:
    """An open SSE response; every frame is checked against the documented data schema."""

    def __init__(self, resp: aiohttp.ClientResponse, schema: dict[str, Any], where: str) -> None:
        self.resp = resp
        self.schema = schema
        self.where = where
        self.frames: list[dict[str, Any]] = []

    async def frame(self) -> dict[str, Any]:
        fields: dict[str, str] = {}
        while True:
            raw = await asyncio.wait_for(self.resp.content.readline(), 5)
            assert raw, f"{self.where}: the stream ended"
            line = raw.decode().rstrip("\r\n")
            if line.startswith(":"):
                continue  # keep-alive comment
            if line:
                key, _, value = line.partition(":")
                fields[key] = value.removeprefix(" ")
                continue
            if not fields:
                continue
            assert set(fields) == {"id", "event", "data"}, f"{self.where}: frame {fields}"
            assert fields["id"].isdigit(), f"{self.where}: id {fields['id']!r}"
            data = json.loads(fields["data"])
            validate(data, self.schema, f"{self.where} SSE data")
            assert fields["event"] == data["type"], f"{self.where}: event != data.type"
            frame = {"id": int(fields["id"]), "event": fields["event"], "data": data}
            if self.frames:
                assert frame["id"] > self.frames[-1]["id"], f"{self.where}: ids must grow"
            self.frames.append(frame)
            return frame

    async def until(self, predicate: Any) -> list[dict[str, Any]]:
        out = []
        while True:
            frame = await self.frame()
            out.append(frame)
            if predicate(frame["data"]):
                return out

    def close(self) -> None:
        self.resp.close()


class Api:
    def __init__(self, client: Any) -> None:
        self.client = client
        #: (path template, METHOD, status) of every checked response
        self.seen: set[tuple[str, str, str]] = set()
        self.plugin: Any = None

    async def call(self, method: str, path: str, status: int, **kw: Any) -> Any:
        """Make a request, expect ``status`` and validate the answer; returns the JSON body."""
        template = template_of(path)
        where = f"{method} {path}"
        async with self.client.request(method, path, **kw) as resp:
            text = await resp.text()
            assert resp.status == status, f"{where}: {resp.status} {text[:500]}"
            spec = response_spec(template, method, status)
            check_headers(spec, resp, where)
            self.seen.add((template, method, str(status)))
            if "content" not in spec:
                assert text == "", f"{where}: {status} documents no body but got {text[:200]!r}"
                return None
            media = resp.headers["Content-Type"].partition(";")[0].strip()
            assert media in spec["content"], f"{where}: {media} not documented for {status}"
            body = json.loads(text) if media == "application/json" else text
            validate(body, spec["content"][media]["schema"], where)
            return body

    async def stream(self, path: str, **kw: Any) -> SseStream:
        template = template_of(path)
        resp = await self.client.get(path, **kw)
        if resp.status != 200:
            text = await resp.text()
            resp.release()
            raise AssertionError(f"GET {path}: {resp.status} {text[:300]}")
        assert resp.headers["Content-Type"].partition(";")[0] == SSE
        spec = response_spec(template, "GET", 200)
        check_headers(spec, resp, f"GET {path}")
        self.seen.add((template, "GET", "200"))
        data = spec["content"][SSE]["schema"]["properties"]["data"]["contentSchema"]
        return SseStream(resp, data, f"GET {path}")


# --- the app under test ---------------------------------------------------------------------


class ToolsPlugin:
    def __init__(self) -> None:
        self.slow_started = asyncio.Event()

    @hookimpl
    def register_tools(self, register: Any) -> None:
        def echo_tool(x: int) -> str:
            """Echo x."""
            return f"x={x}"

        async def slow_tool() -> str:
            """Takes long."""
            self.slow_started.set()
            await asyncio.sleep(30)
            return "late"

        register(tool(echo_tool))
        register(tool(slow_tool))
        register(tool(echo_tool, name="guarded_tool", requires_approval=True))


@pytest.fixture
async def api(aiohttp_client: Any) -> AsyncIterator[Api]:
    llm = ScriptedLLM(
        # 1: a tool round-trip, with token usage
        ["let me see", ToolCallRequest("c1", "echo_tool", '{"x": 1}'), Usage(10, 2)],
        ["done", Usage(14, 3)],
        # 2: a failing LLM
        LLMError("boom", "http_500"),
        LLMError("no code"),
        # 3: reasoning, no usage
        [ReasoningDelta("hmm"), "answer"],
        # 4: a turn interrupted while a tool runs
        [ToolCallRequest("c2", "slow_tool", "{}")],
        # 5: two calls that wait for a person's approval
        [
            ToolCallRequest("a1", "guarded_tool", '{"x": 1}'),
            ToolCallRequest("a2", "guarded_tool", '{"x": 2}'),
        ],
        ["one ran, one was denied"],
    )
    plugin = ToolsPlugin()
    env = {"AGENTIK_API_KEY": API_KEY, "AGENTIK_ALLOWED_HOSTS": "127.0.0.1"}
    client = await aiohttp_client(
        make_app(
            llm=llm,
            plugins=[("test_tools", plugin)],
            builtins=("agentik_transport_http", "agentik_approvals"),
            env=env,
        ),
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    api = Api(client)
    api.plugin = plugin
    yield api


# --- the document itself --------------------------------------------------------------------


def test_document_is_well_formed() -> None:
    assert DOC["openapi"] == "3.1.0"
    assert DOC["info"]["title"] == "agentik"
    for name, schema in DOC["components"]["schemas"].items():
        try:
            Draft202012Validator.check_schema(schema)
        except Exception as e:
            raise AssertionError(f"components/schemas/{name}: {e}") from e

    def walk(node: Any) -> None:  # every $ref resolves
        if isinstance(node, dict):
            if "$ref" in node:
                resolve(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(DOC)
    for path, method in operations():
        for status in DOC["paths"][path][method.lower()]["responses"]:
            assert status == "default" or re.fullmatch(r"[1-5]\d\d", status), (path, status)


async def test_routes_and_document_agree(aiohttp_client: Any) -> None:
    client = await aiohttp_client(make_app(llm=ScriptedLLM()))
    routes = {
        (r.resource.canonical, r.method)
        for r in client.server.app.router.routes()
        if r.resource is not None
    }
    assert ("/agentik/conversations", "POST") in routes  # the sub-app's routes are walked
    # aiohttp adds HEAD beside every GET; HTTP defines HEAD as GET without a body
    heads = {(p, m) for p, m in routes if m == "HEAD"}
    assert all((p, "GET") in routes for p, _ in heads)
    routes -= heads
    documented = operations()
    assert routes - documented == set(), "routes missing from openapi.json"
    assert documented - routes == set(), "documented operations the server does not have"


async def test_served_document_is_the_file_narrowed_to_the_model(aiohttp_client: Any) -> None:
    """A model without image input: the served document's sends take text parts only (so a
    schema-valid send is one the server accepts); everything else is the file."""
    api = Api(await aiohttp_client(make_app(llm=ScriptedLLM())))
    served = await api.call("GET", "/agentik/openapi.json", 200)
    assert served["components"]["schemas"]["InputPart"]["oneOf"] == [
        {"$ref": "#/components/schemas/TextPart"}
    ]
    served["components"]["schemas"]["InputPart"] = DOC["components"]["schemas"]["InputPart"]
    assert served == DOC

    class Vision(ScriptedLLM):
        capabilities = {"image_input": True}

    api = Api(await aiohttp_client(make_app(llm=Vision())))
    assert await api.call("GET", "/agentik/openapi.json", 200) == DOC


# --- the API, endpoint by endpoint ----------------------------------------------------------


@pytest.mark.sqlite_file
async def test_server_matches_document(api: Api) -> None:
    health = await api.call("GET", "/health", 200)
    assert health["status"] == "ok"
    assert (await api.call("GET", "/health/ready", 200)) == {"status": "ready"}
    readiness, db = api.client.app[READINESS], api.client.app[AGENT].store.db
    readiness.probe_interval = 0  # probe at every call
    db.execute("PRAGMA query_only = 1")  # the database refuses writes
    not_ready = await api.call("GET", "/health/ready", 503)
    assert "the database refuses writes" in not_ready["reasons"][0]
    db.execute("PRAGMA query_only = 0")
    await api.call("GET", "/health/ready", 200)
    served = await api.call("GET", "/agentik/openapi.json", 200)
    assert served["paths"] == DOC["paths"]  # narrowed to text input (the test just above)
    agent_stream = await api.stream("/agentik/events")

    # conversations
    conv = await api.call("POST", "/agentik/conversations", 201)
    cid = conv["id"]
    base = f"/agentik/conversations/{cid}"
    temp = await api.call(
        "POST", "/agentik/conversations", 201, json={"temp": True, "title": "scratch"}
    )
    assert temp["temp"] is True
    await api.call("GET", base, 200)
    await api.call("GET", f"/agentik/conversations/{temp['id']}", 200)
    renamed = await api.call("PATCH", base, 200, json={"title": "renamed"})
    assert renamed["title"] == "renamed"
    page = await api.call("GET", "/agentik/conversations", 200, params={"limit": "1"})
    assert page["limit"] == 1 and len(page["items"]) == 1

    # turns, followed on the conversation's stream
    stream = await api.stream(f"{base}/events")
    plugin = api.plugin

    async def turn(body: Any, *, interrupt: bool = False) -> list[dict[str, Any]]:
        sent = await api.call("POST", f"{base}/messages", 202, json=body)
        assert sent["type"] == "user" and sent["conversationId"] == cid
        if interrupt:
            await asyncio.wait_for(plugin.slow_started.wait(), 5)
            result = await api.call("POST", f"{base}/interrupt", 202)
            assert result == {"interrupted": True}
        return await stream.until(lambda d: d["type"] == "End")

    await turn(TEXT)  # tool round-trip
    failed = await turn({"content": TEXT, "context": {"origin": "system", "description": "d"}})
    assert [f["event"] for f in failed][-2:] == ["Error", "End"]
    failed = await turn(TEXT)  # an error without a code
    assert failed[-2]["data"] == {"type": "Error", "message": "no code", "code": None}
    await turn({"content": TEXT, "context": None})  # reasoning
    interrupted = await turn(
        {
            "content": TEXT,
            "context": {
                "origin": "event",
                "description": "cron",
                "sourceId": "c-1",
                "metadata": {"k": [1]},
            },
        },
        interrupt=True,
    )
    assert [f["event"] for f in interrupted][-2:] == ["Interrupted", "End"]
    accepted = next(f["data"] for f in interrupted if f["event"] == "UserMessage")
    assert interrupted[-1]["data"] == {"type": "End", "turnId": accepted["id"]}
    idle = await api.call("POST", f"{base}/interrupt", 202)
    assert idle == {"interrupted": False}
    conv_events = {f["event"] for f in stream.frames}
    assert conv_events == {
        "UserMessage",
        "StartReasoning",
        "StartResponse",
        "AppendText",
        "ToolCall",
        "ToolResult",
        "End",
        "Interrupted",
        "Error",
    }

    # approvals (in the temporary conversation: the others' stories stay as they are)
    tbase = f"/agentik/conversations/{temp['id']}"
    tstream = await api.stream(f"{tbase}/events")
    await api.call("POST", f"{tbase}/messages", 202, json=TEXT)
    await tstream.until(lambda d: d["type"] == "ApprovalRequested" and d["callId"] == "a2")
    waiting = await api.call("GET", f"{tbase}/approvals", 200)
    assert [(a["callId"], a["argsJson"]) for a in waiting["items"]] == [
        ("a1", '{"x": 1}'),
        ("a2", '{"x": 2}'),
    ]
    await api.call("POST", f"{tbase}/approvals/a1", 400, json={"approve": True, "args": {}})
    await api.call("POST", f"{tbase}/approvals/a1", 400, json={"yes": True})
    await api.call("POST", f"{tbase}/approvals/nope", 404, json={"approve": True})
    answered = await api.call(
        "POST", f"{tbase}/approvals/a1", 200, json={"approve": True, "args": {"x": 7}}
    )
    assert answered == {"callId": "a1", "status": "approved", "turn": "waiting"}
    await api.call("POST", f"{tbase}/approvals/a1", 409, json={"approve": False})
    denied = await api.call(
        "POST", f"{tbase}/approvals/a2", 200, json={"approve": False, "note": "not 2"}
    )
    assert denied == {"callId": "a2", "status": "denied", "turn": "running"}
    ended = await tstream.until(lambda d: d["type"] == "End")
    results = [f["data"]["text"] for f in ended if f["event"] == "ToolResult"]
    assert results == ["x=7", "Error: a person denied this call: not 2"]
    assert (await api.call("GET", f"{tbase}/approvals", 200)) == {"items": []}
    tstream.close()
    records = (await api.call("GET", f"{tbase}/messages", 200))["items"]
    asked = [(m["callId"], m["status"]) for m in records if m["type"] == "approval"]
    assert asked == [("a1", "pending"), ("a2", "pending"), ("a1", "approved"), ("a2", "denied")]
    await api.call("GET", "/agentik/conversations/conv-nope/approvals", 404)
    await api.call("POST", "/agentik/conversations/conv-nope/approvals/a1", 404, json={})

    # resuming: Last-Event-ID wins over ?after=
    middle = stream.frames[len(stream.frames) // 2]["id"]
    resumed = await api.stream(
        f"{base}/events", params={"after": "0"}, headers={"Last-Event-ID": str(middle)}
    )
    assert (await resumed.frame())["id"] == middle + 1
    resumed.close()
    stream.close()

    # history: a summary record (written by compaction, not by this API) is stored directly
    agent = api.client.server.app[AGENT]
    await agent.store.append(
        cid,
        [Message("sum-1", cid, "summary", datetime.now().astimezone(), {"text": "earlier: hi"})],
    )
    history = await api.call("GET", f"{base}/messages", 200, params={"limit": "200"})
    kinds = {m["type"] for m in history["items"]}
    assert kinds == {"user", "assistant", "tool_call", "tool_result", "error", "summary"}
    assert any("context" in m for m in history["items"] if m["type"] == "user")
    assert any(m.get("interrupted") for m in history["items"] if m["type"] == "assistant")
    first = history["items"][0]["id"]
    after = await api.call("GET", f"{base}/messages", 200, params={"after": first, "limit": "2"})
    assert after["items"][0]["id"] == history["items"][1]["id"] and after["hasMore"]
    temp_history = await api.call("GET", f"/agentik/conversations/{temp['id']}/messages", 200)
    assert [m["type"] for m in temp_history["items"]][:3] == ["user", "tool_call", "tool_call"]

    # the whole conversation in one document
    everything = await api.call("GET", f"{base}/messages", 200, params={"limit": "200"})
    exported = await api.call("GET", f"{base}/export", 200, params={"format": "json"})
    assert exported["messages"] == everything["items"]
    assert exported["conversation"]["id"] == cid and exported["stats"]["conversationId"] == cid
    markdown = await api.call("GET", f"{base}/export", 200)
    assert markdown.startswith("# renamed\n") and "**Tool call** `echo_tool`" in markdown
    await api.call("GET", f"{base}/export", 400, params={"format": "pdf"})

    # token stats: the tool round-trip counted (10 in; 14 + 3 - 10 out), the reasoning turn
    # could not; the interrupted one has the estimate of the context it sent (and no output)
    stats = await api.call("GET", f"{base}/stats", 200)
    sent = stats["contextTokens"]
    assert sent > 10 and stats == {
        "conversationId": cid,
        "turns": 3,
        "input": 10 + sent,
        "output": 7,
        "total": 17 + sent,
        "contextTokens": sent,
    }
    totals = await api.call("GET", "/agentik/stats", 200)
    assert totals == {
        "conversations": 1,
        "turns": 3,
        "input": 10 + sent,
        "output": 7,
        "total": 17 + sent,
        "background": {},
    }
    named = await api.call(  # who sent it, and through which transport, is on the record
        "POST",
        f"/agentik/conversations/{temp['id']}/messages",
        202,
        json={"content": TEXT, "sender": "a viewer"},
    )
    assert named["via"] == {"transport": "http", "sender": "a viewer"}

    # errors
    unknown = "/agentik/conversations/conv-nope"
    await api.call("GET", unknown, 404)
    await api.call("PATCH", unknown, 404, json={"title": "x"})
    await api.call("DELETE", unknown, 404)
    await api.call("POST", f"{unknown}/messages", 404, json=TEXT)
    await api.call("GET", f"{unknown}/messages", 404)
    await api.call("POST", f"{unknown}/interrupt", 404)
    await api.call("GET", f"{unknown}/events", 404)
    await api.call("GET", f"{unknown}/stats", 404)
    await api.call("GET", f"{unknown}/export", 404)
    await api.call("GET", f"{base}/messages", 404, params={"after": "msg-nope"})
    as_json = {"Content-Type": "application/json"}
    await api.call("POST", "/agentik/conversations", 400, data=b"{bad json", headers=as_json)
    await api.call("PATCH", base, 400, data=b"")
    await api.call("POST", f"{base}/messages", 400, data=b"[{", headers=as_json)
    await api.call(
        "POST", f"{base}/messages", 415, data=b"hello", headers={"Content-Type": "text/plain"}
    )
    big = b'{"title": "' + b"x" * MAX_BODY + b'"}'
    await api.call("POST", "/agentik/conversations", 413, data=big, headers=as_json)
    await api.call("PATCH", base, 413, data=big, headers=as_json)
    await api.call("POST", f"{base}/messages", 413, data=big, headers=as_json)
    await check_query_parameters(api, {"{id}": cid})
    await check_wrong_methods(api, cid)
    await check_refusals(api, cid)

    # deleting ends the story on the agent stream
    await api.call("DELETE", base, 204)
    await api.call("DELETE", f"/agentik/conversations/{temp['id']}", 204)
    await api.call("GET", base, 404)
    await agent_stream.until(
        lambda d: d["type"] == "ConversationDeleted" and d["conversationId"] == temp["id"]
    )
    agent_stream.close()
    assert {f["event"] for f in agent_stream.frames} == {
        "UserMessage",
        "ApprovalRequested",
        "TurnWaiting",
        "ConversationCreated",
        "ConversationUpdated",
        "ConversationDeleted",
        "TurnStarted",
        "TurnEnded",
    }

    await check_request_bodies(api)

    documented = {
        (path, method, status)
        for path, method in operations()
        for status in DOC["paths"][path][method.lower()]["responses"]
        if status != "default"
    }
    assert documented - api.seen == set(), "documented responses never exercised"


async def check_query_parameters(api: Api, values: dict[str, str]) -> None:
    """Every integer parameter: its documented bounds pass, one past them and junk get 400."""
    for path, method in operations():
        op = DOC["paths"][path][method.lower()]
        params = [resolve(p) for p in DOC["paths"][path].get("parameters", [])]
        params += [resolve(p) for p in op.get("parameters", [])]
        concrete = path
        for key, value in values.items():
            concrete = concrete.replace(key, value)
        for param in params:
            schema = param["schema"]
            if param["in"] == "path" or schema.get("type") != "integer":
                continue
            good = [schema.get("minimum", 0), schema.get("default", schema.get("minimum", 0))]
            if "maximum" in schema:
                good.append(schema["maximum"])
            bad: list[Any] = ["x", "1.5", schema.get("minimum", 0) - 1]
            if "maximum" in schema:
                bad.append(schema["maximum"] + 1)
            for value, status in [*((v, 200) for v in good), *((v, 400) for v in bad)]:
                kw: dict[str, Any] = (
                    {"params": {param["name"]: str(value)}}
                    if param["in"] == "query"
                    else {"headers": {param["name"]: str(value)}}
                )
                where = f"{method} {concrete} {param['name']}={value}"
                if status == 200 and SSE in response_spec(path, method, 200)["content"]:
                    (await api.stream(concrete, **kw)).close()
                    continue
                assert validator(schema).is_valid(value) == (status == 200), where
                await api.call(method, concrete, status, **kw)


async def check_refusals(api: Api, cid: str) -> None:
    """401 without a valid key, 403 for a Host that is not served, 415 for a body that is not
    JSON: on every operation that documents them."""
    for path, ops in DOC["paths"].items():
        concrete = path.replace("{id}", cid).replace("{callId}", "call-x")
        for method, op in ops.items():
            if method not in METHODS:
                continue
            statuses = op["responses"]
            if "401" in statuses:
                wrong = {"Authorization": "Bearer not-the-key-at-all"}
                await api.call(method.upper(), concrete, 401, headers=wrong)
            if "403" in statuses:
                await api.call(method.upper(), concrete, 403, headers={"Host": "evil.example"})
            if "415" in statuses:
                text = {"Content-Type": "text/plain"}
                await api.call(method.upper(), concrete, 415, data=b"{}", headers=text)


async def check_wrong_methods(api: Api, cid: str) -> None:
    spec = resolve({"$ref": "#/components/responses/MethodNotAllowed"})
    for path in DOC["paths"]:
        concrete = path.replace("{id}", cid).replace("{callId}", "call-x")
        allowed = {m.upper() for m in DOC["paths"][path] if m in METHODS}
        for method in ("PUT", "POST", "DELETE"):
            if method in allowed:
                continue
            async with api.client.request(method, concrete) as resp:
                body = await resp.json()
                assert resp.status == 405, f"{method} {concrete}: {resp.status}"
                check_headers(spec, resp, f"{method} {concrete}")
                assert set(resp.headers["Allow"].split(",")) >= allowed
                validate(
                    body, spec["content"]["application/json"]["schema"], f"{method} {concrete}"
                )


# --- request bodies: the schema accepts exactly what the server accepts ----------------------

IMAGE_URL = {"type": "image", "mimeType": "image/png", "url": "https://example.com/a.png"}
MESSAGE_BODIES: list[tuple[Any, int]] = [
    (TEXT, 202),
    ({"content": TEXT}, 202),
    ({"content": TEXT, "context": None}, 202),
    ({"content": TEXT, "context": {}}, 202),
    ({"content": TEXT, "context": {"origin": "user"}}, 202),
    ({"content": TEXT, "context": {"origin": None, "sourceId": None, "metadata": None}}, 202),
    (
        {
            "content": TEXT,
            "context": {
                "origin": "system",
                "description": "d",
                "sourceId": "s",
                "metadata": {"k": 1},
            },
        },
        202,
    ),
    ({"content": TEXT, "context": {"origin": "event", "description": "cron"}}, 202),
    ({"content": TEXT, "sender": "chat-1a2b3c"}, 202),
    ({"content": TEXT, "sender": "s" * 200}, 202),
    ({"content": TEXT, "sender": None}, 202),
    ({"content": TEXT, "sender": ""}, 400),
    ({"content": TEXT, "sender": "s" * 201}, 400),
    ({"content": TEXT, "sender": "two\nlines"}, 400),
    ({"content": TEXT, "sender": 5}, 400),
    ({"content": TEXT, "context": {"origin": "event"}}, 400),
    ({"content": TEXT, "context": {"origin": "system", "description": None}}, 400),
    ({"content": TEXT, "context": {"origin": "event", "description": "  "}}, 400),
    ({"content": TEXT, "context": {"origin": "bot", "description": "d"}}, 400),
    ({"content": TEXT, "context": {"foo": 1}}, 400),
    ({"content": TEXT, "context": {"metadata": [1]}}, 400),
    ({"content": TEXT, "context": {"sourceId": 5}}, 400),
    ({"content": TEXT, "context": "user"}, 400),
    ({"content": TEXT, "extra": 1}, 400),
    ({"context": {}}, 400),
    ({"content": []}, 400),
    ({"content": "hi"}, 400),
    ([], 400),
    ([{"type": "text"}], 400),
    ([{"type": "text", "body": 5}], 400),
    ([{"type": "video", "body": "x"}], 400),
    (["hi"], 400),
    ([{"type": "image", "mimeType": "image/png"}], 400),
    ([{**IMAGE_URL, "data": "AAAA"}], 400),
    ([{"type": "image", "url": "https://example.com/a.png"}], 400),
    ("hi", 400),
    (42, 400),
    (None, 400),
]
CREATE_BODIES: list[tuple[Any, int]] = [
    ({}, 201),
    ({"temp": False}, 201),
    ({"title": None}, 201),
    ({"title": "t" * 1000, "temp": True}, 201),
    ({"title": "t" * 1001}, 400),
    ({"temp": "yes"}, 400),
    ({"temp": None}, 400),
    ({"title": 5}, 400),
    ({"name": "x"}, 400),
    ([1], 400),
    ("x", 400),
]
RENAME_BODIES: list[tuple[Any, int]] = [
    ({"title": "new"}, 200),
    ({"title": None}, 200),
    ({"title": "t" * 1000}, 200),
    ({"title": "t" * 1001}, 400),
    ({}, 400),
    ({"title": 3}, 400),
    ({"title": "a", "x": 1}, 400),
    ([], 400),
    ("t", 400),
    (None, 400),
]


def request_schema(path: str, method: str) -> dict[str, Any]:
    body = resolve(DOC["paths"][path][method.lower()]["requestBody"])
    return body["content"]["application/json"]["schema"]


async def check_request_bodies(api: Api) -> None:
    cid = (await api.call("POST", "/agentik/conversations", 201))["id"]
    cases = [
        ("POST", "/agentik/conversations", "/agentik/conversations", CREATE_BODIES),
        ("PATCH", "/agentik/conversations/{id}", f"/agentik/conversations/{cid}", RENAME_BODIES),
        (
            "POST",
            "/agentik/conversations/{id}/messages",
            f"/agentik/conversations/{cid}/messages",
            MESSAGE_BODIES,
        ),
    ]
    for method, path, concrete, bodies in cases:
        check = validator(request_schema(path, method))
        for body, status in bodies:
            ok = status < 400
            assert check.is_valid(body) == ok, (
                f"{method} {path}: schema and server disagree on {body}"
            )
            await api.call(
                method,
                concrete,
                status,
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
    # a valid image part is refused with a 400 when the model takes no images
    conv = await api.call("GET", f"/agentik/conversations/{cid}", 200)
    assert conv["supportsImageInput"] is False
    body = [IMAGE_URL]
    assert validator(request_schema("/agentik/conversations/{id}/messages", "POST")).is_valid(body)
    await api.call("POST", f"/agentik/conversations/{cid}/messages", 400, json=body)


# --- Gap events -----------------------------------------------------------------------------


async def test_gap_events_match_document(aiohttp_client: Any) -> None:
    app = make_app(llm=ScriptedLLM(), env={"AGENTIK_EVENT_BUFFER": "3"})
    api = Api(await aiohttp_client(app))
    cid = (await api.call("POST", "/agentik/conversations", 201))["id"]
    base = f"/agentik/conversations/{cid}"
    for _ in range(3):
        await api.call("POST", f"{base}/messages", 202, json=TEXT)
    for _ in range(200):
        if not (await api.call("GET", base, 200))["busy"]:
            break
        await asyncio.sleep(0.01)
    for path in (f"{base}/events", "/agentik/events"):
        replay = await api.stream(path, params={"after": "0"})  # an old id: all that is held
        lost = await replay.frame()
        assert lost["data"] == {"type": "Gap", "after": 0}
        oldest = (await replay.frame())["id"]
        if ON_POSTGRES:  # ids from the database's sequence: they grow, with holes
            assert lost["id"] < oldest
        else:
            assert lost["id"] == oldest - 1
        replay.close()
        if ON_POSTGRES:  # the table replays an id it holds beyond the buffer: no Gap there
            continue
        behind = await api.stream(path, headers={"Last-Event-ID": str(oldest - 2)})
        gap = await behind.frame()
        assert gap["data"] == {"type": "Gap", "after": oldest - 2}
        assert (await behind.frame())["id"] == oldest
        behind.close()


# --- Compacted events -----------------------------------------------------------------------


class CompactEveryTurn:
    """Compacts before every send once there is something to summarise."""

    @hookimpl
    def compact_context(self, conversation: Any) -> Any:
        async def summarize(items: Any) -> str:
            return f"Goal: {len(items)} entries."

        return conversation.compact(summarize)


async def test_compacted_events_match_document(aiohttp_client: Any) -> None:
    app = make_app(llm=ScriptedLLM(), plugins=[("compact", CompactEveryTurn())])
    api = Api(await aiohttp_client(app))
    cid = (await api.call("POST", "/agentik/conversations", 201))["id"]
    base = f"/agentik/conversations/{cid}"
    stream = await api.stream(f"{base}/events")
    for _ in range(7):
        await api.call("POST", f"{base}/messages", 202, json=TEXT)
        await stream.until(lambda d: d["type"] == "End")
    compacted = [f["data"] for f in stream.frames if f["event"] == "Compacted"]
    stream.close()
    assert len(compacted) == 2  # before turns 6 and 7: 5 whole turns are done
    history = await api.call("GET", f"{base}/messages", 200)
    summaries = [m["id"] for m in history["items"] if m["type"] == "summary"]
    assert summaries == [c["summaryId"] for c in compacted]
