from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agentik.core.agent import ChatAgent
from agentik.core.db import Database
from agentik.core.llm import LLMBackend
from agentik.core.store import SqliteStore
from agentik.core.testing import EchoLLM
from agentik.core.tools import Tool, ToolRegistry
from tests.postgres import PostgresServer, start_server

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

# the tests never reach the real model hub: a process that would fetch the default on-device
# model fails at once instead (the tests of fetching point HF_ENDPOINT at tests/fake_hub.py)
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.pop("HF_TOKEN", None)


@pytest.fixture(autouse=True)
def _no_database_left_in_the_checkout() -> Iterator[None]:
    """Tests keep their databases under tmp_path: one made in the checkout (the default
    AGENTIK_DB_PATH of an agent started there) would be what the next `make serve` opens."""
    stray = [ROOT / name for name in ("agentik.db", "agentik.db-wal", "agentik.db.lock")]
    before = [path.exists() for path in stray]
    yield
    made = [path.name for path, was in zip(stray, before, strict=True) if path.exists() and not was]
    for name in made:
        (ROOT / name).unlink()
    if made:
        pytest.fail(f"the test left {', '.join(made)} in the checkout", pytrace=False)


# AGENTIK_TEST_DATABASE=postgres (`make test-postgres`): every agent the tests start keeps its
# conversations on the throwaway PostgreSQL server (tests/postgres.py) instead of SQLite
ON_POSTGRES = os.environ.get("AGENTIK_TEST_DATABASE", "").lower() in ("postgres", "postgresql")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One throwaway PostgreSQL server for the session; the test is skipped without one."""
    server = start_server()
    if isinstance(server, str):
        pytest.skip(server)
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """The URL of a new, empty schema on the test server."""
    return postgres_server.fresh_url()


class TestDatabases:
    """On PostgreSQL, what each SQLite path of one test becomes: a schema of its own per path
    (a restart on the same file finds its data), a new one for each ``:memory:``."""

    __test__ = False  # not a test class (test modules import it)
    current: TestDatabases | None = None  # the running test's (AGENTIK_TEST_DATABASE=postgres)

    def __init__(self, server: PostgresServer) -> None:
        self.server = server
        self.urls: dict[str, str] = {}

    def url(self, path: str) -> str:
        if path == ":memory:":
            return self.server.fresh_url()
        if path not in self.urls:
            self.urls[path] = self.server.fresh_url()
        return self.urls[path]


def scalar(path: Any, sql: str) -> Any:
    """One value read straight from a test's database, past the agent: its SQLite file, or on
    PostgreSQL (AGENTIK_TEST_DATABASE=postgres) the schema that path stands for."""
    if TestDatabases.current is None:
        with sqlite3.connect(path) as raw:
            return raw.execute(sql).fetchone()[0]
    url = TestDatabases.current.url(str(path))
    schema = url.rsplit("search_path=", 1)[1]
    out = TestDatabases.current.server.psql(f"SET search_path TO {schema}; {sql}")
    return int(out.strip()) if out.strip().lstrip("-").isdigit() else out.strip()


def rows(path: Any, sql: str) -> list[tuple[str, ...]]:
    """The rows of a query read straight from a test's database, as :func:`scalar`; every
    value as text (SQLite's are cast), so both databases give the same rows."""
    if TestDatabases.current is None:
        with sqlite3.connect(path) as raw:
            return [tuple(str(v) for v in row) for row in raw.execute(sql).fetchall()]
    url = TestDatabases.current.url(str(path))
    schema = url.rsplit("search_path=", 1)[1]
    out = TestDatabases.current.server.psql(
        f"SET search_path TO {schema}; {sql}", "-F", "\x1f", "-R", "\x1e"
    )
    return [tuple(r.split("\x1f")) for r in out.rstrip("\n").split("\x1e") if r]


@pytest.fixture(autouse=ON_POSTGRES)
def test_databases(request, monkeypatch) -> TestDatabases | None:
    if not ON_POSTGRES:
        return None
    if request.node.get_closest_marker("sqlite_file"):
        pytest.skip("needs SQLite itself (its file or its faults)")
    from agentik.core import app
    from agentik.core.store.postgres import PgDatabase, PostgresStore

    databases = TestDatabases(request.getfixturevalue("postgres_server"))
    monkeypatch.setattr(TestDatabases, "current", databases)
    make_store = app.make_store

    def on_postgres(settings: Any) -> Any:
        if settings["AGENTIK_DATABASE_URL"]:
            return make_store(settings)
        return PostgresStore(PgDatabase(databases.url(settings["AGENTIK_DB_PATH"])))

    monkeypatch.setattr(app, "make_store", on_postgres)
    return databases


@pytest.fixture
async def make_agent(
    tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Callable[..., Any]]:
    """Build an opened ChatAgent on a real SQLite file (on PostgreSQL with
    AGENTIK_TEST_DATABASE=postgres); closed after the test."""
    agents: list[ChatAgent] = []
    databases = request.getfixturevalue("test_databases") if ON_POSTGRES else None

    def store(db: str) -> Any:
        if databases is None:
            return SqliteStore(Database(db))
        from agentik.core.store.postgres import PgDatabase, PostgresStore

        return PostgresStore(PgDatabase(databases.url(db)))

    async def factory(
        llm: LLMBackend | None = None,
        tools: list[Tool] = (),  # type: ignore[assignment]
        db: str | None = None,
        **kwargs: Any,
    ) -> ChatAgent:
        agent = ChatAgent(
            store=store(db or str(tmp_path / "agent.db")),
            llm=llm or EchoLLM(),
            tools=ToolRegistry(tools),
            **kwargs,
        )
        await agent.open()
        agents.append(agent)
        return agent

    yield factory
    for agent in agents:
        await agent.close()


async def collect_turn(conv: Any, after: int | None = None, timeout: float = 10) -> list[Any]:
    """Events of one turn, up to and including its End."""
    out = []

    async def run() -> None:
        async for event in conv.events(after):
            out.append(event)
            if event.type == "End":
                return

    await asyncio.wait_for(run(), timeout)
    return out


async def wait_until(check: Callable[[], Any], timeout: float = 5) -> None:
    """Poll ``check()`` until it is true (every 10 ms, at most ``timeout`` seconds)."""
    for _ in range(int(timeout / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out waiting")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Process:
    """A child process (agentik serve, the fake OpenAI server) with its output kept."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path, cwd: Path = ROOT) -> None:
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            args,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
        )

    @property
    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_output(self, text: str, timeout: float = 15) -> str:
        """Wait until ``text`` was printed (the banner comes just after /health answers)."""
        deadline = time.monotonic() + timeout
        while text not in self.output:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"{text!r} never printed:\n{self.output}")
            time.sleep(0.02)
        return self.output

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._log.close()


def wait_http(url: str, proc: Process, timeout: float = 30) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            raise AssertionError(f"process exited with {proc.proc.returncode}:\n{proc.output}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"{url} not up after {timeout}s:\n{proc.output}")


@pytest.fixture
def fake_openai_proc(tmp_path: Path) -> Iterator[str]:
    """The fake OpenAI-compatible server as its own process; yields its base URL."""
    port = free_port()
    proc = Process(
        [sys.executable, str(ROOT / "tests" / "fake_openai.py"), "--port", str(port)],
        dict(os.environ),
        tmp_path / "fake_openai.log",
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/v1/models", proc)
        yield f"{base}/v1"
    finally:
        proc.stop()


@pytest.fixture
def serve(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., tuple[Process, str]]]:
    """Start ``agentik serve`` with the given environment; yields (process, base URL)."""
    procs: list[Process] = []
    databases = request.getfixturevalue("test_databases") if ON_POSTGRES else None

    def start(
        env: dict[str, str],
        *,
        wait: bool = True,
        cwd: Path = ROOT,
        nofile: str | None = None,
        command: list[str] | None = None,
    ) -> tuple[Process, str]:
        """``cwd``: where it runs; ``nofile``: the process's descriptor limits, ``soft:hard``
        (``prlimit``); ``command``: what runs instead of ``agentik serve`` (which it must end
        up running)."""
        given = env.get("AGENTIK_PORT", "")  # a restart may keep its port
        port = int(given) if given.isdigit() else free_port()
        full = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTIK_", "OPENAI_"))}
        full.update(
            {
                "AGENTIK_PORT": str(port),
                "AGENTIK_HOST": "127.0.0.1",
                "AGENTIK_DB_PATH": str(tmp_path / "agentik.db"),
                "AGENTIK_MEMORY_BACKEND": "off",  # tests of memory turn it on
                # a title call after the first reply would take the fake's next scripted
                # reply; tests of titles turn it on
                "AGENTIK_AUTO_TITLE": "0",
                "AGENTIK_BACKGROUND_IDLE": "0",  # background model calls at once
                "AGENTIK_MODELS_DIR": str(tmp_path / "models"),  # never the user's cache
                **env,
            }
        )
        if databases is not None and "AGENTIK_DATABASE_URL" not in env:
            full["AGENTIK_DATABASE_URL"] = databases.url(full["AGENTIK_DB_PATH"])
        limit = ["prlimit", f"--nofile={nofile}"] if nofile else []
        command = command or [str(BIN / "agentik"), "serve"]
        log = tmp_path / f"serve-{len(procs)}.log"
        proc = Process([*limit, *command], full, log, cwd)
        procs.append(proc)
        base = f"http://127.0.0.1:{port}"
        if wait:
            wait_http(f"{base}/health", proc)
        return proc, base

    yield start
    for proc in procs:
        proc.stop(signal.SIGKILL)


async def script_fake(base_url: str, *replies: dict[str, Any]) -> None:
    root = base_url.removesuffix("/v1")
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{root}/_fake/script", json=list(replies)) as r,
    ):
        assert r.status == 200, await r.text()


async def read_sse(
    resp: aiohttp.ClientResponse, until: str = "End", timeout: float = 15
) -> list[dict[str, Any]]:
    """Read SSE frames as {"id", "event", "data"} until an event of type ``until``."""
    frames: list[dict[str, Any]] = []

    async def run() -> None:
        frame: dict[str, Any] = {}
        async for raw in resp.content:
            line = raw.decode().rstrip("\n")
            if not line:
                if "data" in frame:
                    frames.append(frame)
                    if frame["event"] == until:
                        return
                frame = {}
            elif line.startswith(":"):
                continue
            else:
                key, _, value = line.partition(": ")
                frame[key] = json.loads(value) if key == "data" else value

    await asyncio.wait_for(run(), timeout)
    return frames
