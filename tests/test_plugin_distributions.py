"""Issue #28: the six kinds of plugin under ``examples/`` (an LLM backend wrapping another by
name, a JSON-file memory, hash embeddings, typed tools with a prompt section, a periodic job, a
webhook route), the echo example and a plugin written by ``agentik plugins new``, installed as
distributions the way their authors would (one pip install of all of them into a throwaway
venv), then listed, tested with their own tests, and served together by one ``agentik serve``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT, Process, free_port, wait_http
from tests.test_plugins import throwaway_venv

KINDS = {  # distribution -> module (its entry point)
    "agentik-llm-redact": "agentik_llm_redact",
    "agentik-memory-json": "agentik_memory_json",
    "agentik-embedding-hash": "agentik_embedding_hash",
    "agentik-tools-units": "agentik_tools_units",
    "agentik-heartbeat": "agentik_heartbeat",
    "agentik-webhook": "agentik_webhook",
    "agentik-llm-echo": "agentik_llm_echo",
}
TEMPLATE = ("agentik-greeter", "agentik_greeter")
PIP_INSTALL = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]


class Installed:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.venv, self.site = throwaway_venv(root)
        self.python = self.venv / "bin" / "python"
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith(("AGENTIK_", "OPENAI_"))
        }
        self.env.pop("VIRTUAL_ENV", None)

    def run(self, *args: str, **kw) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.python), *args],
            capture_output=True,
            text=True,
            env=kw.pop("env", self.env),
            timeout=kw.pop("timeout", 180),
            **kw,
        )


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    root = tmp_path_factory.mktemp("distributions")
    box = Installed(root)
    sources = root / "src"
    for dist in KINDS:  # copies: building writes build/ and *.egg-info beside the sources
        shutil.copytree(ROOT / "examples" / dist, sources / dist)
    made = box.run("-m", "agentik", "plugins", "new", "greeter", "--dir", str(sources))
    assert made.returncode == 0, made.stderr
    folders = [sources / d for d in [*KINDS, TEMPLATE[0]]]
    # this environment's pip and setuptools (offline); one install of all of them
    pip = subprocess.run(
        [*PIP_INSTALL, "--target", box.site, *map(str, folders)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return box


def test_each_kind_is_installed_and_loaded(installed):
    listing = installed.run("-m", "agentik", "plugins", "--json")
    assert listing.returncode == 0, listing.stderr
    report = {p["name"]: p for p in json.loads(listing.stdout)["plugins"]}
    for dist, module in [*KINDS.items(), TEMPLATE]:
        assert report[module]["status"] == "ok", report[module]
        assert report[module]["dist"] == dist
    backends = {b["name"] for p in report.values() for b in p["backends"]}
    assert {"redact", "json", "hash", "echo"} <= backends
    assert json.loads(listing.stdout)["problems"] == []


def test_each_passes_its_own_tests(installed):
    """As their authors run them: agentik's pytest plugin gives the fixtures."""
    ini = installed.root / "pytest.ini"
    ini.write_text("[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n")
    dirs = [str(installed.root / "src" / d / "tests") for d in [*KINDS, TEMPLATE[0]]]
    result = installed.run(
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-c",
        str(ini),
        "--rootdir",
        str(installed.root),
        *dirs,
        cwd=installed.root,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "19 passed" in result.stdout, result.stdout


def get(url: str, headers: dict[str, str] | None = None) -> dict:
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=5) as r:
        return json.loads(r.read())


def test_all_of_them_in_one_server(installed, tmp_path):
    port = free_port()
    secret = "s3cret-s3cret-s3cret"
    beats = tmp_path / "beats.jsonl"
    env = {
        **installed.env,
        "AGENTIK_LOAD_PLUGINS": ",".join(
            ["agentik_transport_http", "agentik_memory", *KINDS.values(), TEMPLATE[1]]
        ),
        "AGENTIK_PORT": str(port),
        "AGENTIK_DB_PATH": str(tmp_path / "agentik.db"),
        "AGENTIK_LLM_BACKEND": "redact",
        "REDACT_INNER": "echo",
        "AGENTIK_MEMORY_BACKEND": "json",
        "JSON_MEMORY_PATH": str(tmp_path / "memory.json"),
        "AGENTIK_MEMORY_REVIEW": "0",
        "HEARTBEAT_FILE": str(beats),
        "HEARTBEAT_INTERVAL": "0.2",
        "HEARTBEAT_INTERVL": "1",  # a typo under the plugin's prefix
        "WEBHOOK_SECRET": secret,
    }
    proc = Process([str(installed.python), "-m", "agentik", "serve"], env, tmp_path / "serve.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/health", proc)
        output = proc.wait_output("  tokens:")
        assert "  llm: redact -> echo (prefix '')" in output
        assert "  POST /webhook/{name}" in output and "heartbeat: every 0.2 s" in output
        for name in ("convert_length", "greet", "shout", "memory_save"):
            assert name in output
        assert (
            "HEARTBEAT_INTERVL is set but no loaded plugin declares it (did you mean "
            "HEARTBEAT_INTERVAL?) (HEARTBEAT_* belongs to plugin agentik_heartbeat)"
        ) in output
        body = json.dumps({"text": "mail ada@example.com"}).encode()
        request = urllib.request.Request(
            f"{base}/webhook/ci",
            body,
            {"Content-Type": "application/json", "X-Webhook-Secret": secret},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=5) as r:
            conversation = json.loads(r.read())["conversationId"]
        deadline = time.monotonic() + 15
        while True:
            items = get(f"{base}/agentik/conversations/{conversation}/messages")["items"]
            replies = [m["text"] for m in items if m["type"] == "assistant"]
            if replies or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        # the echo backend, wrapped by redact, reverses what it was given
        assert replies and "]detcader[" in replies[0] and "moc.elpmaxe" not in replies[0]
        while not beats.exists() and time.monotonic() < deadline:  # the first beat after 0.2 s
            time.sleep(0.1)
        assert json.loads(beats.read_text().splitlines()[0])["conversations"] >= 0
    finally:
        proc.stop()
    assert "Traceback" not in proc.log_path.read_text()
