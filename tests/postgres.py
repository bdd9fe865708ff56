"""A throwaway PostgreSQL server for the tests: ``initdb`` and ``pg_ctl`` under a temporary
folder, on a free loopback port, as an unprivileged user (PostgreSQL refuses to run as root:
as root the server runs as ``nobody``). Debian's ``postgresql`` package has the binaries
(``make install-test`` installs it when missing); without them the PostgreSQL tests are skipped.

One server per test session (start-up takes about a second); each test gets its own schema
(:meth:`PostgresServer.fresh_url`): creating one costs a few milliseconds where a database
costs a checkpoint. ``AGENTIK_TEST_DATABASE=postgres`` runs the suite's agents on it
(``tests/conftest.py``).
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

MISSING = (
    "PostgreSQL is not installed (no initdb/pg_ctl): `make install-test` installs Debian's "
    "postgresql package"
)
SERVER_OPTIONS = "-c listen_addresses=127.0.0.1 -c max_connections=400 -c shared_buffers=32MB"
# what the tests need of a server: speed, not durability (the data is thrown away); a benchmark
# keeps PostgreSQL's defaults (a commit is on disk), as SQLite's durable send is
FAST = "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"


def bindir() -> Path | None:
    """The folder of initdb and pg_ctl: pg_config's, else Debian's newest, else the PATH's."""
    found = shutil.which("pg_config")
    if found:
        out = subprocess.run([found, "--bindir"], capture_output=True, text=True, check=False)
        candidate = Path(out.stdout.strip())
        if (candidate / "initdb").exists():
            return candidate
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2] or 0)
    )
    if versions:
        return Path(versions[-1])
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    def __init__(self, bin_dir: Path, *, durable: bool = False) -> None:
        self.bin = bin_dir
        self.durable = durable
        self.root = Path(tempfile.mkdtemp(prefix="agentik-pg-"))
        self.data = self.root / "data"
        self.port = 0
        self._schemas = itertools.count(1)
        # root may not run a server: the folder goes to nobody, and so do the commands
        self._as: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.root, "nobody", "nogroup")
            self._as = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as, *args], check=True, capture_output=True, cwd=self.root)

    def start(self) -> None:
        self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
            "--no-sync", "-E", "UTF8", "--locale=C",
        )  # fmt: skip
        self.port = _free_port()
        options = f"-p {self.port} -k {self.root} {SERVER_OPTIONS}"
        options += "" if self.durable else f" {FAST}"
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"),
            "-w", "-t", "60", "-o", options, "start",
        )  # fmt: skip

    def restart(self) -> None:
        """Stop (fast: connections are cut) and start again, with the same options."""
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"),
            "-m", "fast", "-w", "restart",
        )  # fmt: skip

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError, FileNotFoundError):
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def pid(self) -> int:
        """The postmaster's pid (its children are the server's other processes)."""
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def psql(self, sql: str, *options: str) -> str:
        out = subprocess.run(
            [str(self.bin / "psql"), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-d", self.url(),
             *options, "-c", sql],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        return out.stdout

    def fresh_url(self) -> str:
        """The URL of a new, empty schema: asyncpg passes the URL's other query parameters to
        the server as settings, so ``search_path`` puts every table in it."""
        schema = f"t{os.getpid()}_{next(self._schemas)}"
        self.psql(f"CREATE SCHEMA {schema}")
        return f"{self.url()}?search_path={schema}"


def start_server(*, durable: bool = False) -> PostgresServer | str:
    """A started server, or why there is none (the reason a test is skipped with)."""
    found = bindir()
    if found is None or not (found / "pg_ctl").exists():
        return MISSING
    server = PostgresServer(found, durable=durable)
    try:
        server.start()
    except subprocess.CalledProcessError as e:
        log = server.root / "log"
        detail = log.read_text()[-2000:] if log.exists() else e.stderr.decode(errors="replace")
        server.stop()
        raise RuntimeError(f"the test PostgreSQL server did not start: {detail}") from e
    return server
