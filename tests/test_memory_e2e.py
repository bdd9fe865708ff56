"""Long-term memory end to end: ``agentik serve`` with the fake OpenAI server and real files."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import aiohttp

from tests.conftest import BIN, script_fake
from tests.test_serve import history, new_conversation, openai_env, post_message

NAME = {"category": "user", "text": "The user's name is Alice."}


def memory_env(fake: str, folder: Path, **extra: str) -> dict[str, str]:
    memory = {"AGENTIK_MEMORY_BACKEND": "md", "AGENTIK_MEMORY_DIR": str(folder)}
    return openai_env(fake, **{**memory, "AGENTIK_MEMORY_REVIEW": "0", **extra})


async def say(s: aiohttp.ClientSession, base: str, cid: str, text: str) -> list[dict[str, Any]]:
    """Send a message and wait for its turn to end; the conversation's records."""
    before = len(await history(s, base, cid))
    await post_message(s, base, cid, [{"type": "text", "body": text}])
    for _ in range(500):
        items = await history(s, base, cid)
        if len(items) > before + 1 and items[-1]["type"] in ("assistant", "error"):
            return items
        await asyncio.sleep(0.02)
    raise AssertionError(f"the turn did not end: {items}")


async def turn_inputs(s: aiohttp.ClientSession, fake: str) -> list[str]:
    """The last user message of every streamed (turn) request the fake got."""
    async with s.get(fake.removesuffix("/v1") + "/_fake/requests") as r:
        sent = await r.json()
    return [
        [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
        for body in sent
        if body.get("stream")
    ]


def counted_uses(folder: Path) -> int:
    """The uses the md backend's index holds for the notes, not yet in their file."""
    with contextlib.closing(sqlite3.connect(folder / ".index.sqlite3")) as db:
        return int(db.execute("SELECT coalesce(sum(uses), 0) FROM usage").fetchone()[0])


async def wait_for(check: Any, timeout: float = 10) -> None:
    for _ in range(int(timeout / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("timed out waiting")


async def test_a_note_saved_by_the_model_is_remembered_across_conversations_and_restarts(
    serve, fake_openai_proc, tmp_path
):
    folder = tmp_path / "memory"
    proc, base = serve(memory_env(fake_openai_proc, folder))
    banner = proc.wait_output("memory: md (")
    assert f"memory: md ({folder}, 0 notes)" in banner and "memory_save" in banner
    assert "  curator: on (every 1d, archives notes unused for 90d)\n" in banner
    await script_fake(
        fake_openai_proc, {"tool_calls": [["memory_save", NAME]]}, {"text": "I will remember."}
    )
    async with aiohttp.ClientSession() as s:
        a = await new_conversation(s, base)
        items = await say(s, base, a, "Please remember that my name is Alice.")
        assert [i["type"] for i in items] == ["user", "tool_call", "tool_result", "assistant"]
        assert items[2]["text"].startswith("Saved as ")
        user_md = (folder / "user.md").read_text()
        assert "source=USER\n\nThe user's name is Alice.\n" in user_md

        b = await new_conversation(s, base)
        items = await say(s, base, b, "What is my name?")
        seen = (await turn_inputs(s, fake_openai_proc))[-1]
        assert seen.startswith("[Memory context") and "- (user) The user's name is Alice." in seen
        assert seen.endswith("\n\nWhat is my name?")
        assert items[0]["content"] == [{"type": "text", "body": "What is my name?"}]
        # the use is counted in the index, not by a rewrite of the file (issue 27)
        await wait_for(lambda: counted_uses(folder) == 1)
        assert "uses=0" in (folder / "user.md").read_text()

        # edited by hand while the server runs: the next prefetch shows the edit
        path = folder / "user.md"
        path.write_text(path.read_text().replace("Alice", "Alicia"))
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000))
        await say(s, base, await new_conversation(s, base), "Do you know my name?")
        seen = (await turn_inputs(s, fake_openai_proc))[-1]
        assert "The user's name is Alicia." in seen and "Alice." not in seen

    proc.stop()
    proc, base = serve(memory_env(fake_openai_proc, folder))
    assert f"memory: md ({folder}, 1 notes)" in proc.wait_output("memory: md (")
    async with aiohttp.ClientSession() as s:
        await say(s, base, await new_conversation(s, base), "Remind me of my name")
        assert "The user's name is Alicia." in (await turn_inputs(s, fake_openai_proc))[-1]


REVIEW = {
    "match": "long-term memory of an assistant",
    "text": 'Sure:\n```json\n{"facts": [{"category": "preference", '
    '"text": "The user drinks green tea without sugar."}]}\n```',
}


async def test_a_fact_found_by_the_review_is_in_the_next_conversation(
    serve, fake_openai_proc, tmp_path
):
    folder = tmp_path / "memory"
    # the default review waits for 4 turns or for the conversation to go idle: here idle
    env = memory_env(
        fake_openai_proc, folder, AGENTIK_MEMORY_REVIEW="1", AGENTIK_MEMORY_REVIEW_IDLE="0.5"
    )
    _, base = serve(env)
    await script_fake(fake_openai_proc, REVIEW, {"text": "Green tea it is."})
    async with aiohttp.ClientSession() as s:
        a = await new_conversation(s, base)
        await say(s, base, a, "I only drink green tea, no sugar please.")
        path = folder / "preference.md"
        await wait_for(lambda: path.exists() and "green tea" in path.read_text())
        assert "source=AUTO_REVIEW\n\nThe user drinks green tea without sugar.\n" in (
            path.read_text()
        )
        b = await new_conversation(s, base)
        await say(s, base, b, "Make me some tea, the way I like it")
        seen = (await turn_inputs(s, fake_openai_proc))[-1]
        assert "- (preference) The user drinks green tea without sugar." in seen


async def test_broken_memory_files_never_stop_the_server(serve, fake_openai_proc, tmp_path):
    folder = tmp_path / "memory"
    folder.mkdir()
    garbage = {
        "user.md": "just some notes\nwithout any header\n",
        "world.md": "§ id=ok created=nonsense\n\nbad time\n",
        "preference.md": b"\x89PNG\r\n\x1a\n\x00\x00\xff",
    }
    for name, content in garbage.items():
        (folder / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    proc, base = serve(memory_env(fake_openai_proc, folder))
    out = proc.wait_output("memory: md (")
    assert f"memory: md ({folder}, 0 notes, 3 bad parts)" in out
    assert "user.md line 1: text before the first note header" in out
    await script_fake(fake_openai_proc, {"tool_calls": [["memory_save", NAME]]}, {"text": "ok"})
    async with aiohttp.ClientSession() as s:
        await say(s, base, await new_conversation(s, base), "Remember my name is Alice.")
    assert (folder / "user.md").read_text().startswith(garbage["user.md"])
    assert "The user's name is Alice." in (folder / "user.md").read_text()
    assert (folder / "world.md").read_text() == garbage["world.md"]
    assert (folder / "preference.md").read_bytes() == garbage["preference.md"]


def test_agentik_plugins_shows_the_memory(tmp_path):
    folder = tmp_path / "memory"
    folder.mkdir()
    (folder / "user.md").write_text("§ id=a1\n\nThe user's name is Alice.\n\nstray\n§ x\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTIK_")}
    env.update(AGENTIK_MEMORY_DIR=str(folder), AGENTIK_MEMORY_PREFETCH="3")
    out = subprocess.run(
        [str(BIN / "agentik"), "plugins", "--json"], capture_output=True, text=True, env=env
    )
    report = {p["name"]: p for p in json.loads(out.stdout)["plugins"]}
    assert report["agentik_memory_md"]["backends"][0] | {"aliases": []} == {
        "kind": "memory",
        "name": "md",
        "aliases": [],
        "available": True,
        "selected": True,
    }
    assert report["agentik_memory_md"]["details"] == {
        "dir": str(folder),
        "notes": {"user.md": 1},
        "bad parts": ["user.md line 6: header field 'x' is not key=value"],
    }
    details = report["agentik_memory"]["details"]
    assert details["memory"] == "on, backend md" and details["prefetch"].startswith("up to 3")
