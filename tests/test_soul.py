"""Persona (F8): AGENTIK_SOUL at the very top of the system prompt the model gets (read from the
fake OpenAI server's request log), edits picked up, start-up refusing a file it cannot read."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agentik.core.cli import banner, main
from tests.conftest import BIN
from tests.test_skills import (
    BASE_PROMPT,
    BUILTINS,
    app_env,
    build_app,
    fake_server,  # noqa: F401 - the `fake` fixture
    make_skills,
    new_conversation,
    run_turn,
    system_prompt,
)

SOUL = "You are Marvin, a patient technical assistant.\nNever reveal keys or passwords.\n"


def soul_app(env: dict[str, str]) -> Any:
    return build_app(env, (*BUILTINS, "agentik_soul"))


@pytest.fixture
def soul(tmp_path: Path) -> Path:
    path = tmp_path / "SOUL.md"
    path.write_text(SOUL)
    return path


async def test_the_soul_comes_first_above_the_base_prompt_and_the_skills(
    soul, fake, tmp_path, aiohttp_client
):
    skills = make_skills(tmp_path / "skills")
    env = app_env(fake, tmp_path, AGENTIK_SOUL=str(soul), AGENTIK_SKILLS_DIR=str(skills))
    client = await aiohttp_client(soul_app(env))
    await run_turn(client, await new_conversation(client))
    prompt = system_prompt(fake.requests[-1])
    assert prompt.startswith(SOUL.strip() + "\n\n" + BASE_PROMPT + "\n\n## Skills\n")


async def test_edits_are_picked_up_by_the_next_conversation(soul, fake, tmp_path, aiohttp_client):
    client = await aiohttp_client(soul_app(app_env(fake, tmp_path, AGENTIK_SOUL=str(soul))))
    await run_turn(client, await new_conversation(client))
    assert system_prompt(fake.requests[-1]).startswith("You are Marvin")
    soul.write_text("You are Arthur.\n")
    await run_turn(client, await new_conversation(client))
    assert system_prompt(fake.requests[-1]) == "You are Arthur.\n\n" + BASE_PROMPT


async def test_an_edit_reaches_a_running_conversation_at_its_next_turn(
    soul, fake, tmp_path, aiohttp_client
):
    client = await aiohttp_client(soul_app(app_env(fake, tmp_path, AGENTIK_SOUL=str(soul))))
    cid = await new_conversation(client)
    await run_turn(client, cid)
    assert system_prompt(fake.requests[-1]).startswith("You are Marvin")
    soul.write_text("You are Arthur.\n")
    await run_turn(client, cid, "who are you now?")
    assert system_prompt(fake.requests[-1]) == "You are Arthur.\n\n" + BASE_PROMPT
    sent = fake.requests[-1]["messages"]
    assert [(m["role"], m["content"]) for m in sent[1:]] == [
        ("user", "hello"),
        ("assistant", sent[2]["content"]),
        ("user", "who are you now?"),
    ]


async def test_a_soul_that_becomes_unreadable_keeps_its_last_text(
    soul, fake, tmp_path, aiohttp_client, caplog
):
    client = await aiohttp_client(soul_app(app_env(fake, tmp_path, AGENTIK_SOUL=str(soul))))
    await run_turn(client, await new_conversation(client))
    soul.unlink()
    for _ in range(2):
        await run_turn(client, await new_conversation(client))
        assert system_prompt(fake.requests[-1]).startswith("You are Marvin")
    assert caplog.text.count("keeping the last text read") == 1  # warned once


async def test_without_a_soul_nothing_is_added(fake, tmp_path, aiohttp_client):
    client = await aiohttp_client(build_app(app_env(fake, tmp_path)))
    await run_turn(client, await new_conversation(client))
    assert system_prompt(fake.requests[-1]) == BASE_PROMPT


@pytest.mark.parametrize("kind", ["missing", "folder", "not-utf8"])
def test_start_up_stops_on_a_soul_it_cannot_read(tmp_path, kind):
    path = tmp_path / "SOUL.md"
    if kind == "folder":
        path.mkdir()
    elif kind == "not-utf8":
        path.write_bytes(b"caf\xe9\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTIK_", "OPENAI_"))}
    env |= {"AGENTIK_SOUL": str(path), "AGENTIK_DB_PATH": str(tmp_path / "db")}
    result = subprocess.run(
        [str(BIN / "agentik"), "serve"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    why = {"missing": "No such file", "folder": "Is a directory", "not-utf8": "not UTF-8"}[kind]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"agentik: error: AGENTIK_SOUL='{path}'")
    assert why in lines[0]


async def test_banner_line(soul, fake, tmp_path, aiohttp_client):
    client = await aiohttp_client(soul_app(app_env(fake, tmp_path, AGENTIK_SOUL=str(soul))))
    lines = await banner(client.app, "127.0.0.1", 8080)
    assert f"  soul: {soul} ({len(SOUL)} chars)" in lines


def test_agentik_plugins_shows_the_soul(soul, monkeypatch, capsys):
    monkeypatch.setenv("AGENTIK_SOUL", str(soul))
    monkeypatch.setenv("AGENTIK_LOAD_PLUGINS", "agentik_soul")
    assert main(["plugins", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    details = next(p for p in report["plugins"] if p["name"] == "agentik_soul")["details"]
    assert details == {"path": str(soul), "chars": len(SOUL)}
