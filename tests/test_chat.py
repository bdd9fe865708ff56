"""``agentik chat`` in a pseudo-terminal (pexpect) and through a pipe against a real ``agentik
serve``: a streamed turn, a tool call, Ctrl-C (interrupt, then leave), /history, /new, /list,
/open, /rename, /export, the API key, multi-line input, two viewers of one conversation, and
what networks do: server restarts, a proxy that cuts or drops the connection."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import time
from datetime import UTC, datetime
from typing import Any

import pexpect
import pytest

from agentik.chat import Chat, Input, default_url
from agentik.core.types import (
    AppendText,
    End,
    Event,
    Gap,
    Message,
    StartResponse,
    TextPart,
    UserMessage,
    Via,
)
from tests.conftest import BIN, free_port, script_fake
from tests.proxy import ThreadedProxy
from tests.test_serve import openai_env

KEY = "chat-test-key-0123456789"


def spawn(*args: str, **env: str) -> pexpect.spawn:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AGENTIK_")}
    child = pexpect.spawn(
        str(BIN / "agentik"),
        ["chat", *args],
        env={**clean, **env},
        encoding="utf-8",
        timeout=15,
        dimensions=(40, 200),
    )
    return child


def test_a_chat_streams_interrupts_and_shows_history(serve, fake_openai_proc):
    _, base = serve(openai_env(fake_openai_proc))
    child = spawn("--url", base)
    try:
        child.expect(r"conversation conv-\w+")  # none yet: a new one, no question asked
        child.expect("you> ")
        child.sendline("hello")
        child.expect("agent> echo: hello\r\n")
        child.expect("you> ")

        asyncio.run(script_fake(fake_openai_proc, {"tool_calls": [["lookup", {"q": "x"}]]}))
        child.sendline("use a tool")
        child.expect(r'  tool lookup\(\{"q": ?"x"\}\)')
        child.expect("  ✗ ")  # the tool does not exist here: an error result, compactly
        child.expect("you> ")

        asyncio.run(script_fake(fake_openai_proc, {"text": "slow " * 400, "delay": 0.03}))
        child.sendline("talk a lot")
        child.expect("agent> slow slow")
        child.sendintr()  # Ctrl-C: the reply stops, the chat stays
        child.expect(r"\[interrupted\]")
        child.expect("you> ")

        child.sendline("/history")
        child.expect("you: hello")
        child.expect("agent: echo: hello")
        child.expect("you: use a tool")
        child.expect("  tool lookup")
        child.expect("you: talk a lot")
        child.expect(r"agent: slow.*\[interrupted\]")
        child.expect("you> ")

        child.sendline("/new second")
        child.expect(r"conversation conv-\w+ \(second\)")
        child.expect("you> ")
        child.sendline("/list")
        child.expect(r"1\. second")
        child.expect(r"2\. \(untitled\)")
        child.expect("you> ")

        child.sendintr()  # at the prompt: a hint, then a second Ctrl-C leaves
        child.expect("Ctrl-C again")
        child.sendintr()
        child.expect("bye")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


def test_a_chat_picks_a_conversation_and_takes_the_key(serve, fake_openai_proc):
    _, base = serve(openai_env(fake_openai_proc, AGENTIK_API_KEY=KEY))
    child = spawn("--url", base)
    child.expect("agentik: error: .* refused the API key .*--key or AGENTIK_API_KEY")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 2

    child = spawn("--url", base, "--key", KEY)
    child.expect("you> ")
    child.sendline("remember me")
    child.expect("agent> echo: remember me")
    child.sendline("/quit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0

    child = spawn("--url", base, AGENTIK_API_KEY=KEY)  # an existing one: asked which
    child.expect(r"1\. \(untitled\)")
    child.expect("Pick a number")
    child.sendline("1")
    child.expect("you> ")
    child.sendline("/history")
    child.expect("you: remember me")
    child.expect("you> ")
    child.sendeof()  # Ctrl-D leaves too
    child.expect("bye")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_a_chat_with_no_server_says_so_at_once_with_a_hint():
    import subprocess

    url = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    subprocess.run([str(BIN / "agentik"), "--version"], capture_output=True, check=True)
    start_up = time.monotonic() - t0  # this machine's start-up now (it may be loaded)
    t0 = time.monotonic()
    child = spawn("--url", url)
    child.expect(
        f"agentik: error: no agentik server at {url} — start one with 'make serve' or "
        "'agentik serve', or pass --url"
    )
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 2
    # at once: no retry window (it was 5 s) on top of the start-up (the chat's imports more)
    assert time.monotonic() - t0 < 2 * start_up + 2


def test_the_default_url_follows_the_servers_variables(serve, fake_openai_proc):
    port = free_port()
    serve(openai_env(fake_openai_proc, AGENTIK_PORT=str(port)))
    child = spawn("--new", AGENTIK_PORT=str(port))  # no --url: where `agentik serve` listens
    child.expect("you> ")
    child.sendline("found you")
    child.expect("agent> echo: found you")
    child.sendline("/quit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert default_url({}) == "http://127.0.0.1:8080"
    assert default_url({"AGENTIK_HOST": "0.0.0.0", "AGENTIK_PORT": "9001"}) == (
        "http://127.0.0.1:9001"
    )
    assert default_url({"AGENTIK_HOST": "::"}) == "http://[::1]:8080"
    assert default_url({"AGENTIK_HOST": "fe80::1"}) == "http://[fe80::1]:8080"
    assert default_url({"AGENTIK_HOST": "agent.lan"}) == "http://agent.lan:8080"
    child = spawn(AGENTIK_PORT="http")  # an invalid port is named, as serve names it
    child.expect("agentik: error: AGENTIK_PORT='http' ")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 2


def test_a_bad_url_or_key_is_one_line_and_status_2():
    import subprocess

    clean = {k: v for k, v in os.environ.items() if not k.startswith("AGENTIK_")}
    for args, env, said in [
        (["--url", "localhost:8080"], {}, "the URL must start with http:// or https://"),
        ([], {"AGENTIK_API_KEY": "short"}, "AGENTIK_API_KEY: the key is too short: a key must"),
    ]:
        done = subprocess.run(
            [str(BIN / "agentik"), "chat", *args],
            env={**clean, **env},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 2
        [line] = done.stderr.strip().splitlines()  # one line, no traceback
        assert line.startswith(f"agentik: error: {said}")


def test_a_chat_reads_a_pipe_to_its_end_without_spinning(serve, fake_openai_proc):
    """``echo … | agentik chat``: the whole input is one message (its lines included, the
    last one without its newline), a character split between two reads stays whole, and the
    end of the pipe ends the chat without spinning (a pipe at its end stays readable: watched,
    it woke the loop all turn long)."""
    import resource
    import subprocess

    _, base = serve(openai_env(fake_openai_proc))
    asyncio.run(script_fake(fake_openai_proc, {"text": "slow " * 100, "delay": 0.03}))
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AGENTIK_")}
    text = "é" * 3000  # 6,000 bytes: split across reads of 4,096
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [str(BIN / "agentik"), "chat", "--url", base, "--new"],
        input=f"hello\n{text}".encode(),
        capture_output=True,
        env=clean,
        timeout=60,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert "agent> slow slow" in out and "agent> echo" not in out  # one message, one turn
    assert "\ufffd" not in out
    history = asyncio.run(user_messages(base))
    assert history == [f"hello\n{text}"]
    # a 3 s turn: the chat's own CPU is its start-up, not 3 s of a busy loop
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert cpu < 2.5, cpu


async def user_messages(base: str, conversation: int = 0) -> list[str]:
    """The texts of the user messages of the most recent conversations's ``conversation``-th."""
    from agentik.client import RemoteAgent

    async with RemoteAgent(base) as agent:
        info = (await agent.list_conversations())[conversation]
        conv = await agent.get_conversation(info.id)
        assert conv is not None
        return [
            "\n".join(part["body"] for part in m.payload["content"])
            for m in await conv.get_messages(limit=200)
            if m.kind == "user"
        ]


# --- multi-line input ----------------------------------------------------------------------------


def test_input_assembles_pastes_continuations_and_blocks():
    typed = Input()
    assert typed.feed(b"one line\n") == ["one line"]
    # a bracketed paste: one message, sent by the Enter after it
    assert typed.feed(b"\x1b[200~first\nsecond\n\x1b[201~") == []
    assert typed.feed(b"\n") == ["first\nsecond"]
    assert typed.feed(b"\x1b[200~a\nb\x1b[201~ and more\n") == ["a\nb and more"]
    # Alt+Enter (ESC before the newline) and a trailing backslash go on
    assert typed.feed(b"up\x1b\nand\\\ndown\r\n") == ["up\nand\ndown"]
    assert typed.feed(b'"""\n/not a command\n\nstill\n"""\n') == ["/not a command\n\nstill"]
    # a pasted line that looks like a continuation or a block is text
    assert typed.feed(b'\x1b[200~ends with \\\n"""\x1b[201~\n') == ['ends with \\\n"""']
    assert typed.feed("é".encode()[:1]) == []  # a character split between reads
    assert typed.feed("é".encode()[1:] + b"\n") == ["é"]
    assert typed.feed(b"unfinished\\\n") == []
    assert typed.end() == ["unfinished"]  # Ctrl-D sends what was typed
    piped = Input(whole=True)
    assert piped.feed(b"a\nb\n") == [] and piped.feed(b"c") == []
    assert piped.end() == ["a\nb\nc"]


def test_a_paste_or_a_continued_line_is_one_message(serve, fake_openai_proc):
    _, base = serve(openai_env(fake_openai_proc))
    child = spawn("--url", base, "--new")
    try:
        child.expect("you> ")
        child.send("\x1b[200~line one\nline two\x1b[201~\r")
        child.expect("agent> echo: line one\r\nline two\r\n")
        child.expect("you> ")
        child.send("first\x1b\rsecond \\\rthird\r")  # Alt+Enter, a trailing backslash
        child.expect("agent> echo: first\r\nsecond \r\nthird\r\n")
        child.expect("you> ")
        child.sendline('"""')
        child.sendline("in a")
        child.sendline("block")
        child.sendline('"""')
        child.expect("agent> echo: in a\r\nblock\r\n")
        child.expect("you> ")
        child.sendline("/quit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert asyncio.run(user_messages(base)) == [
        "line one\nline two",
        "first\nsecond \nthird",
        "in a\nblock",
    ]


# --- conversations: /open, /rename, /export ---------------------------------------------------


def test_open_takes_a_number_an_id_prefix_or_a_title(serve, fake_openai_proc, tmp_path):
    _, base = serve(openai_env(fake_openai_proc))
    child = spawn("--url", base, "--new")
    try:
        child.expect(r"conversation (conv-\w+)")
        first = child.match.group(1)
        child.expect("you> ")
        child.sendline("/rename Shopping list")
        child.expect(r"\[renamed: Shopping list\]")
        child.sendline("/new Travel plans")
        child.expect(r"conversation (conv-\w+) \(Travel plans\)")
        child.expect("you> ")
        child.sendline("/open nonesuch")
        child.expect("no conversation 'nonesuch'")
        child.expect("you> ")
        child.sendline("/open 2")  # the second of /list: the least recently used
        child.expect(f"conversation {first} \\(Shopping list\\)")
        child.sendline("/open travel")  # a title's start, case ignored
        child.expect(r"conversation conv-\w+ \(Travel plans\)")
        child.sendline(f"/open {first[:12]}")  # the start of an id
        child.expect(f"conversation {first} ")
        child.sendline("/open conv-")  # both: said, not guessed
        child.expect("'conv-' could be 2 conversations")
        child.expect("you> ")
        child.sendline("hello")
        child.expect("agent> echo: hello")
        child.expect("you> ")
        out = tmp_path / "shopping.md"
        child.sendline(f"/export {out}")
        child.expect(r"\[exported to .*shopping\.md\]")
        child.sendline(f"/export {tmp_path / 'shopping.json'}")
        child.expect(r"\[exported to .*shopping\.json\]")
        child.sendline(f"/export {tmp_path / 'no' / 'such' / 'dir.md'}")
        child.expect(r"\[cannot write .*dir\.md: No such file or directory\]")
        child.sendline("/quit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    text = out.read_text()
    assert text.startswith("# Shopping list") and "hello" in text and "echo: hello" in text
    exported = json.loads((tmp_path / "shopping.json").read_text())
    assert exported["conversation"]["id"] == first
    assert [m["type"] for m in exported["messages"]] == ["user", "assistant"]


# --- two viewers ---------------------------------------------------------------------------------


def test_a_second_viewer_sees_the_questions_too(serve, fake_openai_proc):
    _, base = serve(openai_env(fake_openai_proc))
    first = spawn("--url", base, "--new")
    second = None
    try:
        first.expect(r"conversation (conv-\w+)")
        cid = first.match.group(1)
        first.expect("you> ")
        second = spawn("--url", base, "--conversation", cid)
        second.expect("you> ")
        first.sendline("what time is it")
        first.expect("agent> echo: what time is it")
        # the other viewer sees who asked, then the answer; its prompt comes back after it
        second.expect(r"\[chat-[0-9a-f]{6}\] what time is it")
        second.expect("agent> echo: what time is it\r\n")
        second.expect("you> ")
        second.sendline("and the date")
        second.expect("agent> echo: and the date")
        first.expect(r"\[chat-[0-9a-f]{6}\] and the date")
        first.expect("agent> echo: and the date")
        # the sender does not see its own message twice
        assert "] what time is it" not in first.before
        for child in (first, second):
            child.sendline("/quit")
            child.expect(pexpect.EOF)
    finally:
        first.close()
        if second is not None:
            second.close()


# --- what networks do ----------------------------------------------------------------------------


@pytest.mark.parametrize("resume", ["1", "0"])
def test_a_chat_outlives_a_server_crash_mid_reply(serve, fake_openai_proc, resume):
    """SIGKILL mid-reply, back after more than the old 5-second window: the chat keeps
    reconnecting and says for how long, shows how the cut turn ends once the server is back
    (it runs again; with AGENTIK_RESUME_TURNS=0 it is closed with a restart error, read from
    the history), and goes on; the restart alone is no "events were missed"."""
    env = openai_env(fake_openai_proc, AGENTIK_PORT=str(free_port()), AGENTIK_RESUME_TURNS=resume)
    cut = (
        r"echo: talk\r\n"
        if resume == "1"
        else r"\[error: the turn was cut off by a server restart \(restart\)\]"
    )
    proc, base = serve(env)
    child = spawn("--url", base, "--new")
    try:
        child.expect("you> ")
        asyncio.run(script_fake(fake_openai_proc, {"text": "long " * 400, "delay": 0.02}))
        child.sendline("talk")
        child.expect("agent> long long")
        proc.stop(signal.SIGKILL)
        child.expect(r"\[reconnecting… 0s\]")
        child.expect(r"\[reconnecting… [3-9]s\]", timeout=10)
        time.sleep(3)  # down for more than 5 s in all
        proc, _ = serve(env)
        child.expect(r"\[reconnected after (\d+)s\]", timeout=30)
        assert int(child.match.group(1)) >= 5
        child.expect(cut)
        child.expect("you> ")
        child.sendline("are you back")
        child.expect("agent> echo: are you back\r\n")
        child.expect("you> ")

        # a restart while nothing runs: reconnected, nothing said to be missed
        proc.stop(signal.SIGKILL)
        child.expect(r"\[reconnecting… 0s\]")
        proc, _ = serve(env)
        child.expect(r"\[reconnected after \d+s\]", timeout=20)
        child.sendline("still here")
        child.expect("agent> echo: still here\r\n")
        child.expect("you> ")
        assert "missed" not in child.before
        child.sendline("/history")
        child.expect("you: talk")
        child.expect(cut)
        child.expect("you: still here")
        child.expect("you> ")
        child.sendline("/quit")
        child.expect(pexpect.EOF)
    finally:
        child.close()


def test_ctrl_c_returns_to_the_prompt_while_the_server_is_away(serve, fake_openai_proc):
    env = openai_env(fake_openai_proc, AGENTIK_PORT=str(free_port()))
    proc, base = serve(env)
    child = spawn("--url", base, "--new")
    try:
        child.expect("you> ")
        asyncio.run(script_fake(fake_openai_proc, {"text": "long " * 400, "delay": 0.02}))
        child.sendline("talk")
        child.expect("agent> long long")
        proc.stop(signal.SIGKILL)
        child.expect(r"\[reconnecting… ")
        child.sendintr()  # the reply's server is gone: the prompt comes back all the same
        child.expect(r"\[could not interrupt: ")
        child.expect("you> ")
        child.sendline("hello?")  # sent once the server is back, or given up with Ctrl-C
        child.expect(r"\[reconnecting… [1-9]s\]")
        child.sendintr()
        child.expect(r"\[cancelled\]")
        child.expect("you> ")
        proc, _ = serve(env)
        child.expect(r"\[reconnected after \d+s\]", timeout=20)
        child.sendline("back")
        child.expect("agent> echo: back\r\n")
        child.sendline("/quit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


def test_a_reply_survives_a_cutting_proxy_and_an_outage(serve, fake_openai_proc):
    """Connections cut mid-reply, then the server out of reach for 6 s while it finishes the
    reply: the chat shows the whole reply once, from the stream's resume."""
    _, base = serve(openai_env(fake_openai_proc))
    proxy = ThreadedProxy(int(base.rsplit(":", 1)[1]))
    child = spawn("--url", proxy.url, "--new")
    child.logfile_read = seen = io.StringIO()
    words = [f"w{i}" for i in range(300)]
    try:
        child.expect("you> ")
        reply = " ".join(words)
        asyncio.run(script_fake(fake_openai_proc, {"text": reply, "delay": 0.03}))
        child.sendline("count")
        child.expect("agent> w0 w1")
        for _ in range(3):
            proxy.cut()
            time.sleep(0.3)
        proxy.down()
        child.expect(r"\[reconnecting… [3-9]s\]", timeout=10)
        time.sleep(2)
        proxy.up()
        child.expect(r"\[reconnected after (\d+)s\]", timeout=20)
        assert int(child.match.group(1)) >= 5
        child.expect("you> ", timeout=20)
        out = seen.getvalue()
        shown = re.sub(r"\[reconnect[^\]]*\]|agent> |\x1b\[K|\s+", " ", out).split()
        assert shown[shown.index("w0") : shown.index("you>", shown.index("w0"))] == words
        child.sendline("/quit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
        proxy.close()


def test_agentik_export_prints_a_conversation_of_a_server(serve, fake_openai_proc):
    """Through the client, as a remote server would be asked: a conversation named by the
    start of its id or its title, as Markdown or JSON; an unknown one is one line, status 2."""
    import subprocess

    from agentik.client import RemoteAgent
    from agentik.core.types import MessageContext, TextPart

    _, base = serve(openai_env(fake_openai_proc))

    async def make() -> str:
        async with RemoteAgent(base) as agent:
            conv = await agent.create_conversation(title="Weekly report")
            events = conv.events()
            await conv.send([TextPart("numbers please")], MessageContext("event", "cron"))
            async for event in events:
                if event.type == "End":
                    break
            await events.aclose()
            return conv.id

    cid = asyncio.run(make())
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AGENTIK_")}

    def export(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "agentik"), "export", *args, "--url", base],
            capture_output=True,
            text=True,
            env=clean,
            timeout=30,
        )

    md = export(cid[:10])
    assert md.returncode == 0, md.stderr
    assert md.stdout.startswith("# Weekly report\n")
    assert "numbers please" in md.stdout and "echo: [EVENT] cron\nnumbers please" in md.stdout
    assert '"origin": "event"' in md.stdout  # the context, with the message
    as_json = export("weekly", "--format", "json")
    document = json.loads(as_json.stdout)
    assert document["conversation"]["id"] == cid
    kinds = [m["type"] for m in document["messages"]]
    assert kinds == ["user", "assistant"] and document["stats"]["turns"] == 1
    assert document["messages"][1]["tokens"]["input"] is not None  # tokens are in it
    missing = export("nonesuch")
    assert missing.returncode == 2
    assert missing.stderr.strip() == "agentik: error: no conversation 'nonesuch'"


# --- a Gap, filled from the history (the chat's ledger, without a server) ----------------------


class FakeConversation:
    """The history side of a conversation: ``get_messages`` over a list of records."""

    def __init__(self) -> None:
        self.records: list[Message] = []

    def add(self, kind: str, mid: str, **payload: Any) -> None:
        self.records.append(Message(mid, "conv-1", kind, datetime.now(UTC), payload))

    async def get_messages(self, after: str | None, offset: int, limit: int) -> list[Message]:
        ids = [r.id for r in self.records]
        start = ids.index(after) + 1 if after is not None else 0
        return self.records[start + offset : start + offset + limit]

    async def approvals(self) -> list[Any]:
        return []  # after a Gap the chat asks what waits


class FakeStream:
    def __init__(self, events: list[Event]) -> None:
        self.events = iter(events)
        self.pending = 0

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> Event:
        try:
            return next(self.events)
        except StopIteration:
            raise StopAsyncIteration from None


def user_event(mid: str, text: str, sender: str) -> UserMessage:
    return UserMessage(
        mid, "conv-1", datetime.now(UTC), (TextPart(text),), None, Via("http", sender)
    )


def text_record(text: str) -> list[dict[str, str]]:
    return [{"type": "text", "body": text}]


async def test_a_gap_shows_what_was_lost_once_and_nothing_when_nothing_was():
    """A crash cut our turn ("W") mid-reply while another viewer's message ("Q") waited; after
    the restart Q ran. The history shows W's end and Q's reply; the replay of Q that follows
    is not shown again; what comes after the replay streams as usual."""
    out = io.StringIO()
    chat = Chat(None, out, me="chat-me")  # type: ignore[arg-type]  # no server: history only
    conv = FakeConversation()
    conv.add("user", "m0", content=text_record("earlier"))
    conv.add("assistant", "a0", text="long ago")
    chat.conv = conv  # type: ignore[assignment]
    list(chat.ledger.follow(list(conv.records)))  # what open() reads
    chat.waiting = "W"
    before = [
        user_event("W", "mine", "chat-me"),
        user_event("Q", "theirs", "chat-other"),
        StartResponse(),
        AppendText("Hel"),
    ]
    await chat.print_events(FakeStream(before))  # type: ignore[arg-type]
    conv.add("user", "W", content=text_record("mine"))
    conv.add("user", "Q", content=text_record("theirs"))
    restart = "the turn was cut off by a server restart"
    conv.add("error", "e1", message=restart, code="restart", userMessageId="W", partialText="Hel")
    conv.add("assistant", "a1", text="answer to theirs")
    after = [
        Gap(41),  # the restarted server lost the old stream: the history fills in
        StartResponse(),  # the replay of Q's turn, which ran after the restart
        AppendText("answer to theirs"),
        End("Q"),
        user_event("N", "new one", "chat-other"),  # after the replay: live again
        StartResponse(),
        AppendText("fresh"),
        End("N"),
        Gap(99),  # a restart while idle: nothing lost, nothing said
    ]
    await chat.print_events(FakeStream(after))  # type: ignore[arg-type]
    shown = out.getvalue()
    assert chat.turn_over.is_set()  # our turn is over: the prompt comes back
    assert shown.count("[chat-other] theirs") == 1 and "mine" not in shown
    assert f"[error: {restart} (restart)]" in shown
    assert shown.count("answer to theirs") == 1
    assert "[chat-other] new one" in shown and shown.count("fresh") == 1
    assert "missed" not in shown
    assert shown.index("Hel") < shown.index("[error") < shown.index("answer to theirs")


# --- approvals ---------------------------------------------------------------------------------


def test_a_chat_asks_about_approvals_approve_deny_and_edit(serve, fake_openai_proc, tmp_path):
    """A tool call that waits for a person: y runs it, n (with a note) gives the model the
    denial, e takes other arguments (not JSON, or not fitting the tool: said, asked again)."""
    from tests.test_approvals_e2e import env_for, runs

    _, base = serve(env_for(fake_openai_proc, tmp_path))
    asyncio.run(
        script_fake(
            fake_openai_proc,
            {"tool_calls": [["launch", {"target": "moon"}]]},
            {"text": "moon done"},
            {"tool_calls": [["launch", {"target": "sun"}]]},
            {"text": "sun spared"},
            {"tool_calls": [["launch", {"target": "venus"}]]},
            {"text": "mars done"},
        )
    )
    child = spawn("--url", base, "--new")
    try:
        child.expect("you> ")
        child.sendline("launch at the moon")
        child.expect(r'  tool launch\(\{"target": "moon"\}\)')
        child.expect(re.escape('Run launch {"target": "moon"}? [y/N/e(dit)] '))
        child.sendline("y")
        child.expect(r"\[approved\]")
        child.expect("  → launched at moon")
        child.expect("agent> moon done\r\n")
        child.expect("you> ")

        child.sendline("launch at the sun")
        child.expect(re.escape('Run launch {"target": "sun"}? [y/N/e(dit)] '))
        child.sendline("")  # Enter denies
        child.expect(re.escape("Note for the model (Enter: none): "))
        child.sendline("too hot")
        child.expect(r"\[denied\]")
        child.expect("  ✗ Error: a person denied this call: too hot")
        child.expect("agent> sun spared\r\n")
        child.expect("you> ")

        child.sendline("launch at venus")
        child.expect(re.escape('Run launch {"target": "venus"}? [y/N/e(dit)] '))
        child.sendline("maybe")
        child.expect(re.escape("[answer y, n or e]"))
        child.expect(re.escape("[y/N/e(dit)] "))
        child.sendline("e")
        child.expect(re.escape("Arguments as JSON (Enter: back): "))
        child.sendline("{target: mars}")
        child.expect(r"\[not JSON: ")
        child.expect(re.escape("Arguments as JSON (Enter: back): "))
        child.sendline('{"target": 5}')
        child.expect(r"\[args do not fit launch: .*\]")
        child.expect(re.escape("Arguments as JSON (Enter: back): "))
        child.sendline('{"target": "mars"}')
        child.expect(re.escape('[approved with {"target": "mars"}]'))
        child.expect("  → launched at mars")
        child.expect("agent> mars done\r\n")
        child.expect("you> ")

        child.sendline("/history")
        child.expect("  approval of launch: pending")
        child.expect("  approval of launch: approved")
        child.expect(r"  approval of launch: denied \(too hot\)")
        child.expect("you> ")
        child.sendline("/quit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert runs(tmp_path) == ["moon", "mars"]  # the sun never, venus edited to mars


def test_a_chat_asks_about_an_approval_that_waited_before_it_opened(
    serve, fake_openai_proc, tmp_path
):
    """An approval asked while no chat was open (here: a send through the client, then a
    restart of the server) is asked about when the chat opens the conversation."""
    from agentik.client import RemoteAgent
    from tests.test_approvals_e2e import env_for, runs

    env = env_for(fake_openai_proc, tmp_path)
    proc, base = serve(env)

    async def start_a_waiting_turn() -> str:
        await script_fake(
            fake_openai_proc,
            {"tool_calls": [["launch", {"target": "moon"}]]},
            {"text": "after the restart"},
        )
        async with RemoteAgent(base) as agent:
            conv = await agent.create_conversation(title="waits")
            await conv.send([TextPart("launch")])
            for _ in range(200):
                if await conv.approvals():
                    return conv.id
                await asyncio.sleep(0.05)
        raise AssertionError("no approval waits")

    cid = asyncio.run(start_a_waiting_turn())
    proc.stop(signal.SIGKILL)
    _, base = serve(env)
    child = spawn("--url", base, "--conversation", cid)
    try:
        child.expect(f"conversation {cid}")
        child.expect(re.escape('Run launch {"target": "moon"}? [y/N/e(dit)] '))
        child.sendline("yes")
        child.expect("  → launched at moon")
        child.expect("agent> after the restart\r\n")
        child.expect("you> ")
        child.sendline("/quit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert runs(tmp_path) == ["moon"]
