"""The HTTP+SSE API (F3) in-process over real loopback HTTP."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from agentik.core.testing import ScriptedLLM, make_app
from tests.conftest import TestDatabases, read_sse, scalar

TEXT = [{"type": "text", "body": "hello"}]


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "api.db"


@pytest.fixture
async def client(aiohttp_client, db_path):
    return await aiohttp_client(make_app(env={"AGENTIK_DB_PATH": str(db_path)}))


async def new_conv(client, **body) -> str:
    r = await client.post("/agentik/conversations", json=body or None)
    assert r.status == 201
    return (await r.json())["id"]


async def finish_turn(client, cid: str) -> None:
    for _ in range(500):
        if not (await (await client.get(f"/agentik/conversations/{cid}")).json())["busy"]:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("turn did not finish")


def db_counts(path) -> tuple[int, int, int]:
    return tuple(
        scalar(path, f"SELECT count(*) FROM {t}")
        for t in ("conversation", "message", "working_memory")
    )


async def test_conversation_lifecycle(client):
    cid = await new_conv(client, title="first")
    body = await (await client.get(f"/agentik/conversations/{cid}")).json()
    assert body["title"] == "first" and body["temp"] is False and body["busy"] is False
    r = await client.patch(f"/agentik/conversations/{cid}", json={"title": "renamed"})
    assert r.status == 200 and (await r.json())["title"] == "renamed"
    page = await (await client.get("/agentik/conversations?limit=1")).json()
    assert [c["id"] for c in page["items"]] == [cid] and page["hasMore"] is False
    assert (await client.delete(f"/agentik/conversations/{cid}")).status == 204
    assert (await client.get(f"/agentik/conversations/{cid}")).status == 404
    assert (await client.delete(f"/agentik/conversations/{cid}")).status == 404


@pytest.mark.parametrize(
    "body",
    [
        TEXT,
        {"content": TEXT},
        {"content": TEXT, "context": {"origin": "event", "description": "cron", "sourceId": "c-1"}},
    ],
)
async def test_both_message_body_forms_are_accepted(client, body):
    cid = await new_conv(client)
    r = await client.post(f"/agentik/conversations/{cid}/messages", json=body)
    assert r.status == 202
    ack = await r.json()
    assert ack["type"] == "user" and ack["content"] == TEXT
    await finish_turn(client, cid)
    items = (await (await client.get(f"/agentik/conversations/{cid}/messages")).json())["items"]
    assert [m["type"] for m in items] == ["user", "assistant"]
    assert items[0]["id"] == ack["id"]
    if isinstance(body, dict) and "context" in body:
        assert items[0]["context"]["sourceId"] == "c-1"
        assert items[1]["text"] == "echo: [EVENT] cron (sourceId=c-1)\nhello"
    else:
        assert items[1]["text"] == "echo: hello"


BAD_BODIES = [
    (b"{not json", "malformed JSON"),
    (b"", "needs a JSON body"),
    (b'"text"', "array of content parts or an object"),
    (b"[]", "non-empty array"),
    (b'[{"type": "text"}]', "content[0].body must be a string"),
    (b'[{"type": "video", "body": "x"}]', "content[0].type"),
    (b'[{"type": "text", "body": 5}]', "content[0].body must be a string"),
    (b'{"content": []}', "non-empty array"),
    (b'{"text": "hi"}', "unknown fields"),
    (
        b'{"content": [{"type": "text", "body": "x"}], "context": {"origin": "event"}}',
        "description is required",
    ),
    (
        b'{"content": [{"type": "text", "body": "x"}], "context": {"origin": "boss"}}',
        "context.origin",
    ),
    (b'{"content": [{"type": "text", "body": "x"}], "context": "x"}', "context must be an object"),
    (b'[{"type": "image", "mimeType": "image/png", "data": "AAAA"}]', "image"),
    (b'[{"type": "image", "mimeType": "image/png", "data": "%%%"}]', "base64"),
    (b'[{"type": "image", "mimeType": "image/png", "url": "file:///etc/passwd"}]', "http(s)"),
    (b'[{"type": "image", "mimeType": "image/png", "url": "javascript:alert(1)"}]', "http(s)"),
    ('[{"type": "image", "mimeType": "image/png", "data": "é"}]'.encode(), "base64"),
    (b'[{"type": "text", "body": "\\ud800"}]', "lone surrogate"),
    (
        b'{"content": [{"type": "text", "body": "x"}], "context": {"metadata": {"n": NaN}}}',
        "NaN is not valid JSON",
    ),
    # read as infinity by Python and served back as Infinity, which browsers cannot parse
    (
        b'{"content": [{"type": "text", "body": "x"}], "context": {"metadata": {"n": 1e999}}}',
        "numbers must be finite",
    ),
    (
        b'{"content": [{"type": "text", "body": "x"}], "context": {"metadata": {"n": -1E999}}}',
        "numbers must be finite",
    ),
    (
        b'{"content": [{"type": "text", "body": "x"}], "context": {"metadata": {"n": 1'
        + b"0" * 400
        + b"}}}",
        "numbers must be finite",
    ),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'[{"type": "text", "body": "x", "extra": 1}]', "unknown fields: extra"),
]


@pytest.mark.parametrize(("raw", "message"), BAD_BODIES)
async def test_bad_messages_get_400_and_change_nothing(client, db_path, raw, message):
    cid = await new_conv(client)
    before = db_counts(db_path)
    r = await client.post(
        f"/agentik/conversations/{cid}/messages",
        data=raw,
        headers={"Content-Type": "application/json"},
    )
    assert r.status == 400
    error = (await r.json())["error"]
    assert message in error["message"] and error["code"]
    assert db_counts(db_path) == before


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("get", "/agentik/conversations?limit=0", None, 400),
        ("get", "/agentik/conversations?limit=201", None, 400),
        ("get", "/agentik/conversations?offset=-1", None, 400),
        ("get", "/agentik/conversations?offset=abc", None, 400),
        ("get", "/agentik/conversations?offset=" + "9" * 5000, None, 400),
        ("get", "/agentik/conversations?limit=" + "9" * 5000, None, 400),
        ("get", "/agentik/conversations/{cid}/events?after=" + "9" * 5000, None, 400),
        ("post", "/agentik/conversations", "null", 400),
        ("post", "/agentik/conversations", {"temp": "yes"}, 400),
        ("post", "/agentik/conversations", {"title": 3}, 400),
        ("post", "/agentik/conversations", {"owner": "me"}, 400),
        ("post", "/agentik/conversations", [1], 400),
        ("patch", "/agentik/conversations/{cid}", {"name": "x"}, 400),
        ("patch", "/agentik/conversations/{cid}", {"title": "x" * 1001}, 400),
        ("get", "/agentik/conversations/{cid}/messages?after=nope", None, 404),
        ("get", "/agentik/conversations/{cid}/messages?limit=x", None, 400),
        ("get", "/agentik/conversations/{cid}/events?after=abc", None, 400),
        ("get", "/agentik/conversations/{cid}/events?after=", None, 400),
        ("get", "/agentik/conversations/unknown", None, 404),
        ("patch", "/agentik/conversations/unknown", {"title": "x"}, 404),
        ("post", "/agentik/conversations/unknown/messages", TEXT, 404),
        ("post", "/agentik/conversations/unknown/interrupt", None, 404),
        ("get", "/agentik/conversations/unknown/messages", None, 404),
        ("get", "/agentik/conversations/unknown/events", None, 404),
        ("put", "/agentik/conversations/{cid}", None, 405),
        ("get", "/agentik/nothing-here", None, 404),
    ],
)
async def test_every_bad_request_gets_a_json_error_and_changes_nothing(
    client, db_path, method, path, body, status
):
    cid = await new_conv(client)
    before = db_counts(db_path)
    r = await getattr(client, method)(path.format(cid=cid), json=body)
    assert r.status == status
    assert r.content_type == "application/json"
    error = (await r.json())["error"]
    assert set(error) == {"code", "message"} and error["message"]
    assert db_counts(db_path) == before


async def test_oversize_body_gets_413(client, db_path):
    cid = await new_conv(client)
    before = db_counts(db_path)
    big = [{"type": "text", "body": "x" * (2 * 1024 * 1024)}]
    r = await client.post(f"/agentik/conversations/{cid}/messages", json=big)
    assert r.status == 413
    assert (await r.json())["error"]["code"]
    assert db_counts(db_path) == before


async def test_sse_streams_a_turn_with_ids(client):
    cid = await new_conv(client)
    events = await client.get(f"/agentik/conversations/{cid}/events")
    assert events.headers["Content-Type"] == "text/event-stream"
    await client.post(f"/agentik/conversations/{cid}/messages", json=TEXT)
    frames = await read_sse(events)
    events.close()
    assert [f["event"] for f in frames] == ["UserMessage", "StartResponse", "AppendText", "End"]
    ids = [int(f["id"]) for f in frames]
    assert ids == sorted(ids) and len(set(ids)) == 4
    assert frames[2]["data"] == {"type": "AppendText", "text": "echo: hello"}
    accepted = frames[0]["data"]
    assert accepted["content"] == TEXT and accepted["via"] == {"transport": "http"}
    assert frames[3]["data"] == {"type": "End", "turnId": accepted["id"]}


async def test_last_event_id_resume_gets_every_missed_event_once_in_order(aiohttp_client):
    llm = ScriptedLLM([f"t{i} " for i in range(20)])
    client = await aiohttp_client(make_app(llm=llm))
    cid = await new_conv(client)
    first = await client.get(f"/agentik/conversations/{cid}/events")
    await client.post(f"/agentik/conversations/{cid}/messages", json=TEXT)
    full = await read_sse(first)
    first.close()
    cut = full[5]["id"]
    resumed = await client.get(
        f"/agentik/conversations/{cid}/events", headers={"Last-Event-ID": cut}
    )
    rest = await read_sse(resumed)
    resumed.close()
    assert rest == full[6:]
    by_query = await client.get(f"/agentik/conversations/{cid}/events?after={cut}")
    assert await read_sse(by_query) == full[6:]
    by_query.close()


async def test_a_stream_says_where_it_starts_so_an_early_drop_loses_nothing(aiohttp_client):
    client = await aiohttp_client(make_app(llm=ScriptedLLM(["a ", "b"])))
    cid = await new_conv(client)
    for path in (f"/agentik/conversations/{cid}/events", "/agentik/events"):
        head = await client.head(path)
        assert head.headers["Last-Event-ID"].isdigit()
    early = await client.get(f"/agentik/conversations/{cid}/events")
    start = early.headers["Last-Event-ID"]
    early.close()  # dropped before any event; the turn is sent meanwhile
    await client.post(f"/agentik/conversations/{cid}/messages", json=TEXT)
    await finish_turn(client, cid)
    resumed = await client.get(
        f"/agentik/conversations/{cid}/events", headers={"Last-Event-ID": start}
    )
    assert resumed.headers["Last-Event-ID"] == start
    frames = await read_sse(resumed)
    resumed.close()
    kinds = [f["event"] for f in frames]
    assert kinds == ["UserMessage", "StartResponse", "AppendText", "AppendText", "End"]
    agent_events = await client.get("/agentik/events", headers={"Last-Event-ID": "5"})
    assert agent_events.headers["Last-Event-ID"] == "5"
    agent_events.close()


async def test_two_hundred_sse_subscribers_all_get_the_whole_turn(aiohttp_client):
    client = await aiohttp_client(make_app(llm=ScriptedLLM([f"w{i} " for i in range(30)])))
    cid = await new_conv(client)
    url = client.make_url(f"/agentik/conversations/{cid}/events")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        streams = []
        for _ in range(4):  # in waves, so the listen backlog is never the limit
            streams += await asyncio.gather(*(session.get(url) for _ in range(50)))
        await client.post(f"/agentik/conversations/{cid}/messages", json=TEXT)
        results = await asyncio.gather(*(read_sse(s, timeout=60) for s in streams))
        for s in streams:
            s.close()
    assert all(r == results[0] for r in results)
    assert len(results[0]) == 33  # UserMessage, StartResponse, 30 deltas, End


async def test_a_client_that_disconnects_never_stops_the_turn(aiohttp_client):
    client = await aiohttp_client(make_app(llm=ScriptedLLM(["a"] * 50, delay=0.005)))
    cid = await new_conv(client)
    events = await client.get(f"/agentik/conversations/{cid}/events")
    await client.post(f"/agentik/conversations/{cid}/messages", json=TEXT)
    await events.content.readline()
    events.close()
    await finish_turn(client, cid)
    items = (await (await client.get(f"/agentik/conversations/{cid}/messages")).json())["items"]
    assert items[-1]["text"] == "a" * 50


async def test_interrupt_endpoint(aiohttp_client):
    client = await aiohttp_client(make_app(llm=ScriptedLLM(["a"] * 1000, delay=0.005)))
    cid = await new_conv(client)
    events = await client.get(f"/agentik/conversations/{cid}/events")
    await client.post(f"/agentik/conversations/{cid}/messages", json=TEXT)
    await events.content.readline()
    r = await client.post(f"/agentik/conversations/{cid}/interrupt")
    assert r.status == 202 and (await r.json()) == {"interrupted": True}
    frames = await read_sse(events)
    assert [f["event"] for f in frames[-2:]] == ["Interrupted", "End"]
    again = await client.post(f"/agentik/conversations/{cid}/interrupt")
    assert (await again.json()) == {"interrupted": False}


async def test_agent_events_stream(client):
    events = await client.get("/agentik/events")
    cid = await new_conv(client)
    await client.delete(f"/agentik/conversations/{cid}")
    frames = await read_sse(events, until="ConversationDeleted")
    assert [f["event"] for f in frames] == ["ConversationCreated", "ConversationDeleted"]
    assert frames[0]["data"] == {"type": "ConversationCreated", "conversationId": cid}


async def test_temp_conversation_over_http(client, db_path):
    cid = await new_conv(client, temp=True)
    await client.post(f"/agentik/conversations/{cid}/messages", json=TEXT)
    await finish_turn(client, cid)
    items = (await (await client.get(f"/agentik/conversations/{cid}/messages")).json())["items"]
    assert [m["type"] for m in items] == ["user", "assistant"]
    if TestDatabases.current is None:  # alone on its store it is never written
        assert db_counts(db_path) == (0, 0, 0)
    listed = (await (await client.get("/agentik/conversations")).json())["items"]
    assert cid not in [c["id"] for c in listed]
    assert (await client.delete(f"/agentik/conversations/{cid}")).status == 204
    assert db_counts(db_path) == (0, 0, 0)  # where instances share the store: from now on


async def test_health(client):
    r = await client.get("/health")
    assert r.status == 200 and (await r.json())["status"] == "ok"


async def test_shutdown_ends_open_streams(db_path):
    from aiohttp import web

    app = make_app(env={"AGENTIK_DB_PATH": str(db_path)})
    runner = web.AppRunner(app, shutdown_timeout=5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    async with aiohttp.ClientSession() as s:
        r = await s.post(f"http://127.0.0.1:{port}/agentik/conversations")
        cid = (await r.json())["id"]
        streams = [
            await s.get(f"http://127.0.0.1:{port}/agentik/conversations/{cid}/events"),
            await s.get(f"http://127.0.0.1:{port}/agentik/events"),
        ]
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await runner.cleanup()
        assert loop.time() - t0 < 3
        for stream in streams:
            assert await asyncio.wait_for(stream.content.read(), 3) is not None
            assert stream.content.at_eof()


async def test_a_client_that_never_reads_does_not_block_the_turn(aiohttp_client):
    chunk = "x" * 4096
    llm = ScriptedLLM([chunk] * 2000)  # ~8 MB of events, far beyond any socket buffer
    client = await aiohttp_client(make_app(llm=llm, env={"AGENTIK_EVENT_BUFFER": "64"}))
    cid = await new_conv(client)
    reader, writer = await asyncio.open_connection(client.host, client.port)
    writer.write(f"GET /agentik/conversations/{cid}/events HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    await reader.readline()  # the status line: the stream is open; now we stop reading
    fast = await client.get(f"/agentik/conversations/{cid}/events")
    await client.post(f"/agentik/conversations/{cid}/messages", json=TEXT)
    frames = await read_sse(fast, timeout=60)
    fast.close()
    # the reading client got everything (UserMessage, StartResponse, the deltas, End), the
    # stuck one held nobody
    assert len(frames) == 2003
    await finish_turn(client, cid)
    page = await (await client.get(f"/agentik/conversations/{cid}/messages")).json()
    # the 8 MB reply is past a page's byte budget: it comes alone on the next page
    assert [m["type"] for m in page["items"]] == ["user"] and page["hasMore"]
    url = f"/agentik/conversations/{cid}/messages?after={page['nextAfter']}"
    page = await (await client.get(url)).json()
    assert len(page["items"][-1]["text"]) == 4096 * 2000 and not page["hasMore"]
    writer.close()


async def test_a_huge_last_event_id_gets_400(client):
    cid = await new_conv(client)
    r = await client.get(
        f"/agentik/conversations/{cid}/events", headers={"Last-Event-ID": "9" * 5000}
    )
    assert r.status == 400 and "Last-Event-ID" in (await r.json())["error"]["message"]


async def test_a_broken_gzip_body_gets_a_json_400_and_no_traceback(client, db_path, caplog):
    cid = await new_conv(client)
    before = db_counts(db_path)
    r = await client.post(
        f"/agentik/conversations/{cid}/messages",
        data=b"\x1f\x8b not gzip at all",
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert r.status == 400 and r.content_type == "application/json"
    assert "could not be read" in (await r.json())["error"]["message"]
    assert db_counts(db_path) == before
    assert "Traceback" not in caplog.text and "Unhandled exception" not in caplog.text


async def test_head_on_a_history_page_sends_headers_only(client):
    """The page is written a chunk at a time; a HEAD gets its headers and no body (a body
    after a HEAD's headers would be read by the client as the next response)."""
    cid = await new_conv(client)
    await client.post(f"/agentik/conversations/{cid}/messages", json=TEXT)
    await finish_turn(client, cid)
    r = await client.head(f"/agentik/conversations/{cid}/messages")
    assert r.status == 200 and r.content_type == "application/json"
    assert await r.read() == b""
    r = await client.get(f"/agentik/conversations/{cid}/messages")  # the connection is sound
    assert [m["type"] for m in (await r.json())["items"]] == ["user", "assistant"]


async def test_head_on_an_sse_endpoint_sends_headers_only(client):
    cid = await new_conv(client)
    for path in (f"/agentik/conversations/{cid}/events", "/agentik/events"):
        r = await asyncio.wait_for(client.head(path), 3)
        assert r.status == 200 and r.content_type == "text/event-stream"
        assert await asyncio.wait_for(r.read(), 3) == b""


@pytest.mark.sqlite_file
async def test_a_disk_failure_is_a_503_that_a_keyed_retry_completes(client, db_path, monkeypatch):
    """The fsync after the commit fails: 503 with Retry-After (not a 500), and the client's
    retry with the same key runs the message that was stored, once."""
    from agentik.core.app import AGENT

    cid = await new_conv(client)
    db = client.app[AGENT].store.db
    real = db._sync_wal

    def failing_once() -> None:
        monkeypatch.setattr(db, "_sync_wal", real)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(db, "_sync_wal", failing_once)
    url = f"/agentik/conversations/{cid}/messages"
    headers = {"Idempotency-Key": "disk-1"}
    r = await client.post(url, json=TEXT, headers=headers)
    assert r.status == 503 and r.headers["Retry-After"] == "1"
    assert (await r.json())["error"]["code"] == "storage_unavailable"
    again = await client.post(url, json=TEXT, headers=headers)
    assert again.status == 202
    await finish_turn(client, cid)
    items = (await (await client.get(url)).json())["items"]
    assert [m["type"] for m in items] == ["user", "assistant"]
    assert items[0]["id"] == (await again.json())["id"]


async def test_a_history_page_ends_at_its_byte_budget_with_a_cursor(client):
    """Six 900 KB sends and their six 900 KB echoes: a page of 50 would be 10 MB. It ends
    once its messages reach the budget (4 MiB), says more follow and where to go on from;
    following the cursors, or the offsets, gives every message once, in order."""
    cid = await new_conv(client)
    url = f"/agentik/conversations/{cid}/messages"
    for i in range(6):
        body = [{"type": "text", "body": f"{i}" + "y" * 900_000}]
        assert (await client.post(url, json=body)).status == 202
        await finish_turn(client, cid)
    seen, after, pages = [], None, 0
    while True:
        r = await client.get(url, params={"limit": 50, **({"after": after} if after else {})})
        raw = await r.read()
        page = json.loads(raw)
        pages += 1
        assert 1 <= len(page["items"]) <= 50
        assert len(raw) <= 4 * 2**20 + 1_000_000  # the budget, give or take the last message
        seen += page["items"]
        if not page["hasMore"]:
            assert page["nextAfter"] is None
            break
        assert page["nextAfter"] == page["items"][-1]["id"] and len(page["items"]) < 50
        after = page["nextAfter"]
    assert pages >= 3
    assert [m["type"] for m in seen] == ["user", "assistant"] * 6
    assert [m["text"][6] for m in seen if m["type"] == "assistant"] == list("012345")
    assert len({m["id"] for m in seen}) == 12
    by_offset, offset = [], 0
    while True:
        page = await (await client.get(url, params={"offset": offset, "limit": 50})).json()
        by_offset += page["items"]
        offset += len(page["items"])
        if not page["hasMore"]:
            break
    assert [m["id"] for m in by_offset] == [m["id"] for m in seen]


@pytest.mark.sqlite_file
async def test_storage_failures_log_one_line_per_kind_not_one_per_request(client, caplog):
    """A database that refuses writes (SQLite's own "readonly" error) while clients retry
    every second: each request gets its 503, and the log gets one line with the traceback,
    not a traceback per request; /health/ready says why the server is not ready."""
    import logging

    from agentik.core.app import AGENT, READINESS, TROUBLE

    db = client.app[AGENT].store.db
    db.execute("PRAGMA query_only = 1")
    caplog.set_level(logging.INFO)
    for _ in range(8):
        r = await client.post("/agentik/conversations")
        assert r.status == 503 and (await r.json())["error"]["code"] == "storage_unavailable"
    lines = [r for r in caplog.records if "storage errors" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is not None, [r.getMessage() for r in lines]
    assert "attempt to write a readonly database" in lines[0].getMessage()
    assert sum(n for k, n in client.app[TROUBLE].totals.items() if "storage" in k) == 8
    ready = await client.get("/health/ready")
    assert ready.status == 503
    reasons = (await ready.json())["reasons"]
    assert any("refuses writes" in r for r in reasons)
    assert any("a request failed on storage" in r for r in reasons)
    assert (await client.get("/health")).status == 200  # alive all the same
    db.execute("PRAGMA query_only = 0")
    readiness = client.app[READINESS]
    readiness.probe_interval = readiness.error_window = 0  # no waiting in a test
    assert (await client.get("/health/ready")).status == 200


async def test_an_idempotency_key_stores_and_runs_a_retried_send_once(client, db_path):
    cid = await new_conv(client)
    other = await new_conv(client)
    url = f"/agentik/conversations/{cid}/messages"
    headers = {"Idempotency-Key": "retry-1"}
    first = await client.post(url, json=TEXT, headers=headers)
    again = await client.post(url, json=[{"type": "text", "body": "changed"}], headers=headers)
    assert first.status == again.status == 202
    sent, resent = await first.json(), await again.json()
    assert sent.pop("turn") in ("queued", "running") and resent.pop("turn") in ("running", "done")
    assert sent == resent  # the first message, not a new one
    r = await client.post(f"/agentik/conversations/{other}/messages", json=TEXT, headers=headers)
    assert r.status == 202 and (await r.json())["id"] != (await first.json())["id"]
    await finish_turn(client, cid)
    items = (await (await client.get(url)).json())["items"]
    assert [m["type"] for m in items] == ["user", "assistant"]  # one message, one turn
    for bad in ("x" * 256, "café", "tab\there"):  # the OpenAPI pattern: printable ASCII
        r = await client.post(url, json=TEXT, headers={"Idempotency-Key": bad})
        assert r.status == 400 and "Idempotency-Key" in (await r.json())["error"]["message"], bad


async def test_shutdown_sends_interrupted_and_end_before_closing_streams(db_path):
    from aiohttp import web

    app = make_app(
        llm=ScriptedLLM(["slow "] * 1000, delay=0.01), env={"AGENTIK_DB_PATH": str(db_path)}
    )
    runner = web.AppRunner(app, shutdown_timeout=5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}/agentik/conversations"
    async with aiohttp.ClientSession() as s:
        cid = (await (await s.post(base)).json())["id"]
        stream = await s.get(f"{base}/{cid}/events")
        await s.post(f"{base}/{cid}/messages", json=TEXT)
        await s.post(f"{base}/{cid}/messages", json=TEXT)  # queued: runs after the restart
        await stream.content.readline()  # the turn is streaming
        await runner.cleanup()
        body = (await asyncio.wait_for(stream.content.read(), 5)).decode()
    events = [line[7:] for line in body.splitlines() if line.startswith("event: ")]
    assert events[-2:] == ["Interrupted", "End"]
