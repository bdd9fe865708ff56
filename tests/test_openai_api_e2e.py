"""The OpenAI-compatible API end to end with a real third-party client: simonw/llm (PyPI), its
``extra-openai-models.yaml`` pointing at ``agentik serve`` (with the fake OpenAI server behind it)
in a temporary ``LLM_USER_PATH``: ``llm -m agentik``, ``llm chat`` and ``llm -c`` keep one
conversation of the agent, as a chat front end would."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import BIN
from tests.test_serve import openai_env

KEY = "openai-e2e-key-0123456789"
LLM = BIN / "llm"
pytestmark = pytest.mark.skipif(not LLM.exists(), reason="needs simonw/llm (pip install llm)")


def run_llm(home: Path, *args: str, stdin: str | None = None) -> str:
    env = {**os.environ, "LLM_USER_PATH": str(home)}
    env.pop("OPENAI_API_KEY", None)
    result = subprocess.run(
        [str(LLM), *args], input=stdin, capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


async def conversations(base: str) -> list[list[tuple[str, Any]]]:
    """Every conversation of the agent, oldest first: (kind, text or context) per record."""
    headers = {"Authorization": f"Bearer {KEY}"}
    out = []
    async with aiohttp.ClientSession(headers=headers) as s:
        async with s.get(f"{base}/agentik/conversations") as r:
            ids = [c["id"] for c in (await r.json())["items"]]
        for cid in reversed(ids):
            async with s.get(f"{base}/agentik/conversations/{cid}/messages") as r:
                items = (await r.json())["items"]
            out.append(
                [
                    (m["type"], m["content"][0]["body"] if m["type"] == "user" else m.get("text"))
                    for m in items
                ]
                + [("context", m["context"]) for m in items if m.get("context")]
            )
    return out


async def test_simonw_llm_prompts_and_chats(serve: Any, fake_openai_proc: str, tmp_path: Path):
    proc, base = serve(openai_env(fake_openai_proc, AGENTIK_API_KEY=KEY))
    proc.wait_output("POST /v1/chat/completions")
    home = tmp_path / "llm"
    home.mkdir()
    (home / "extra-openai-models.yaml").write_text(
        f'- model_id: agentik\n  model_name: agentik\n  api_base: "{base}/v1"\n'
        "  api_key_name: agentik\n"
    )
    run_llm(home, "keys", "set", "agentik", "--value", KEY)

    assert run_llm(home, "-m", "agentik", "hello there").strip() == "echo: hello there"
    out = run_llm(home, "chat", "-m", "agentik", stdin="first line\nsecond line\nexit\n")
    assert "echo: first line" in out and "echo: second line" in out
    # -c continues the last conversation: llm resends it, the agent finds it
    assert run_llm(home, "-c", "and a third").strip() == "echo: and a third"
    out = run_llm(home, "-m", "agentik", "-s", "Answer in French.", "bonjour")
    assert out.strip() == "echo: [SYSTEM] Answer in French.\nbonjour"

    assert await conversations(base) == [
        [("user", "hello there"), ("assistant", "echo: hello there")],
        [
            ("user", "first line"),
            ("assistant", "echo: first line"),
            ("user", "second line"),
            ("assistant", "echo: second line"),
            ("user", "and a third"),
            ("assistant", "echo: and a third"),
        ],
        [
            ("user", "bonjour"),
            ("assistant", "echo: [SYSTEM] Answer in French.\nbonjour"),
            ("context", {"origin": "system", "description": "Answer in French."}),
        ],
    ]
    # the model behind the agent got each message once, never the resent history
    async with (
        aiohttp.ClientSession() as s,
        s.get(fake_openai_proc.removesuffix("/v1") + "/_fake/requests") as r,
    ):
        requests = await r.json()
    users = [[m for m in req["messages"] if m["role"] == "user"] for req in requests]
    assert [len(u) for u in users] == [1, 1, 2, 3, 1]
