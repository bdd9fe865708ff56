"""End to end: the real ``agentik serve`` process, over real HTTP, against the fake OpenAI
server in its own process. Includes the crash test (SIGKILL mid-turn, restart)."""

from __future__ import annotations

import asyncio
import signal
import socket
import sqlite3
import subprocess
import sys
import time

import aiohttp
import pytest

from tests.conftest import BIN, read_sse, script_fake

TEXT = [{"type": "text", "body": "hello agent"}]


def openai_env(base_url: str, **extra: str) -> dict[str, str]:
    return {
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_MODEL": "fake-model",
        "OPENAI_MAX_RETRIES": "0",
        **extra,
    }


async def post_message(session, base: str, cid: str, body=TEXT) -> dict:
    async with session.post(f"{base}/agentik/conversations/{cid}/messages", json=body) as r:
        assert r.status == 202, await r.text()
        return await r.json()


async def history(session, base: str, cid: str) -> list[dict]:
    async with session.get(f"{base}/agentik/conversations/{cid}/messages?limit=200") as r:
        return (await r.json())["items"]


async def new_conversation(session, base: str) -> str:
    async with session.post(f"{base}/agentik/conversations") as r:
        assert r.status == 201
        return (await r.json())["id"]


async def test_a_streamed_conversation_end_to_end(serve, fake_openai_proc):
    proc, base = serve(openai_env(fake_openai_proc))
    await script_fake(fake_openai_proc, {"text": "Hi there, how can I help?", "usage": [42, 7]})
    async with aiohttp.ClientSession() as s:
        cid = await new_conversation(s, base)
        events = await s.get(f"{base}/agentik/conversations/{cid}/events")
        await post_message(s, base, cid)
        frames = await read_sse(events)
        events.close()
        assert frames[0]["event"] == "UserMessage" and frames[-1]["event"] == "End"
        assert frames[1]["event"] == "StartResponse"
        text = "".join(f["data"]["text"] for f in frames if f["event"] == "AppendText")
        assert text == "Hi there, how can I help?"
        items = await history(s, base, cid)
        assert [m["type"] for m in items] == ["user", "assistant"]
        assert items[1]["tokens"] == {"input": 42, "output": 7}
        # the second turn reuses the conversation: the fake sees the whole history
        await post_message(s, base, cid, [{"type": "text", "body": "again"}])
        for _ in range(200):
            if len(await history(s, base, cid)) == 4:
                break
            await asyncio.sleep(0.02)
        async with s.get(fake_openai_proc.removesuffix("/v1") + "/_fake/requests") as r:
            sent = await r.json()
        roles = [m["role"] for m in sent[-1]["messages"]]
        assert roles == ["system", "user", "assistant", "user"]
        assert sent[-1]["stream"] is True
    assert "storage:" in proc.output and "llm: openai fake-model" in proc.output
    assert proc.stop() == 0


async def test_tool_call_end_to_end_is_linked_in_history(serve, fake_openai_proc, tmp_path):
    """An in-agent tool from a real installed plugin is not available here, so the model calls
    a tool that does not exist: the loop must still record the linked pair and go on."""
    _, base = serve(openai_env(fake_openai_proc))
    await script_fake(fake_openai_proc, {"tool_calls": [["lookup", {"q": "x"}]]}, {"text": "done"})
    async with aiohttp.ClientSession() as s:
        cid = await new_conversation(s, base)
        events = await s.get(f"{base}/agentik/conversations/{cid}/events")
        await post_message(s, base, cid)
        frames = (await read_sse(events))[1:]  # after the UserMessage
        kinds = [f["event"] for f in frames]
        assert kinds[0] == "ToolCall" and kinds[1] == "ToolResult" and kinds[-1] == "End"
        assert frames[1]["data"]["callId"] == frames[0]["data"]["callId"]
        items = await history(s, base, cid)
        assert [m["type"] for m in items] == ["user", "tool_call", "tool_result", "assistant"]
        assert items[2]["toolCallId"] == items[1]["id"]
        async with s.get(fake_openai_proc.removesuffix("/v1") + "/_fake/requests") as r:
            last = (await r.json())[-1]["messages"]
        assert last[-1]["role"] == "tool"
        assert last[-1]["tool_call_id"] == frames[0]["data"]["callId"]


async def test_upstream_errors_follow_the_error_path(serve, fake_openai_proc):
    _, base = serve(openai_env(fake_openai_proc))
    await script_fake(fake_openai_proc, {"status": 503, "text": "overloaded"})
    async with aiohttp.ClientSession() as s:
        cid = await new_conversation(s, base)
        events = await s.get(f"{base}/agentik/conversations/{cid}/events")
        await post_message(s, base, cid)
        frames = (await read_sse(events))[1:]  # after the UserMessage
        assert [f["event"] for f in frames] == ["Error", "End"]
        assert frames[0]["data"]["code"] == "http_503"
        assert "overloaded" in frames[0]["data"]["message"]
        items = await history(s, base, cid)
        assert [m["type"] for m in items] == ["user", "error"]
        await post_message(s, base, cid)  # the next send works
        frames = await read_sse(events)
        assert frames[-2]["event"] == "AppendText"
        events.close()


async def idle(session, base: str, cid: str) -> None:
    for _ in range(500):
        async with session.get(f"{base}/agentik/conversations/{cid}") as r:
            if not (await r.json())["busy"]:
                return
        await asyncio.sleep(0.02)
    raise AssertionError("the conversation stayed busy")


@pytest.mark.parametrize("resume", ["1", "0"])
@pytest.mark.sqlite_file
async def test_crash_mid_turn_then_restart_loses_nothing(serve, fake_openai_proc, tmp_path, resume):
    """Turn 1 completes while 2 and 3 wait behind it; SIGKILL during turn 2. After the restart
    turn 2 runs again (it had recorded nothing), or with AGENTIK_RESUME_TURNS=0 it is closed
    with a restart error; turn 3, which never started, runs."""
    env = openai_env(fake_openai_proc, AGENTIK_RESUME_TURNS=resume)
    proc, base = serve(env)
    await script_fake(
        fake_openai_proc,
        {"text": "first answer " * 10, "delay": 0.02},
        {"text": "word " * 400, "delay": 0.02},
    )
    acked = []
    async with aiohttp.ClientSession() as s:
        cid = await new_conversation(s, base)
        events = await s.get(f"{base}/agentik/conversations/{cid}/events")
        for body in ("one", "two", "three"):
            msg = await post_message(s, base, cid, [{"type": "text", "body": body}])
            acked.append(msg["id"])
        await read_sse(events)  # turn 1 ended
        for _ in range(6):  # turn 2 is streaming
            await events.content.readline()
        proc.stop(signal.SIGKILL)
        events.close()
    # every acknowledged message is in the file, readable by plain sqlite3
    with sqlite3.connect(tmp_path / "agentik.db") as raw:
        stored = [r[0] for r in raw.execute("SELECT id FROM message WHERE kind = 'user'")]
    assert stored == acked
    proc2, base = serve(env)
    async with aiohttp.ClientSession() as s:
        await idle(s, base, cid)
        items = await history(s, base, cid)
        kinds = [m["type"] for m in items]
        if resume == "1":
            assert kinds == ["user", "user", "user", "assistant", "assistant", "assistant"]
            assert items[4]["text"] == "echo: two"
        else:
            assert kinds == ["user", "user", "user", "assistant", "error", "assistant"]
            assert items[4]["userMessageId"] == acked[1] and items[4]["code"] == "restart"
        assert items[5]["text"] == "echo: three"
        events = await s.get(f"{base}/agentik/conversations/{cid}/events")
        await post_message(s, base, cid, [{"type": "text", "body": "after the crash"}])
        frames = await read_sse(events)
        events.close()
        assert "".join(f["data"].get("text", "") for f in frames) == "echo: after the crash"
        async with s.get(fake_openai_proc.removesuffix("/v1") + "/_fake/requests") as r:
            sent = (await r.json())[-1]["messages"]
    # the model's context was rebuilt from working memory: a turn cut off by the restart is in
    # it only when it ran again
    again = [("user", "two"), ("assistant", "echo: two")] if resume == "1" else []
    assert [(m["role"], m["content"]) for m in sent[1:]] == [
        ("user", "one"),
        ("assistant", "first answer " * 10),
        *again,
        ("user", "three"),
        ("assistant", "echo: three"),
        ("user", "after the crash"),
    ]
    assert proc2.stop() == 0


CLOCK_BACK = """\
import time
_ns, _s = time.time_ns, time.time
time.time_ns = lambda: _ns() - 3600 * 10**9
time.time = lambda: _s() - 3600
"""


async def test_event_ids_grow_across_a_crash_and_a_clock_set_back(
    serve, fake_openai_proc, tmp_path
):
    """Ids come from a counter kept in the database, not the clock: after kill -9 and a restart
    an hour back in time, new ids are above the old ones; a client resuming with an old id gets
    a Gap (its stream's tail is gone), and one with an id above any issued gets a Gap too,
    never silence."""
    env = openai_env(fake_openai_proc)
    proc, base = serve(env)
    async with aiohttp.ClientSession() as s:
        cid = await new_conversation(s, base)
        events = await s.get(f"{base}/agentik/conversations/{cid}/events")
        await post_message(s, base, cid)
        old = [int(f["id"]) for f in await read_sse(events)]
        events.close()
    proc.stop(signal.SIGKILL)
    (tmp_path / "clock").mkdir()
    (tmp_path / "clock" / "sitecustomize.py").write_text(CLOCK_BACK)
    _, base = serve({**env, "PYTHONPATH": str(tmp_path / "clock")})
    async with aiohttp.ClientSession() as s:
        resumed = await s.get(
            f"{base}/agentik/conversations/{cid}/events", headers={"Last-Event-ID": str(old[-2])}
        )
        await post_message(s, base, cid)
        frames = await read_sse(resumed)
        resumed.close()
        assert frames[0]["event"] == "Gap" and frames[0]["data"]["after"] == old[-2]
        new = [int(f["id"]) for f in frames[1:]]
        assert [f["event"] for f in frames][-1] == "End" and min(new) > max(old)
        too_high = max(new) + 10**12
        for header in (str(too_high), str(2**63 - 1)):
            ahead = await s.get(
                f"{base}/agentik/conversations/{cid}/events", headers={"Last-Event-ID": header}
            )
            (gap,) = await read_sse(ahead, until="Gap", timeout=5)
            ahead.close()
            assert gap["data"]["after"] == int(header) and int(gap["id"]) <= max(new)
        agent_events = await s.get(
            f"{base}/agentik/events", headers={"Last-Event-ID": str(too_high)}
        )
        (gap,) = await read_sse(agent_events, until="Gap", timeout=5)
        agent_events.close()
        assert gap["data"]["after"] == too_high


@pytest.mark.sqlite_file
async def test_a_second_server_on_the_same_database_stops_naming_the_first(
    serve, fake_openai_proc, tmp_path
):
    """Two servers on one SQLite file would each close the other's running turns as cut off
    by a restart and run its queued messages twice: the second stops at once, in one line."""
    env = openai_env(fake_openai_proc)
    first, base = serve(env)
    second, _ = serve(env, wait=False)
    assert second.proc.wait(30) == 2
    lines = [line for line in second.output.splitlines() if "AGENTIK_DB_PATH" in line]
    assert len(lines) == 1, second.output
    assert f"in use by another process (pid {first.proc.pid})" in lines[0]
    assert str(tmp_path / "agentik.db") in lines[0]
    async with aiohttp.ClientSession() as s:  # the first goes on as if nothing happened
        cid = await new_conversation(s, base)
        events = await s.get(f"{base}/agentik/conversations/{cid}/events")
        await post_message(s, base, cid)
        assert (await read_sse(events))[-1]["event"] == "End"
        events.close()
    assert first.stop() == 0
    third, _ = serve(env)  # and once it stopped, the file is free again
    assert third.stop() == 0


@pytest.mark.sqlite_file
async def test_sigterm_mid_stream_exits_quickly_and_cleanly(serve, fake_openai_proc, tmp_path):
    proc, base = serve(openai_env(fake_openai_proc))
    await script_fake(fake_openai_proc, {"text": "slow " * 500, "delay": 0.05})
    async with aiohttp.ClientSession() as s:
        cid = await new_conversation(s, base)
        events = await s.get(f"{base}/agentik/conversations/{cid}/events")
        await post_message(s, base, cid)
        await events.content.readline()
        t0 = time.monotonic()
        assert proc.stop(signal.SIGTERM) == 0
        assert time.monotonic() - t0 < 10  # AGENTIK_SHUTDOWN_TIMEOUT is 5 s
        await asyncio.wait_for(events.content.read(), 5)  # the stream ended
        events.close()
    with sqlite3.connect(tmp_path / "agentik.db") as raw:
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        kinds = [r[0] for r in raw.execute("SELECT kind FROM message ORDER BY seq")]
    assert kinds == ["user", "assistant"]  # the cut turn was closed as interrupted
    assert (
        not (tmp_path / "agentik.db-wal").exists()
        or (tmp_path / "agentik.db-wal").stat().st_size == 0
    )


def test_openai_chosen_without_its_variables_tells_what_to_set(serve):
    proc, _ = serve({"AGENTIK_LLM_BACKEND": "openai"}, wait=False)
    assert proc.proc.wait(15) == 2
    out = proc.output
    assert "OPENAI_API_KEY, OPENAI_MODEL must be set" in out
    assert "OPENAI_BASE_URL=http://localhost:11434/v1" in out
    assert "Traceback" not in out


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"AGENTIK_PORT": "eighty"}, "AGENTIK_PORT='eighty' is invalid"),
        ({"AGENTIK_LOG_LEVEL": "loud"}, "AGENTIK_LOG_LEVEL='loud' is invalid"),
        ({"AGENTIK_LLM_BACKEND": "nope"}, "AGENTIK_LLM_BACKEND='nope': unknown llm backend"),
        ({"OPENAI_BASE_URL": "localhost:1234"}, "OPENAI_BASE_URL='localhost:1234' is invalid"),
    ],
)
def test_invalid_settings_stop_start_up_with_one_line(serve, env, message):
    proc, _ = serve(
        {
            "OPENAI_API_KEY": "k",
            "OPENAI_MODEL": "m",
            "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
            **env,
        },
        wait=False,
    )
    assert proc.proc.wait(15) == 2
    lines = [line for line in proc.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], proc.output


def test_a_port_in_use_says_to_set_agentik_port(serve, fake_openai_proc):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc, _ = serve(openai_env(fake_openai_proc, AGENTIK_PORT=str(port)), wait=False)
        assert proc.proc.wait(15) == 2
    lines = [line for line in proc.output.splitlines() if line.strip()]
    assert lines[-1] == (
        f"agentik: error: cannot listen on 127.0.0.1:{port}: the port is in use (another "
        f"server?); set AGENTIK_PORT (or --port) to a free one, e.g. AGENTIK_PORT={port + 1}"
    )
    assert "Traceback" not in proc.output


def test_blank_settings_mean_defaults(serve, fake_openai_proc):
    proc, _ = serve(openai_env(fake_openai_proc, AGENTIK_LOG_LEVEL="  ", AGENTIK_SYSTEM_PROMPT=""))
    assert "agentik listening on" in proc.wait_output("  tokens: 0 convs")
    assert proc.stop() == 0


def test_plugins_command_lists_plugins_settings_and_selection():
    out = subprocess.run(
        [str(BIN / "agentik"), "plugins"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    ).stdout
    # nothing configured: the on-device backend, and why (tests/test_models.py: the rest)
    assert "agentik_llm_openai" in out and "llm backend: openai — available" in out
    assert "llm backend: litert (aliases: google) — selected" in out
    assert "OPENAI_API_KEY" in out and "AGENTIK_PORT=8080" in out
    assert "agentik_transport_http" in out


def test_help_lists_every_command_and_imports_nothing_heavy_otherwise():
    out = subprocess.run(
        [str(BIN / "agentik"), "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "serve" in out and "plugins" in out and "chat" in out and "export" in out
    assert "models" in out and "download and list on-device" in out  # a plugin's command
    # the plugins load for the help only: the module itself (what `serve` starts from) and
    # a core command's own help import nothing of them
    code = (
        "import sys, contextlib; from agentik.core import cli; "
        "assert 'aiohttp' not in sys.modules and 'openai' not in sys.modules\n"
        "with contextlib.suppress(SystemExit): cli.main(['serve', '--help'])\n"
        "assert not [m for m in sys.modules if m.startswith(('agentik_', 'aiohttp'))]"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


async def slow_upload(base: str, cid: str) -> asyncio.StreamWriter:
    """A send whose body trickles in (a slow uplink): its handler waits for it."""
    host, port = base.removeprefix("http://").split(":")
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        f"POST /agentik/conversations/{cid}/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n[".encode()
    )
    await writer.drain()
    return writer


@pytest.mark.sqlite_file
async def test_a_stop_keeps_its_budget_and_leaves_queued_messages_for_the_next_start(
    serve, fake_openai_proc, tmp_path
):
    """SIGTERM while a turn streams, a message waits behind it, an upload trickles in and a
    client takes a big history page without reading it: the process exits 0 within
    AGENTIK_SHUTDOWN_TIMEOUT (the upload and the reader are cut at its deadline), the running
    turn is recorded as interrupted, and the queued message is answered after the next start,
    not closed with a restart error."""
    import socket

    env = openai_env(fake_openai_proc, AGENTIK_SHUTDOWN_TIMEOUT="3")
    proc, base = serve(env)
    async with aiohttp.ClientSession() as s:
        big = await new_conversation(s, base)
        for i in range(3):  # history for a big page (the model's answers do not matter)
            await post_message(s, base, big, [{"type": "text", "body": f"{i}" + "z" * 900_000}])
        await idle(s, base, big)
        await script_fake(fake_openai_proc, {"text": "slow " * 500, "delay": 0.05})
        cid = await new_conversation(s, base)
        events = await s.get(f"{base}/agentik/conversations/{cid}/events")
        running = await post_message(s, base, cid, [{"type": "text", "body": "long"}])
        queued = await post_message(s, base, cid, [{"type": "text", "body": "later"}])
        await events.content.readline()  # the turn streams
        upload = await slow_upload(base, cid)
        reader = socket.socket()
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        host, port = base.removeprefix("http://").split(":")
        reader.connect((host, int(port)))
        page = f"GET /agentik/conversations/{big}/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        reader.sendall(page.encode() * 4)  # more than the kernel's buffers take
        await asyncio.sleep(0.5)
        t0 = time.monotonic()
        code = await asyncio.to_thread(proc.stop, signal.SIGTERM)
        took = time.monotonic() - t0
        events.close()
        upload.close()
        reader.close()
    assert code == 0, proc.output
    assert took < 3, f"the stop took {took:.1f} s"
    with sqlite3.connect(tmp_path / "agentik.db") as raw:
        rows = raw.execute(
            "SELECT kind, payload_json FROM message WHERE conversation_id = ? ORDER BY seq",
            (cid,),
        ).fetchall()
    assert [k for k, _ in rows] == ["user", "user", "assistant"]
    assert '"interrupted": true' in rows[2][1]
    proc2, base = serve(env)
    async with aiohttp.ClientSession() as s:
        await idle(s, base, cid)
        items = await history(s, base, cid)
    assert [m["type"] for m in items] == ["user", "user", "assistant", "assistant"]
    assert items[1]["id"] == queued["id"] and items[0]["id"] == running["id"]
    assert items[3]["text"] == "echo: later"
    assert proc2.stop() == 0


@pytest.mark.parametrize("delay", [0.05, 0.3, 1.0, 1.5])
async def test_a_second_signal_exits_130_whenever_it_comes(serve, fake_openai_proc, delay):
    """The first SIGTERM starts the stop (kept busy by an upload that trickles in, cut at the
    deadline 2 s later); a second one, whenever it comes, exits at once with 130, never
    killed by the signal's default action (-15). (Two sent at the same instant are one signal
    to the kernel.)"""
    proc, base = serve(openai_env(fake_openai_proc, AGENTIK_SHUTDOWN_TIMEOUT="4"))
    async with aiohttp.ClientSession() as s:
        cid = await new_conversation(s, base)
    upload = await slow_upload(base, cid)
    await asyncio.sleep(0.2)
    proc.proc.send_signal(signal.SIGTERM)
    await asyncio.sleep(delay)
    proc.proc.send_signal(signal.SIGTERM)
    code = await asyncio.to_thread(proc.proc.wait, 10)
    upload.close()
    assert code == 130, proc.output


async def test_a_second_signal_after_the_event_loop_closed_still_exits_130(serve, fake_openai_proc):
    """Between the end of the event loop and the end of the process (here made slow by an
    exit hook) asyncio's own signal handlers are gone: a second SIGTERM there was killed by
    the default action (-15). It exits 130."""
    script = (
        "import atexit, sys, time\n"
        "from agentik.core.cli import main\n"
        "atexit.register(time.sleep, 3)\n"
        "sys.exit(main(['serve']))\n"
    )
    proc, _ = serve(openai_env(fake_openai_proc), command=[sys.executable, "-c", script])
    proc.proc.send_signal(signal.SIGTERM)
    await asyncio.to_thread(proc.wait_output, "stopped")
    await asyncio.sleep(0.3)
    proc.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(proc.proc.wait, 10) == 130, proc.output


async def test_other_signals_are_not_counted_as_a_second_stop(serve, fake_openai_proc):
    """A plugin (or a profiler) may handle signals of its own: those never count as the
    second SIGTERM that forces an exit."""
    script = (
        "import signal, sys\n"
        "signal.signal(signal.SIGUSR1, lambda *a: None)\n"
        "from agentik.core.cli import main\n"
        "sys.exit(main(['serve']))\n"
    )
    proc, base = serve(openai_env(fake_openai_proc), command=[sys.executable, "-c", script])
    for _ in range(3):
        proc.proc.send_signal(signal.SIGUSR1)
        await asyncio.sleep(0.1)
    async with aiohttp.ClientSession() as s, s.get(f"{base}/health") as r:
        assert r.status == 200
    assert await asyncio.to_thread(proc.stop, signal.SIGTERM) == 0, proc.output
