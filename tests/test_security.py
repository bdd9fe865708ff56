"""Safe to expose (F17): API keys on every route of every transport, the Host allow-list,
cross-site requests, the bind address and the banner."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from agentik import hookimpl
from agentik.core import security
from agentik.core.settings import SettingsError
from agentik.core.testing import make_app
from tests.conftest import BIN, read_sse, scalar, script_fake

KEY = "k-0123456789abcdef-first"
OTHER_KEY = "k-0123456789abcdef-second"
TEXT = [{"type": "text", "body": "hello"}]


class PluginRoute:
    """A third-party transport: its route must be guarded like the built-in ones."""

    @hookimpl
    def register_transports(self, register):
        async def ping(request):
            return web.json_response({"pong": True})

        register("ping", lambda app, agent, settings: app.router.add_get("/plugin/ping", ping))


#: every built-in plugin that adds routes
TRANSPORTS = (
    "agentik_transport_http",
    "agentik_transport_a2a",
    "agentik_transport_agui",
    "agentik_transport_openai",
    "agentik_transport_mcp_server",
    "agentik_debug",
    "agentik_transport_web",
)
#: routes anyone may read: the health checks, the A2A agent card (it declares the scheme), and
#: the web page's own files (it must load to ask for the key; it holds no data)
PUBLIC = (
    "/health",
    "/health/ready",
    "/.well-known/agent-card.json",
    "/a2a/.well-known/agent-card.json",
    "/",
    "/assets/app.js",
)


def keyed_app(db_path, **env):
    return make_app(
        plugins=[("ping", PluginRoute())],
        env={
            "AGENTIK_API_KEY": f"{KEY},{OTHER_KEY}",
            "AGENTIK_DB_PATH": str(db_path),
            "AGENTIK_DEBUG_ENDPOINTS": "1",
            **env,
        },
        builtins=TRANSPORTS,
    )


def concrete_routes(app: web.Application, cid: str) -> list[tuple[str, str]]:
    """(method, path) of every route of the app and its sub-apps, ids filled in."""
    out = []

    def walk(a: web.Application, prefix: str) -> None:
        for resource in a.router.resources():
            info = resource.get_info()
            if "app" in info:
                walk(info["app"], prefix + info.get("prefix", ""))
                continue
            path = info.get("path") or info.get("formatter", "")
            for route in resource:
                if route.method not in ("HEAD", "*"):
                    path = path.replace("{id}", cid).replace("{name}", "app.js")
                    out.append((route.method, prefix + path))

    walk(app, "")
    return out


async def test_every_route_of_every_transport_needs_a_key(aiohttp_client, tmp_path):
    app = keyed_app(tmp_path / "a.db")
    client = await aiohttp_client(app)
    ok = {"Authorization": f"Bearer {KEY}"}
    cid = (await (await client.post("/agentik/conversations", headers=ok)).json())["id"]
    routes = concrete_routes(app, cid)
    assert ("GET", "/plugin/ping") in routes and ("GET", "/health") in routes
    assert {
        ("POST", "/a2a"),
        ("POST", "/agui"),
        ("POST", "/debug/{action}"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/v1/models"),
        ("POST", "/mcp"),
        ("GET", "/mcp"),
        ("DELETE", "/mcp"),
    } <= set(routes)
    for method, path in routes:
        for headers in (
            {},
            {"Authorization": "Bearer wrong-key-wrong-key"},
            {"Authorization": KEY},
        ):
            r = await client.request(method, path, headers=headers)
            if path in PUBLIC:
                assert r.status == 200, (method, path)
                continue
            assert r.status == 401, (method, path, headers)
            assert r.headers["WWW-Authenticate"] == 'Bearer realm="agentik"'
            assert (await r.json())["error"]["code"] == "unauthorized"
        r = await client.request(method, path, headers={"Authorization": f"Bearer {OTHER_KEY}"})
        assert r.status != 401, (method, path)
    assert (
        scalar(tmp_path / "a.db", "SELECT count(*) FROM conversation") == 1
    )  # refused requests changed nothing


async def test_sse_takes_the_key_as_a_query_parameter_and_nothing_else_does(
    aiohttp_client, tmp_path
):
    client = await aiohttp_client(keyed_app(tmp_path / "b.db"))
    ok = {"Authorization": f"Bearer {KEY}"}
    cid = (await (await client.post("/agentik/conversations", headers=ok)).json())["id"]
    events = await client.get(
        f"/agentik/conversations/{cid}/events?access_token={KEY}",
        headers={"Accept": "text/event-stream"},
    )
    assert events.status == 200
    await client.post(f"/agentik/conversations/{cid}/messages", json=TEXT, headers=ok)
    frames = await read_sse(events)
    assert frames[-1]["event"] == "End"
    events.close()
    r = await client.post(f"/agentik/conversations/{cid}/messages?access_token={KEY}", json=TEXT)
    assert r.status == 401  # only an EventSource needs it in the URL
    r = await client.get(f"/agentik/conversations/{cid}?access_token={KEY}")
    assert r.status == 401
    # asking for an event stream does not make a route an event stream
    sse = {"Accept": "text/event-stream"}
    for path in (f"/agentik/conversations/{cid}", f"/agentik/conversations/{cid}/messages"):
        r = await client.get(f"{path}?access_token={KEY}", headers=sse)
        assert r.status == 401, path
    r = await client.get(f"/agentik/events?access_token={KEY}", headers=sse)
    assert r.status == 200
    r.close()


async def test_without_a_key_only_loopback_host_names_are_served(aiohttp_client, tmp_path):
    client = await aiohttp_client(make_app(env={"AGENTIK_DB_PATH": str(tmp_path / "c.db")}))
    for host in ("localhost", f"localhost:{client.port}", "127.0.0.1:80", "[::1]:8080"):
        assert (await client.get("/health", headers={"Host": host})).status == 200, host
    for host in ("evil.example", "evil.example:8080", "127.0.0.1.evil.example"):
        r = await client.post("/agentik/conversations", headers={"Host": host})
        assert r.status == 403 and (await r.json())["error"]["code"] == "host_not_allowed"
    # not a host at all, whatever it starts with
    for host in ("127.0.0.1:80@evil.com", "localhost:80/x", "127.0.0.1:8o", "a b", "[::1"):
        r = await client.post("/agentik/conversations", headers={"Host": host})
        assert r.status == 400 and (await r.json())["error"]["code"] == "bad_host", host
    assert scalar(tmp_path / "c.db", "SELECT count(*) FROM conversation") == 0
    client2 = await aiohttp_client(make_app(env={"AGENTIK_ALLOWED_HOSTS": "agent.lan"}))
    assert (await client2.get("/health", headers={"Host": "agent.lan:8080"})).status == 200
    assert (await client2.get("/health", headers={"Host": "evil.example"})).status == 403


async def test_cross_site_requests_are_refused(aiohttp_client, tmp_path):
    client = await aiohttp_client(make_app(env={"AGENTIK_DB_PATH": str(tmp_path / "d.db")}))
    # what a page on another site can send without asking: a text/plain or form POST
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        r = await client.post(
            "/agentik/conversations", data=b'{"title": "x"}', headers={"Content-Type": content_type}
        )
        assert r.status == 415, content_type
    # a bodiless POST from another origin (fetch with mode: no-cors)
    r = await client.post("/agentik/conversations", headers={"Origin": "https://evil.example"})
    assert r.status == 403 and (await r.json())["error"]["code"] == "cross_origin"
    assert scalar(tmp_path / "d.db", "SELECT count(*) FROM conversation") == 0
    # the same origin (a page the server itself serves) is not cross-site
    own = f"http://127.0.0.1:{client.port}"
    assert (await client.post("/agentik/conversations", headers={"Origin": own})).status == 201


async def test_a_body_in_an_unknown_content_encoding_gets_a_415(aiohttp_client, tmp_path):
    """Read as it is, an encoded body would be parsed as something it is not."""
    import gzip

    client = await aiohttp_client(make_app(env={"AGENTIK_DB_PATH": str(tmp_path / "e.db")}))
    json_body = {"Content-Type": "application/json"}
    for encoding in ("compress", "x-rot13", "gzip, gzip", "br-x"):
        r = await client.post(
            "/agentik/conversations",
            data=b'{"title": "x"}',
            headers={**json_body, "Content-Encoding": encoding},
        )
        assert r.status == 415, encoding
        assert (await r.json())["error"]["code"] == "unsupported_content_encoding"
    assert scalar(tmp_path / "e.db", "SELECT count(*) FROM conversation") == 0
    r = await client.post(
        "/agentik/conversations",
        data=gzip.compress(b'{"title": "zipped"}'),
        headers={**json_body, "Content-Encoding": "gzip"},
    )
    assert r.status == 201 and (await r.json())["title"] == "zipped"


async def test_cors_allows_only_the_named_origins(aiohttp_client):
    app_origin = "https://app.example.com"
    client = await aiohttp_client(make_app(env={"AGENTIK_CORS_ORIGINS": app_origin}))
    preflight = await client.options(
        "/agentik/conversations",
        headers={
            "Origin": app_origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        },
    )
    assert preflight.status == 204
    assert preflight.headers["Access-Control-Allow-Origin"] == app_origin
    assert "POST" in preflight.headers["Access-Control-Allow-Methods"]
    assert "Content-Type" in preflight.headers["Access-Control-Allow-Headers"]
    r = await client.post("/agentik/conversations", json={}, headers={"Origin": app_origin})
    assert r.status == 201 and r.headers["Access-Control-Allow-Origin"] == app_origin
    cid = (await r.json())["id"]
    stream = await client.get(
        f"/agentik/conversations/{cid}/events", headers={"Origin": app_origin}
    )
    assert stream.headers["Access-Control-Allow-Origin"] == app_origin  # SSE too
    stream.close()
    other = await client.get("/health", headers={"Origin": "https://evil.example"})
    assert "Access-Control-Allow-Origin" not in other.headers


async def test_a_refused_origin_leaves_one_log_line_per_origin(aiohttp_client, caplog):
    """An operator whose web page is turned away finds it in the log, once per origin (a
    refused POST, or a preflight the browser then fails), not once per request."""
    client = await aiohttp_client(make_app(env={"AGENTIK_CORS_ORIGINS": "https://ok.example"}))
    caplog.set_level("WARNING", "agentik.core.security")
    evil, other = {"Origin": "https://evil.example"}, {"Origin": "https://other.example"}
    for _ in range(3):
        r = await client.post("/agentik/conversations", json={}, headers=evil)
        assert r.status == 403
    preflight = {**other, "Access-Control-Request-Method": "POST"}
    await client.options("/agentik/conversations", headers=preflight)
    await client.options("/agentik/conversations", headers=preflight)
    await client.post("/agentik/conversations", json={}, headers={"Origin": "https://ok.example"})
    lines = [r.getMessage() for r in caplog.records if r.name == "agentik.core.security"]
    assert lines == [
        "refused a browser page at https://evil.example (POST /agentik/conversations): it is "
        "not in AGENTIK_CORS_ORIGINS (logged once a minute per origin)",
        "refused a browser page at https://other.example (OPTIONS /agentik/conversations): it "
        "is not in AGENTIK_CORS_ORIGINS (logged once a minute per origin)",
    ]


def test_once_per_interval_per_key_and_a_bounded_table():
    now = [0.0]
    limiter = security.OncePerInterval(60, most=2, clock=lambda: now[0])
    assert limiter.due("a") and not limiter.due("a") and limiter.due("b")
    assert not limiter.due("c")  # two keys this minute already: no more lines, no more rows
    now[0] = 59.9
    assert not limiter.due("a")
    now[0] = 60.0
    assert limiter.due("a") and limiter.due("c") and len(limiter.last) == 2


async def test_no_server_version_header(aiohttp_client):
    client = await aiohttp_client(make_app())
    for path in ("/health", "/agentik/nothing"):
        assert "Server" not in (await client.get(path)).headers


def test_bind_address_defaults_and_refusals():
    def settings(**env):
        base = {
            "AGENTIK_API_KEY": None,
            "AGENTIK_HOST": None,
            "AGENTIK_ALLOW_UNAUTHENTICATED": False,
        }
        return {**base, **env}

    assert security.bind_host(settings()) == "127.0.0.1"
    assert security.bind_host(settings(AGENTIK_API_KEY=(KEY,))) == "0.0.0.0"
    assert security.bind_host(settings(AGENTIK_HOST="::1")) == "::1"
    with pytest.raises(ValueError, match=r"AGENTIK_API_KEY.*AGENTIK_ALLOW_UNAUTHENTICATED"):
        security.bind_host(settings(AGENTIK_HOST="0.0.0.0"))
    allowed = settings(AGENTIK_HOST="0.0.0.0", AGENTIK_ALLOW_UNAUTHENTICATED=True)
    assert security.bind_host(allowed) == "0.0.0.0"


def test_api_keys_from_a_list_or_a_file(tmp_path):
    assert security.parse_api_keys(f"{KEY}, {OTHER_KEY}") == (KEY, OTHER_KEY)
    keys = tmp_path / "keys"
    keys.write_text(f"# the team's keys\n{KEY}\n\n{OTHER_KEY}\n")
    assert security.parse_api_keys(f"@{keys}") == (KEY, OTHER_KEY)
    with pytest.raises(ValueError, match="at least 16"):
        security.parse_api_keys("short")
    with pytest.raises(ValueError, match="cannot read"):
        security.parse_api_keys(f"@{tmp_path / 'missing'}")


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("short-secret", "the key is too short: a key must be at least 16 characters"),
        (f"{KEY},tiny-secret", "key 2 of 2 is too short: a key must be at least 16 characters"),
        ("@{missing}", "cannot read the key file {missing}: No such file or directory"),
        ("@{empty}", "the key file {empty} holds no key (one a line, # comments)"),
        (" , ", "no key given"),
    ],
)
def test_a_bad_api_key_says_why_without_showing_it(tmp_path, raw, why):
    """A secret is never echoed, but the reason is: too short (the minimum), an unreadable or
    empty key file (its path)."""
    paths = {"missing": tmp_path / "missing", "empty": tmp_path / "empty"}
    paths["empty"].write_text("# no keys yet\n")
    raw, why = raw.format(**paths), why.format(**paths)
    with pytest.raises(SettingsError) as info:
        make_app(env={"AGENTIK_API_KEY": raw})
    assert str(info.value) == f"AGENTIK_API_KEY=*** is invalid: {why}"
    assert "secret" not in str(info.value)  # no part of a key


def test_serve_refuses_to_expose_the_agent_without_a_key(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "AGENTIK_HOST": "0.0.0.0", "AGENTIK_LLM_BACKEND": "openai"}
    out = subprocess.run(
        [str(BIN / "agentik"), "serve"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2
    assert "AGENTIK_HOST='0.0.0.0' would expose the agent without a key" in out.stderr
    assert "Traceback" not in out.stderr


async def test_the_banner_names_the_bound_address_and_the_key(serve, fake_openai_proc):
    env = {
        "OPENAI_BASE_URL": fake_openai_proc,
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_MODEL": "fake",
        "AGENTIK_API_KEY": KEY,
    }
    proc, base = serve(env)
    banner = proc.wait_output("tokens:")
    first = next(line for line in banner.splitlines() if line.startswith("agentik listening"))
    assert first == f"agentik listening on {base} (this machine only; API key required (1 key))"


async def test_slow_and_silent_clients_are_cut_off(serve, fake_openai_proc):
    """A connection that sends nothing, one that trickles its headers, and one whose body is
    shorter than its Content-Length each lose their connection (or get a 408), and the server
    keeps answering others meanwhile."""
    import asyncio
    import time

    env = {
        "OPENAI_BASE_URL": fake_openai_proc,
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_MODEL": "fake",
        "AGENTIK_KEEPALIVE_TIMEOUT": "1",
        "AGENTIK_BODY_TIMEOUT": "1",
    }
    proc, base = serve(env)
    host, port = base.removeprefix("http://").split(":")

    async def closed_after(writer_work) -> float:
        reader, writer = await asyncio.open_connection(host, int(port))
        began = time.monotonic()
        await writer_work(writer)
        try:
            data = await asyncio.wait_for(reader.read(), 10)  # until the server closes
        except ConnectionError:
            data = b""
        writer.close()
        return time.monotonic() - began, data

    async def silent(writer):
        pass

    async def trickle(writer):  # 2.5 s of headers at 20 bytes/s: closed on the way
        try:
            for ch in b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: aaaaaa\r\n":
                writer.write(bytes([ch]))
                await writer.drain()
                await asyncio.sleep(0.05)
        except ConnectionError:
            pass

    async def short_body(writer):
        writer.write(
            b"POST /agentik/conversations HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        await writer.drain()

    took, data = await closed_after(silent)
    assert took < 5 and data == b""
    took, data = await closed_after(trickle)
    assert took < 8 and b"200" not in data
    for _ in range(2):
        took, data = await closed_after(short_body)
        assert took < 5 and b"408" in data.split(b"\r\n")[0] and b"request_timeout" in data
    # logged once, not per client
    assert proc.output.count("request bodies that did not arrive within") == 1
    async with aiohttp.ClientSession() as s, s.get(f"{base}/health") as r:
        assert r.status == 200


def fake_env(fake_openai_proc: str, **more: str) -> dict[str, str]:
    return {
        "OPENAI_BASE_URL": fake_openai_proc,
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_MODEL": "fake",
        **more,
    }


async def raw_exchange(base: str, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection and read until the server closes it."""
    import asyncio

    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


def split_response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


async def test_requests_aiohttp_cannot_parse_get_json_errors_and_one_log_line(
    serve, fake_openai_proc
):
    """A bad request line, NUL in a header, an over-long header and an unknown method are
    answered before any handler runs: JSON bodies, no Server header, no traceback, and ten
    of them are one line in the log."""
    import json

    proc, base = serve(fake_env(fake_openai_proc))
    host = b"Host: 127.0.0.1\r\n"
    broken = [
        b"GET\x00 /health HTTP/1.1\r\n" + host + b"\r\n",
        b"GET /health HTTP/1.1\r\n" + host + b"X-A: a\x00b\r\n\r\n",
        b"GET /health HTTP/1.1\r\n" + host + b"X-A: " + b"a" * 10_000 + b"\r\n\r\n",
        b"F(O) /health HTTP/1.1\r\n" + host + b"\r\n",
    ]
    for request in broken * 3:
        status, headers, body = split_response(await raw_exchange(base, request))
        assert status == 400
        assert headers["content-type"].startswith("application/json")
        assert "server" not in headers
        error = json.loads(body)["error"]
        assert error["code"] == "bad_request" and error["message"]
    async with aiohttp.ClientSession() as s, s.get(f"{base}/health") as r:
        assert r.status == 200  # and the server goes on
    log = proc.output
    assert "Traceback" not in log
    assert log.count("malformed requests answered 400") == 1


async def test_connections_beyond_the_cap_get_a_503_and_close(serve, fake_openai_proc):
    import asyncio
    import json

    proc, base = serve(fake_env(fake_openai_proc, AGENTIK_MAX_CONNECTIONS="3"))
    host, port = base.removeprefix("http://").split(":")
    held = [await asyncio.open_connection(host, int(port)) for _ in range(3)]
    await asyncio.sleep(0.2)
    request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    for _ in range(10):
        status, headers, body = split_response(await raw_exchange(base, request))
        assert status == 503 and headers["retry-after"] == "1"
        assert json.loads(body)["error"]["code"] == "too_many_connections"
    for _, writer in held:
        writer.close()
    await asyncio.sleep(0.3)
    async with aiohttp.ClientSession() as s, s.get(f"{base}/health") as r:
        assert r.status == 200  # the refused ones left nothing behind
    assert proc.output.count("connections refused") == 1


def test_the_cap_fits_the_descriptor_limit():
    """The soft limit is raised to the hard one (a burst past the cap needs descriptors too,
    for the moment its connections are refused); where the hard limit is lower than the cap
    and its reserve, the cap is lowered, with a warning naming the variable."""
    import sys

    script = (
        "import resource\n"
        "from agentik.core.listener import connection_cap, FD_RESERVE\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (100, 4000))\n"
        "assert connection_cap(300) == 300, 'raised'\n"
        "assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == 4000\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (100, 400))\n"
        "warned = []\n"
        "assert connection_cap(1000, warned.append) == 400 - FD_RESERVE\n"
        "print(warned[0])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("AGENTIK_MAX_CONNECTIONS=1000 needs 1064 file descriptors")


async def test_one_address_flooding_leaves_the_others_their_answers(serve, fake_openai_proc):
    """The attack of the reliability probe, scaled to this machine: 400 slow connections from
    one address (127.0.0.2), each reconnecting the moment it is closed, against a server that
    holds 300 at most. Without per-client limits they take every slot and the other clients
    get 503s; with them the flood gets its 100 and 429s, and a client at 127.0.0.3 keeps at
    least 95% of its answers."""
    import asyncio

    proc, base = serve(
        fake_env(fake_openai_proc, AGENTIK_MAX_CONNECTIONS="300", AGENTIK_KEEPALIVE_TIMEOUT="60")
    )
    port = int(base.rsplit(":", 1)[1])
    flooding = True

    async def slow_client() -> None:
        while flooding:
            writer = None
            try:
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", port, local_addr=("127.0.0.2", 0)
                )
                writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # no end
                await writer.drain()
                await reader.read()  # held until the server closes it
            except OSError:
                await asyncio.sleep(0.01)
            finally:
                if writer is not None:
                    writer.close()

    flood = [asyncio.create_task(slow_client()) for _ in range(400)]
    try:
        await asyncio.sleep(2)  # the flood holds what it can
        answers = []
        timeout = aiohttp.ClientTimeout(total=10)
        connector = aiohttp.TCPConnector(local_addr=("127.0.0.3", 0), force_close=True)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as s:
            for _ in range(60):
                try:
                    async with s.get(f"{base}/health") as r:
                        answers.append(r.status)
                except (aiohttp.ClientError, TimeoutError) as e:
                    answers.append(type(e).__name__)
    finally:
        flooding = False
        for task in flood:
            task.cancel()
        await asyncio.gather(*flood, return_exceptions=True)
    assert answers.count(200) >= 57, answers
    log = proc.output
    assert log.count("connections refused (429): their client was over its limits") == 1
    assert "Traceback" not in log


async def test_behind_a_trusted_proxy_the_forwarded_client_is_limited(aiohttp_client, tmp_path):
    """From a trusted proxy (loopback by default) each client named by X-Forwarded-For has its
    own limit of requests at once, SSE streams included; a client cannot choose its name by
    sending the header itself (the proxy appends the real address last); from an untrusted
    peer the header means nothing."""
    env = {"AGENTIK_DB_PATH": str(tmp_path / "p.db"), "AGENTIK_MAX_CLIENT_CONNECTIONS": "3"}
    client = await aiohttp_client(make_app(env=env))

    def via(*hops):
        return {"X-Forwarded-For": ", ".join(hops)}

    held = [await client.get("/agentik/events", headers=via("203.0.113.7")) for _ in range(3)]
    assert all(r.status == 200 for r in held)
    r = await client.get("/agentik/events", headers=via("203.0.113.7"))
    assert r.status == 429 and r.headers["Retry-After"] == "1"
    assert (await r.json())["error"]["code"] == "too_many_client_connections"
    # what the client wrote itself comes first: the proxy's own hop decides
    r = await client.get("/health", headers=via("198.51.100.1", "203.0.113.7"))
    assert r.status == 429
    assert (await client.get("/health", headers=via("203.0.113.7", "198.51.100.1"))).status == 200
    assert (await client.get("/health")).status == 200  # a local client: not limited
    held[0].close()
    await asyncio.sleep(0.1)
    assert (await client.get("/health", headers=via("203.0.113.7"))).status == 200
    for r in held[1:]:
        r.close()
    untrusted = await aiohttp_client(
        make_app(
            env={
                **env,
                "AGENTIK_TRUSTED_PROXIES": "none",
                "AGENTIK_DB_PATH": str(tmp_path / "q.db"),
            }
        )
    )
    streams = [await untrusted.get("/agentik/events", headers=via("203.0.113.7")) for _ in range(4)]
    assert all(r.status == 200 for r in streams)  # the header is ignored
    for r in streams:
        r.close()


async def test_descriptor_exhaustion_costs_one_log_line_and_no_connection(serve, fake_openai_proc):
    """The limit is raised to the hard limit at start-up. Where even that is too low for a
    burst (200 here), accepting stops for a second at a time and one line is logged, not a
    traceback per connection; every connection gets its answer (200, or 503 over the cap)."""
    import asyncio
    import re

    proc, base = serve(fake_env(fake_openai_proc), nofile="64:4096")
    limits = await asyncio.to_thread(Path(f"/proc/{proc.proc.pid}/limits").read_text)
    assert re.search(r"Max open files\s+4096\s+4096", limits), limits
    proc.stop()
    proc, base = serve(fake_env(fake_openai_proc), nofile="200:200")
    host, port = base.removeprefix("http://").split(":")

    async def one() -> bytes:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        await writer.drain()
        try:
            return await reader.read()
        finally:
            writer.close()

    answers = await asyncio.wait_for(asyncio.gather(*(one() for _ in range(600))), 60)
    statuses = [a.split(b" ", 2)[1] for a in answers if a]
    assert len(statuses) == 600 and set(statuses) <= {b"200", b"503"}
    log = proc.output
    assert "Traceback" not in log and "socket.accept() out of system resource" not in log
    assert log.count("out of file descriptors") <= 1
    async with aiohttp.ClientSession() as s, s.get(f"{base}/health") as r:
        assert r.status == 200


async def test_a_client_that_stops_reading_is_dropped_after_the_write_timeout(
    serve, fake_openai_proc
):
    """A client asks for big history pages (four 2.7 MB pages, pipelined: more than the
    kernel's buffers take) and reads nothing: after AGENTIK_WRITE_TIMEOUT without a byte taken
    its connection is cut, and with it what the server held for it; one log line."""
    import socket

    proc, base = serve(fake_env(fake_openai_proc, AGENTIK_WRITE_TIMEOUT="1"))
    await script_fake(fake_openai_proc, *[{"text": "ok"}] * 3)
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{base}/agentik/conversations") as r:
            cid = (await r.json())["id"]
        url = f"{base}/agentik/conversations/{cid}/messages"
        for i in range(3):
            body = [{"type": "text", "body": f"{i}" + "z" * 900_000}]
            async with s.post(url, json=body) as r:
                assert r.status == 202
    host, port = base.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a client that takes little
    sock.connect((host, int(port)))
    request = f"GET /agentik/conversations/{cid}/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    sock.sendall(request.encode() * 4)
    for _ in range(100):  # not reading: the server's writes stall, then it gives up
        if "client read nothing for AGENTIK_WRITE_TIMEOUT" in proc.output:
            break
        await asyncio.sleep(0.1)
    assert proc.output.count("client read nothing for AGENTIK_WRITE_TIMEOUT") == 1
    got = 0
    sock.settimeout(5)
    try:
        while chunk := sock.recv(1 << 20):
            got += len(chunk)
    except (ConnectionResetError, TimeoutError):
        pass
    sock.close()
    assert got < 4 * 2_700_000  # cut off: not every page came
    async with aiohttp.ClientSession() as s, s.get(f"{base}/health") as r:
        assert r.status == 200
