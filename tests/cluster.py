"""Many ``agentik serve`` instances on one PostgreSQL behind HAProxy (issue 26), for the tests of
many instances (``tests/test_cluster.py``) and the benchmark B30.

:class:`Cluster` starts N real ``agentik serve`` processes on free ports, all with the same
``AGENTIK_DATABASE_URL`` (a fresh schema of the test server, ``tests/postgres.py``) and the
same settings, and HAProxy in front (Debian's ``haproxy``; ``make install-test`` installs it
when missing) with the configuration users copy, ``docs/haproxy.cfg``: only its ``bind`` port and
its ``server`` lines are the harness' own, and in round-robin mode its two hashing lines
(:func:`haproxy_config`), so the tests run what the documentation says.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import BIN, ROOT, Process, free_port, wait_http

DOCS_CONFIG = ROOT / "docs" / "haproxy.cfg"
HASH, ROUND_ROBIN = "hash", "roundrobin"
MODES = (HASH, ROUND_ROBIN)
MISSING = "HAProxy is not installed: `make install-test` installs Debian's haproxy package"
#: seconds an instance's lease outlives its last heartbeat in the tests (the default is 10):
#: a killed owner's conversations are taken over this soon
LEASE_TTL = "2"


def haproxy_bin() -> str | None:
    return shutil.which("haproxy") or next(
        (p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if Path(p).exists()), None
    )


def haproxy_config(port: int, servers: list[int], mode: str = HASH) -> str:
    """``docs/haproxy.cfg`` with HAProxy listening on ``port`` and these instances' ports as
    its servers; in round-robin mode ``balance roundrobin`` instead of the hash."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {MODES}")
    lines = []
    for line in DOCS_CONFIG.read_text().splitlines():
        word = line.split()[0] if line.split() else ""
        if word == "server":
            continue
        if word == "bind":
            line = f"    bind 127.0.0.1:{port}"
        elif mode == ROUND_ROBIN and word == "balance":
            line = "    balance roundrobin"
        elif mode == ROUND_ROBIN and word == "hash-type":
            continue
        lines.append(line)
    lines += [f"    server agentik{n} 127.0.0.1:{p}" for n, p in enumerate(servers, 1)]
    return "\n".join(lines) + "\n"


@dataclass
class Instance:
    n: int  # 1-based, as HAProxy's server name agentik<n>
    port: int
    proc: Process

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc.proc.poll() is None


class Cluster:
    """``n`` instances on ``database_url`` and HAProxy in ``mode`` in front, under ``root``.
    ``env``: the settings every instance gets (the same plugins and settings on each)."""

    def __init__(self, root: Path, database_url: str, env: dict[str, str]) -> None:
        self.root = root
        self.database_url = database_url
        self.env = env
        self.instances: list[Instance] = []
        self.proxy: Process | None = None
        self.proxy_port = 0
        self.mode = HASH
        self._started = 0

    @property
    def url(self) -> str:
        """HAProxy's: where clients go."""
        return f"http://127.0.0.1:{self.proxy_port}"

    def start(self, n: int = 3, mode: str = HASH) -> Cluster:
        for _ in range(n):
            self.start_instance(wait=False)
        for instance in self.instances:
            wait_http(f"{instance.base}/health", instance.proc)
        self.start_proxy(mode)
        return self

    def instance_env(self, port: int) -> dict[str, str]:
        full = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTIK_", "OPENAI_"))}
        full.update(
            {
                "AGENTIK_PORT": str(port),
                "AGENTIK_HOST": "127.0.0.1",
                "AGENTIK_DATABASE_URL": self.database_url,
                # ignored by the store on PostgreSQL; the folder of each instance's own files
                # (the vector memory's index cache)
                "AGENTIK_DB_PATH": str(self.root / f"agentik-{port}.db"),
                "AGENTIK_MEMORY_BACKEND": "off",
                "AGENTIK_AUTO_TITLE": "0",
                "AGENTIK_BACKGROUND_IDLE": "0",
                "AGENTIK_MODELS_DIR": str(self.root / "models"),
                "AGENTIK_LEASE_TTL": LEASE_TTL,
                **self.env,
            }
        )
        return full

    def start_instance(self, *, wait: bool = True, port: int | None = None) -> Instance:
        """Start one more instance (or one again on ``port``, the one a dead one had)."""
        port = port or free_port()
        self._started += 1
        log = self.root / f"serve-{self._started}.log"
        proc = Process([str(BIN / "agentik"), "serve"], self.instance_env(port), log)
        old = next((i for i in self.instances if i.port == port), None)
        if old is not None:
            old.proc = proc
            instance = old
        else:
            instance = Instance(len(self.instances) + 1, port, proc)
            self.instances.append(instance)
        if wait:
            wait_http(f"{instance.base}/health", proc)
        return instance

    def start_proxy(self, mode: str = HASH) -> None:
        found = haproxy_bin()
        if found is None:
            raise RuntimeError(MISSING)
        self.stop_proxy()
        self.mode = mode
        self.proxy_port = free_port()
        config = self.root / f"haproxy-{mode}.cfg"
        config.write_text(haproxy_config(self.proxy_port, [i.port for i in self.instances], mode))
        self.proxy = Process([found, "-db", "-f", str(config)], dict(os.environ),
                             self.root / f"haproxy-{mode}.log")  # fmt: skip
        # HAProxy starts with every server up (its checks then take out a dead one)
        wait_http(f"{self.url}/health", self.proxy)

    def kill(self, instance: Instance, sig: int = signal.SIGKILL) -> int:
        return instance.proc.stop(sig)

    def stop_proxy(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
            self.proxy = None

    def close(self) -> None:
        self.stop_proxy()
        for instance in self.instances:
            instance.proc.stop(signal.SIGKILL)

    def logs(self) -> str:
        """Every instance's output, for a failing test's message."""
        return "\n".join(
            f"--- agentik{i.n} ---\n{i.proc.log_path.read_text(errors='replace')[-3000:]}"
            for i in self.instances
        )


if __name__ == "__main__":  # the harness' configuration of a mode: python -m tests.cluster hash
    print(haproxy_config(8080, [8001, 8002, 8003], sys.argv[1] if len(sys.argv) > 1 else HASH))
