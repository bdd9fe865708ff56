"""B21: the Python client's cost per streamed event (agentik.client, typed events, resumable
stream) vs reading the same SSE of the same ``agentik serve`` with raw aiohttp.

The reader's own CPU (this process; the server is another) per event is a slope, so a turn's
fixed cost (the POST, the connection) drops out: (CPU of a T-token turn - CPU of a 1-token
turn) / (T - 1); each token is one ``AppendText`` event. Floors: the obvious raw reader
(``async for line in resp.content``, ``json.loads`` of each ``data:`` line) and a raw reader
that splits whole chunks as the client does (no typed events, no resume bookkeeping).

The chat: ``agentik chat`` as a process fed one message through a pipe, its own CPU (``wait4``)
per streamed token, as a slope between a 20,000-token and a 1-token turn (start-up drops
out). With ``--chat-baseline REV`` the chat of that git revision (its ``agentik`` package from
``git archive``, run with this checkout's dependencies and server) is measured in the same run,
alternating, for the ratio.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import common
from common import row, spec_text, stats

from agentik.client import RemoteAgent
from agentik.core.types import AppendText, End, TextPart

TOKENS = 1000  # one turn fits the server's replay buffer (1024): a slow reader gets no Gap
CHAT_TOKENS = 20_000  # the chat's slope needs more: its process start-up is the noise
BUFFER = "65536"  # the server's replay buffer: a whole chat turn fits, so no Gap either


async def raw_lines(s: aiohttp.ClientSession, base: str, cid: str, tokens: int) -> int:
    """A user's raw aiohttp SSE reader: line by line, the JSON of every data line."""
    async with s.get(f"{base}/conversations/{cid}/events") as resp:
        await post(s, base, cid, tokens)
        count = 0
        async for raw in resp.content:
            if raw.startswith(b"data: "):
                data = json.loads(raw[6:])
                if data["type"] == "AppendText":
                    count += 1
                elif data["type"] == "End":
                    return count
    raise AssertionError("the stream ended before End")


async def raw_chunks(s: aiohttp.ClientSession, base: str, cid: str, tokens: int) -> int:
    """Whole chunks split into frames (the client's parsing, without typed events)."""
    async with s.get(f"{base}/conversations/{cid}/events") as resp:
        await post(s, base, cid, tokens)
        count = 0
        buffer = b""
        while chunk := await resp.content.readany():
            buffer += chunk
            *frames, buffer = buffer.split(b"\n\n")
            for frame in frames:
                for line in frame.split(b"\n"):
                    if line.startswith(b"data: "):
                        data = json.loads(line[6:])
                        if data["type"] == "AppendText":
                            count += 1
                        elif data["type"] == "End":
                            return count
    raise AssertionError("the stream ended before End")


async def client(agent: RemoteAgent, cid: str, tokens: int) -> int:
    conv = await agent.get_conversation(cid)
    assert conv is not None
    events = conv.events()
    try:
        await conv.send([TextPart(spec_text(tokens))])
        count = 0
        async for event in events:
            if isinstance(event, AppendText):
                count += 1
            elif isinstance(event, End):
                return count
    finally:
        await events.aclose()
    raise AssertionError("the stream ended before End")


async def post(s: aiohttp.ClientSession, base: str, cid: str, tokens: int) -> None:
    body = [{"type": "text", "body": spec_text(tokens)}]
    async with s.post(f"{base}/conversations/{cid}/messages", json=body) as r:
        assert r.status == 202, await r.text()


def baseline_tree(rev: str) -> Path:
    """The ``agentik`` package of git revision ``rev``, unpacked in a temporary folder."""
    where = common.tmpdir() / f"chat-{rev}"
    if not where.exists():
        where.mkdir()
        archive = where / "src.tar"
        subprocess.run(
            ["git", "-C", str(common.ROOT), "archive", "-o", str(archive), rev, "agentik"],
            check=True,
        )
        with tarfile.open(archive) as tar:
            tar.extractall(where, filter="data")
    return where


def chat_cpu_us(base: str, tokens: int, tree: Path | None) -> float:
    """One ``agentik chat --new`` process (``tree``: the package from that folder) sending one
    message through a pipe and reading its reply: its own CPU, in µs."""
    env = common.clean_env(AGENTIK_API_KEY="")
    if tree is not None:
        env["PYTHONPATH"] = str(tree)  # before this checkout's editable install
    code = "from agentik.core.cli import main; raise SystemExit(main())"
    proc = subprocess.Popen(
        [common.PY, "-c", code, "chat", "--url", base, "--new"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=tree or common.ROOT,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(spec_text(tokens).encode())
    proc.stdin.close()
    out = proc.stdout.read().decode(errors="replace")
    err = proc.stderr.read().decode(errors="replace")
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0 and "agent> " in out and "missed" not in out, (out[-500:], err)
    assert len(out) > 3 * tokens, len(out)  # the whole reply was shown
    return (usage.ru_utime + usage.ru_stime) * 1e6


async def cpu_us(read: Any, tokens: int) -> float:
    t0 = time.process_time_ns()
    got = await asyncio.wait_for(read(tokens), 120)
    assert got == tokens, (got, tokens)
    return (time.process_time_ns() - t0) / 1e3


async def main(args: Any) -> dict[str, Any]:
    reps = common.repeats(args, 7, 2)
    fake = common.start_fake()
    server = common.start_agentik(fake.port, AGENTIK_EVENT_BUFFER=BUFFER)
    base = f"http://{common.HOST}:{server.port}/agentik"
    slopes: dict[str, list[float]] = {"client": [], "raw_lines": [], "raw_chunks": []}
    chats: dict[str, Path | None] = {"chat": None}
    rev = getattr(args, "chat_baseline", None)
    if rev:
        chats[f"chat@{rev}"] = await asyncio.to_thread(baseline_tree, rev)
    chat_slopes: dict[str, list[float]] = {name: [] for name in chats}
    try:
        async with common.session() as s, RemoteAgent(f"http://{common.HOST}:{server.port}") as a:
            cid = (await a.create_conversation(temp=True)).id
            readers = {
                "client": lambda n: client(a, cid, n),
                "raw_lines": lambda n: raw_lines(s, base, cid, n),
                "raw_chunks": lambda n: raw_chunks(s, base, cid, n),
            }
            for read in readers.values():  # warm-up
                await cpu_us(read, 50)
            for _ in range(reps):
                for name, read in readers.items():
                    big = await cpu_us(read, TOKENS)
                    small = await cpu_us(read, 1)
                    slopes[name].append((big - small) / (TOKENS - 1))
        url = f"http://{common.HOST}:{server.port}"
        for tree in chats.values():  # warm-up (imports compiled, caches filled)
            await asyncio.to_thread(chat_cpu_us, url, 50, tree)
        for _ in range(reps):
            for name, tree in chats.items():
                big = await asyncio.to_thread(chat_cpu_us, url, CHAT_TOKENS, tree)
                small = await asyncio.to_thread(chat_cpu_us, url, 1, tree)
                chat_slopes[name].append((big - small) / (CHAT_TOKENS - 1))
    finally:
        common.stop_all(server, fake)
    c, lines, chunks = (stats(slopes[k]) for k in ("client", "raw_lines", "raw_chunks"))
    rows = [
        row(
            f"reader CPU per event, {TOKENS}-token turn: client vs raw aiohttp lines",
            c,
            lines,
            unit="µs",
            target="≤ 1.5x",
            met=c["median"] / lines["median"] <= 1.5,
        ),
        row(
            "the same, floor: raw aiohttp reading whole chunks (no typed events)",
            c,
            chunks,
            unit="µs",
            target="(for reference)",
            met=None,
        ),
    ]
    chat = stats(chat_slopes["chat"])
    raw: dict[str, Any] = {"client": c, "raw_lines": lines, "raw_chunks": chunks, "chat": chat}
    if rev:
        before = raw["chat_baseline"] = stats(chat_slopes[f"chat@{rev}"])
        rows.append(
            row(
                f"agentik chat CPU per streamed token, {CHAT_TOKENS}-token turn: this chat vs "
                f"the chat of {rev}",
                chat,
                before,
                unit="µs",
                target="≤ 1.2x",
                met=chat["median"] / before["median"] <= 1.2,
            )
        )
    else:
        rows.append(
            row(
                f"agentik chat CPU per streamed token, {CHAT_TOKENS}-token turn "
                "(--chat-baseline REV compares)",
                chat,
                None,
                unit="µs",
                target="(for reference)",
                met=None,
            )
        )
    return {
        "id": "B21",
        "title": "the Python client's and the chat's per-event overhead",
        "rows": rows,
        "notes": [
            f"{reps} alternating repeats; slope between {TOKENS}- and 1-token turns "
            f"({CHAT_TOKENS}- and 1-token for the chat)"
        ],
        "raw": raw,
    }


def add_args(parser: Any) -> None:
    parser.add_argument(
        "--chat-baseline", metavar="REV", help="also measure the chat of this git revision"
    )


if __name__ == "__main__":
    common.cli(main, add_args)
