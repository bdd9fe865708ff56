"""``agentik chat`` in a pseudo-terminal against a real ``agentik serve``: a streamed turn, a
tool call, Ctrl-C (interrupt, then leave), /history, /new, /list, and the API key."""

from __future__ import annotations

import asyncio
import os

import pexpect

from tests.conftest import BIN, script_fake
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


def test_a_chat_with_no_server_says_so():
    child = spawn("--url", "http://127.0.0.1:9")
    child.expect("agentik: error: cannot reach http://127.0.0.1:9")
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
    """``echo … | agentik chat``: the last line counts even without its newline, a character
    split between two reads stays whole, and the end of the pipe ends the chat without
    spinning (a pipe at its end stays readable: watched, it woke the loop all turn long)."""
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
    assert "agent> slow slow" in out and f"agent> echo: {text}" in out
    assert "\ufffd" not in out
    # a 3 s turn: the chat's own CPU is its start-up, not 3 s of a busy loop
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert cpu < 2.5, cpu
