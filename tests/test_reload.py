"""``agentik serve --reload`` (issue #28): a plugin author's dev loop, as a real process."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.request
from pathlib import Path

from tests.conftest import ROOT, Process, free_port, wait_http

PLUGIN = """
from aiohttp import web

from agentik.api import EchoLLM, hookimpl


async def ping(request):
    return web.Response(text="{version}")


@hookimpl
def register_llm_backends(register):
    register("echo", lambda settings: EchoLLM())


@hookimpl
def register_transports(register):
    register("ping", lambda app, agent, settings: app.router.add_get("/ping", ping))
"""


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def post(url: str, body: object) -> dict:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=5) as r:
        return json.loads(r.read() or b"{}")


def wait_for(check, what: str, proc: Process, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen:\n{proc.output}")
        time.sleep(0.1)


def write(path: Path, text: str) -> None:
    path.write_text(text)
    later = time.time() + 1  # a change the mtime shows whatever the file system's resolution
    os.utime(path, (later, later))


def test_serve_reload_restarts_on_a_change_and_conversations_survive(tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    write(plugins / "pinger.py", PLUGIN.format(version="v1"))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTIK_", "OPENAI_"))}
    env.update(
        AGENTIK_PLUGINS_DIR=str(plugins),
        AGENTIK_LLM_BACKEND="echo",
        AGENTIK_MEMORY_BACKEND="off",
        AGENTIK_DB_PATH=str(tmp_path / "agentik.db"),
        AGENTIK_PORT=str(port),
        AGENTIK_LOAD_PLUGINS="agentik_transport_http",
    )
    base = f"http://127.0.0.1:{port}"
    proc = Process(
        [sys.executable, "-m", "agentik", "serve", "--reload"], env, tmp_path / "reload.log"
    )
    try:
        wait_http(f"{base}/health", proc)
        assert get(f"{base}/ping") == (200, "v1")
        conv = post(f"{base}/agentik/conversations", {})["id"]
        post(f"{base}/agentik/conversations/{conv}/messages", [{"type": "text", "body": "hi"}])

        def replied() -> bool:
            status, body = get(f"{base}/agentik/conversations/{conv}/messages")
            return status == 200 and len(json.loads(body)["items"]) == 2

        wait_for(replied, "the reply", proc)

        write(plugins / "pinger.py", PLUGIN.format(version="v2"))
        wait_for(lambda: get(f"{base}/ping") == (200, "v2"), "the reload", proc)
        assert "pinger.py changed: restarting" in proc.output
        assert replied()  # the conversation and its history are still there
        # a new file in the plugins folder is watched too
        extra = PLUGIN.format(version="x").replace("/ping", "/extra").replace('"echo"', '"e2"')
        write(plugins / "extra.py", extra)
        wait_for(lambda: get(f"{base}/extra") == (200, "x"), "the new plugin", proc)
        assert proc.output.count("serving (pid") == 3
    finally:
        code = proc.stop(signal.SIGTERM)
    output = proc.log_path.read_text()
    assert code == 0, output
    assert "agentik --reload: stopped" in output
    assert get(f"{base}/health")[0] == 0  # the server went with it
    assert "Traceback" not in output


def test_reload_never_imports_a_plugin():
    """The watcher finds the sources without running them (a broken plugin cannot stop it)."""
    import subprocess

    code = (
        "import sys; from agentik.core.reload import plugin_sources;"
        "files = plugin_sources(); mods = [m for m in sys.modules if m.startswith('agentik_')];"
        "print(len(files), mods); sys.exit(1 if mods or not files else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
