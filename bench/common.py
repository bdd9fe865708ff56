"""Shared helpers of the benchmarks: statistics, CPU time and RSS of a process, starting the fake
LLM, ``agentik serve`` and the floors as processes on free loopback ports, and a cheap raw SSE
reader (so the load client costs little next to the servers it measures).

Every benchmark module has ``async def main(args) -> dict`` and is run by ``bench/run.py`` in
its own process; ``python bench/bNN_*.py`` runs one alone and prints its JSON.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import math
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
FLOORS = BENCH / "floors"
PY = sys.executable
BIN = Path(sys.executable).parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
HOST = "127.0.0.1"

sys.path.insert(0, str(FLOORS))
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT))

from fake_llm import reply_text, spec_text  # noqa: E402

__all__ = ["reply_text", "spec_text"]


def raise_fd_limit() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


raise_fd_limit()  # children inherit it


# --- statistics -----------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def stats(values: Iterable[float]) -> dict[str, float]:
    v = [float(x) for x in values]
    if not v:
        return {"n": 0}
    return {
        "n": len(v),
        "median": percentile(v, 50),
        "p95": percentile(v, 95),
        "p99": percentile(v, 99),
        "min": min(v),
        "max": max(v),
        "mean": sum(v) / len(v),
    }


def row(
    metric: str,
    agentik: dict[str, float] | float | None,
    floor: dict[str, float] | float | None = None,
    *,
    unit: str = "",
    target: str = "",
    met: bool | None = None,
    ratio: float | None = None,
    note: str = "",
) -> dict[str, Any]:
    """One line of a result table. ``agentik``/``floor`` are stats dicts (median is shown)."""

    def med(x: Any) -> float | None:
        if x is None:
            return None
        return float(x["median"]) if isinstance(x, dict) else float(x)

    a, f = med(agentik), med(floor)
    if ratio is None and a is not None and f:
        ratio = a / f
    return {
        "metric": metric,
        "unit": unit,
        "agentik": a,
        "floor": f,
        "ratio": ratio,
        "target": target,
        "met": met,
        "note": note,
        "agentik_stats": agentik if isinstance(agentik, dict) else None,
        "floor_stats": floor if isinstance(floor, dict) else None,
    }


# --- process accounting ---------------------------------------------------------------------


def cpu_ns(pid: int) -> int:
    """CPU time (user+system) of every live thread of ``pid`` in ns, from schedstat (exact);
    falls back to /proc/<pid>/stat (clock ticks, includes exited threads)."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with (
                contextlib.suppress(FileNotFoundError, ProcessLookupError),
                open(f"/proc/{pid}/task/{task}/schedstat") as f,
            ):
                total += int(f.read().split()[0])
        if total:
            return total
    except (FileNotFoundError, PermissionError):
        pass
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // CLK_TCK


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def thread_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


class CpuMeter:
    """``with CpuMeter(pid) as m: ...`` then ``m.ns``, ``m.wall`` (s) and ``m.util`` (cores)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.ns = 0
        self.wall = 0.0

    def __enter__(self) -> CpuMeter:
        self._c0, self._t0 = cpu_ns(self.pid), time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.ns = cpu_ns(self.pid) - self._c0
        self.wall = time.perf_counter() - self._t0

    @property
    def util(self) -> float:
        return self.ns / 1e9 / self.wall if self.wall else 0.0


# --- processes ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTIK_", "OPENAI_"))}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


_TMP = Path(tempfile.mkdtemp(prefix="agentik-bench-"))


def _cleanup() -> None:
    if os.environ.get("AGENTIK_BENCH_KEEP"):  # keep databases and server logs for a post-mortem
        print(f"bench files kept in {_TMP}", file=sys.stderr)
    else:
        shutil.rmtree(_TMP, ignore_errors=True)


atexit.register(_cleanup)


def tmpdir() -> Path:
    return _TMP


class Proc:
    """A child process with its output in a log file; stopped with SIGTERM, then SIGKILL."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None, name: str = "p"):
        self.name = name
        self.log_path = _TMP / f"{name}-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.t_exec = time.perf_counter()
        self.proc = subprocess.Popen(
            args,
            env=env if env is not None else clean_env(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
        )
        self.port = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 10) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def http_status(port: int, path: str = "/health", timeout: float = 1.0) -> int:
    """One blocking GET with a raw socket (cheap to poll with)."""
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode())
        head = s.recv(64)
    parts = head.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def wait_http(
    proc: Proc, port: int, path: str = "/health", timeout: float = 30.0, poll: float = 0.002
) -> float:
    """Poll until ``path`` answers 200; returns the perf_counter time it did."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited {proc.proc.returncode}:\n{proc.output()}")
        try:
            if http_status(port, path) == 200:
                return time.perf_counter()
        except OSError:
            pass
        time.sleep(poll)
    raise RuntimeError(f"{proc.name}: {path} not up after {timeout}s:\n{proc.output()}")


def start_fake() -> Proc:
    port_file = _TMP / f"fake-{time.monotonic_ns()}.port"
    p = Proc([PY, str(BENCH / "fake_llm.py"), "--port-file", str(port_file)], name="fake")
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if not p.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"fake did not start:\n{p.output()}")
        time.sleep(0.01)
    p.port = int(port_file.read_text())
    wait_http(p, p.port, "/v1/models")
    return p


def agentik_env(fake_port: int, port: int, db: str | None = None, **extra: str) -> dict[str, str]:
    """The environment of a benchmarked ``agentik serve``: agentik's defaults, the fake LLM as
    the openai backend's endpoint, no retries; ``extra`` adds settings (e.g.
    ``AGENTIK_SSE_COALESCE_MS="20"``)."""
    return clean_env(
        OPENAI_BASE_URL=f"http://{HOST}:{fake_port}/v1",
        OPENAI_API_KEY="sk-bench",
        OPENAI_MODEL="fake-model",
        OPENAI_MAX_RETRIES="0",
        AGENTIK_HOST=HOST,
        AGENTIK_PORT=str(port),
        AGENTIK_DB_PATH=db or str(_TMP / f"agentik-{port}.db"),
        AGENTIK_LOG_LEVEL="warning",
        # the floors do a bare turn: no memory prefetch and review, no reflection or title calls
        AGENTIK_MEMORY_BACKEND="off",
        AGENTIK_REFLECTION_INTERVAL="0",
        AGENTIK_AUTO_TITLE="0",
        **extra,
    )


def start_agentik(fake_port: int, db: str | None = None, wait: bool = True, **extra: str) -> Proc:
    port = free_port()
    p = Proc([str(BIN / "agentik"), "serve"], agentik_env(fake_port, port, db, **extra), "agentik")
    p.port = port
    if wait:
        wait_http(p, port)
    return p


def start_floor(script: str, *args: str, wait: bool = True) -> Proc:
    port = free_port()
    p = Proc([PY, str(FLOORS / script), "--port", str(port), *args], name=script.split(".")[0])
    p.port = port
    if wait:
        wait_http(p, port)
    return p


def stop_all(*procs: Proc | None) -> None:
    for p in procs:
        if p is not None:
            p.stop()


# --- a cheap SSE client ---------------------------------------------------------------------

TOKEN = b"event: AppendText"
END = b"event: End\n"
_TAIL = max(len(TOKEN), len(END)) - 1


class RawSSE:
    """An SSE GET over a bare asyncio connection. It does not parse frames: it counts the
    ``event: AppendText`` markers in the raw (chunked) bytes and stops at ``event: End``; aiohttp
    writes each frame as one chunk, so a marker is never cut by chunk framing."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int, path: str) -> RawSSE:
        reader, writer = await asyncio.open_connection(HOST, port, limit=1 << 20)
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\nAccept: text/event-stream\r\n\r\n".encode()
        )
        head = await reader.readuntil(b"\r\n\r\n")
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(f"SSE {path}: {head[:200]!r}")
        return cls(reader, writer)

    async def read_turn(self, times: list[float] | None = None) -> tuple[int, float, float]:
        """Read to the End frame: (tokens, first-token time, End time) in perf_counter seconds.
        With ``times``, appends the arrival time of every token (per socket read)."""
        tail = b""
        tokens = 0
        first = 0.0
        read = self.reader.read
        while True:
            data = await read(1 << 16)
            t = time.perf_counter()
            if not data:
                raise ConnectionError("SSE stream closed before End")
            buf = tail + data
            k = buf.count(TOKEN)
            if k:
                if not tokens:
                    first = t
                tokens += k
                if times is not None:
                    times.extend([t] * k)
            if END in buf:
                return tokens, first, t
            tail = buf[-_TAIL:]

    async def read_idle(self) -> bytes:
        return await self.reader.read(1 << 16)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


async def read_sse_frames(
    session: aiohttp.ClientSession,
    url: str,
    post: Callable[[], Awaitable[Any]],
    timeout: float = 30,
) -> list[dict[str, Any]]:
    """A full SSE parse (for the sanity checks): open ``url``, call ``post``, read to End."""
    frames: list[dict[str, Any]] = []
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
        assert resp.status == 200, resp.status
        await post()
        cur: dict[str, Any] = {}
        async for raw in resp.content:
            line = raw.decode().rstrip("\n")
            if not line:
                if cur:
                    frames.append(cur)
                    if cur.get("event") == "End":
                        return frames
                cur = {}
                continue
            key, _, value = line.partition(": ")
            if key == "data":
                cur["data"] = json.loads(value)
            elif key in ("id", "event"):
                cur[key] = value
    return frames


# --- the conversation API client (agentik and the raw-turn floor speak the same API) --------


class TurnClient:
    """POST /agentik/conversations, GET …/events (raw SSE), POST …/messages, read to End."""

    def __init__(self, port: int, session: aiohttp.ClientSession) -> None:
        self.port = port
        self.base = f"http://{HOST}:{port}/agentik"
        self.session = session

    async def new_conversation(self) -> str:
        async with self.session.post(f"{self.base}/conversations") as r:
            assert r.status == 201, (r.status, await r.text())
            return str((await r.json())["id"])

    async def open_events(self, cid: str) -> RawSSE:
        return await RawSSE.open(self.port, f"/agentik/conversations/{cid}/events")

    async def post(self, cid: str, text: str) -> None:
        body = [{"type": "text", "body": text}]
        async with self.session.post(f"{self.base}/conversations/{cid}/messages", json=body) as r:
            assert r.status == 202, (r.status, await r.text())
            await r.read()

    async def turn(
        self,
        text: str,
        cid: str | None = None,
        times: list[float] | None = None,
        timeout: float = 60,
    ) -> dict[str, float]:
        """One turn on a new (or the given) conversation: wall ms to the first token and End,
        both from just before the POST."""
        cid = cid or await self.new_conversation()
        sse = await self.open_events(cid)
        try:
            t0 = time.perf_counter()
            await self.post(cid, text)
            tokens, first, end = await asyncio.wait_for(sse.read_turn(times), timeout)
        finally:
            sse.close()
        return {"tokens": tokens, "ttft_ms": (first - t0) * 1e3, "wall_ms": (end - t0) * 1e3}


def session(limit: int = 0) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, force_close=False),
        timeout=aiohttp.ClientTimeout(total=120),
    )


async def gather_limited(n: int, limit: int, fn: Callable[[int], Awaitable[Any]]) -> list[Any]:
    sem = asyncio.Semaphore(limit)

    async def one(i: int) -> Any:
        async with sem:
            return await fn(i)

    return await asyncio.gather(*(one(i) for i in range(n)))


# --- the CLI of one benchmark module --------------------------------------------------------


def cli(
    main: Callable[[Any], Awaitable[dict[str, Any]]], add_args: Callable[[Any], None] | None = None
) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke test)")
    parser.add_argument("--json-out", type=Path, help="write the result here")
    if add_args:
        add_args(parser)
    args = parser.parse_args()
    result = asyncio.run(main(args))
    text = json.dumps(result, indent=1, default=str)
    if args.json_out:
        args.json_out.write_text(text)
    else:
        print(text)


def repeats(args: Any, full: int = 7, quick: int = 2) -> int:
    return quick if getattr(args, "quick", False) else full


def us(ns: float) -> float:
    return ns / 1e3


# --- the floors' schema must stay agentik's -------------------------------------------------


async def schema_drift() -> list[str]:
    """Statements that differ between agentik's SQLite schema and bench/floors/schema.py (an
    empty list: the floors write into exactly the same tables and indexes)."""
    import re
    import sqlite3

    from schema import connect

    from agentik.core.db import Database
    from agentik.core.store import SqliteStore

    stamp = time.monotonic_ns()
    store = SqliteStore(Database(str(_TMP / f"schema-{stamp}.db")))
    await store.open()
    await store.close()

    def norm(db: sqlite3.Connection) -> set[str]:
        rows = db.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL").fetchall()
        return {
            re.sub(r"\s+", " ", r[0].replace("IF NOT EXISTS ", "")).replace("( ", "(").strip()
            for r in rows
        }

    theirs = sqlite3.connect(str(_TMP / f"schema-{stamp}.db"))
    ours = connect(str(_TMP / f"schema-floor-{stamp}.db"))
    a, b = norm(theirs), norm(ours)
    theirs.close()
    ours.close()
    return sorted(f"agentik only: {x}" for x in a - b) + sorted(f"floor only: {x}" for x in b - a)
