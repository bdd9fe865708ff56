"""Skills (F7): the catalogue of a real folder, the ``## Skills`` section the model gets (read
from the fake OpenAI server's request log), the four tools, path safety, atomic saves, change
detection, the banner and ``agentik plugins``. Every file the tools write is checked with
``skills-ref``, agentskills.io's reference validator."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import skills_ref

from agentik.core.app import AGENT, create_app, load_settings
from agentik.core.cli import banner, main
from agentik.core.testing import test_plugins
from agentik_skills import catalogue, folder
from agentik_skills.folder import SkillCatalogue
from tests.fake_openai import FakeOpenAI

BUILTINS = ("agentik_transport_http", "agentik_llm_openai", "agentik_skills")
BASE_PROMPT = "You are the test agent."

DB_BASE = """---
name: db-base
description: Set up the base database layer of a Spring service.
---

Use Flyway. Keep one migration per change.
"""


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def skill_md(name: str, description: str, body: str = "Do it.", extra: str = "") -> str:
    return f"---\nname: {name}\ndescription: {description}\n{extra}---\n\n{body}\n"


#: the broken files of make_skills and a word their reason must contain
BROKEN = {
    "bad-yaml.yaml": "bad YAML",
    "binary.yaml": "not UTF-8",
    "Bad_Folder/SKILL.md": "not a skill name",
    "huge/SKILL.md": "larger than",
    "long-description/SKILL.md": "longer than 1024",
    "mismatch/SKILL.md": "does not match its folder",
    "no-description.yml": "description",
    "no-front-matter/SKILL.md": "must start with a '---' line",
    "no-name/SKILL.md": "missing name",
    "unclosed/SKILL.md": "not closed",
    "x" * 65 + "/SKILL.md": "longer than 64",
    "z-duplicate.yaml": "duplicate name 'git-rebase' (kept git-rebase/SKILL.md)",
}


def make_skills(root: Path) -> Path:
    """Nested SKILL.md skills with resources, YAML skills, every kind of broken file and a
    duplicate name."""
    write(
        root / "git-rebase/SKILL.md",
        skill_md(
            "git-rebase",
            "Rebase a feature branch onto main\n  without losing work.",
            "1. git fetch\n2. git rebase origin/main",
            "license: MIT\nmetadata:\n  author: tests\n",
        ),
    )
    db = root / "backend/spring/db-base"
    write(db / "SKILL.md", DB_BASE)
    write(db / "scripts/migrate.sh", "#!/bin/sh\nflyway migrate\n")
    write(db / "references/naming.md", "# Naming\nsnake_case tables.\n")
    write(db / "references/config.yaml", "not: a skill\n")  # a resource, not a YAML skill
    write(db / "assets/logo.png", b"\x89PNG\r\n\x1a\n\x00\x00binary")
    write(db / "assets/big.txt", "0123456789\n" * 20_000)  # 220 KB
    write(db / ".hidden", "not listed")
    write(db / "migrations/SKILL.md", skill_md("migrations", "Write a Flyway migration."))
    write(root / "tips.yaml", "name: tips\ndescription: Small tips.\nbody: |\n  Be brief.\n")
    write(root / "ops/deploy.yml", "name: ops:deploy\ndescription: Deploy the service.\n")
    # broken, one of each kind
    write(root / "bad-yaml.yaml", "name: [unclosed\n")
    write(root / "binary.yaml", b"name: caf\xe9\ndescription: latin-1\n")
    write(root / "Bad_Folder/SKILL.md", skill_md("bad-folder", "Folder name breaks the rules."))
    write(root / "huge/SKILL.md", skill_md("huge", "Too big.", "x" * 300_000))
    write(root / "long-description/SKILL.md", skill_md("long-description", "d" * 1025))
    write(root / "mismatch/SKILL.md", skill_md("other-name", "Name is not the folder's."))
    write(root / "no-description.yml", "name: no-description\n")
    write(root / "no-front-matter/SKILL.md", "# Just markdown\n")
    write(root / "no-name/SKILL.md", "---\ndescription: Has no name.\n---\nbody\n")
    write(root / "unclosed/SKILL.md", "---\nname: unclosed\ndescription: never closed\n")
    write(root / ("x" * 65) / "SKILL.md", skill_md("x" * 65, "Name too long."))
    write(root / "z-duplicate.yaml", "name: git-rebase\ndescription: A second git-rebase.\n")
    write(root / ".archive/old/SKILL.md", skill_md("old", "Archived: never loaded."))
    return root


SKILLS = ["backend:spring:db-base", "backend:spring:db-base:migrations", "git-rebase"]
SKILLS += ["ops:deploy", "tips"]


@pytest.fixture
def skills_dir(tmp_path: Path) -> Path:
    return make_skills(tmp_path / "skills")


@pytest.fixture(name="fake")
async def fake_server() -> AsyncIterator[FakeOpenAI]:
    """The fake OpenAI server in this process (the other skills and soul tests import it)."""
    server = FakeOpenAI()
    await server.start()
    yield server
    await server.close()


def app_env(fake: FakeOpenAI, tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        "AGENTIK_DB_PATH": str(tmp_path / "agentik.db"),
        "AGENTIK_SYSTEM_PROMPT": BASE_PROMPT,
        "OPENAI_BASE_URL": fake.base_url,
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_MODEL": "fake-model",
        "OPENAI_MAX_RETRIES": "0",
        "AGENTIK_BACKGROUND_IDLE": "0",  # background model calls at once
        **extra,
    }


def build_app(env: dict[str, str], builtins: tuple[str, ...] = BUILTINS) -> Any:
    """The real app with the OpenAI backend (against the fake) and the skills plugin, loaded
    as the entry points load them."""
    plugins = test_plugins(builtins=builtins)
    return create_app(load_settings(plugins, env), plugins)


async def run_turn(client: Any, cid: str, text: str = "hello") -> None:
    """Send a message over HTTP and wait until its turn is recorded."""
    body = [{"type": "text", "body": text}]
    async with client.post(f"/agentik/conversations/{cid}/messages", json=body) as r:
        assert r.status == 202, await r.text()
    agent = client.app[AGENT]
    await (await agent.get_conversation(cid)).wait_idle()


async def new_conversation(client: Any) -> str:
    async with client.post("/agentik/conversations") as r:
        assert r.status == 201
        return str((await r.json())["id"])


def system_prompt(request: dict[str, Any]) -> str:
    first = request["messages"][0]
    assert first["role"] == "system"
    return str(first["content"])


async def invoke(app: Any, tool: str, /, **args: Any) -> tuple[str, bool]:
    return await app[AGENT].tools.invoke(tool, json.dumps(args))


# --- the catalogue -----------------------------------------------------------------------


def test_loads_nested_and_yaml_skills_and_reports_every_broken_file(skills_dir, caplog):
    cat = SkillCatalogue(skills_dir)
    assert sorted(s.name for s in cat.skills()) == SKILLS
    skipped = {s.path: s.reason for s in cat.skipped()}
    assert set(skipped) == set(BROKEN)
    for path, why in BROKEN.items():
        assert why in skipped[path], (path, skipped[path])
        assert f"{path} skipped" in caplog.text  # logged once, with the reason
    rebase = cat.get("git-rebase")
    assert rebase is not None and rebase.path == "git-rebase/SKILL.md"  # first by path wins
    assert rebase.description == "Rebase a feature branch onto main without losing work."
    assert rebase.license == "MIT" and rebase.metadata == {"author": "tests"}


def test_a_broken_folder_does_not_stop_start_up_and_logs_each_file_once(skills_dir, caplog):
    cat = SkillCatalogue(skills_dir, rescan=0)
    cat.skills()
    cat.skills()
    assert caplog.text.count("huge/SKILL.md skipped") == 1


async def test_the_model_gets_only_the_skills_section_in_path_order(
    skills_dir, fake, tmp_path, aiohttp_client
):
    client = await aiohttp_client(
        build_app(app_env(fake, tmp_path, AGENTIK_SKILLS_DIR=str(skills_dir)))
    )
    await run_turn(client, await new_conversation(client))
    prompt = system_prompt(fake.requests[-1])
    base, _, section = prompt.partition("\n\n## Skills\n\n")
    assert base == BASE_PROMPT  # order 200: after the base prompt
    lines = [line for line in section.splitlines() if line.startswith("- ")]
    assert lines == [
        "- **backend:spring:db-base**: Set up the base database layer of a Spring service.",
        "- **backend:spring:db-base:migrations**: Write a Flyway migration.",
        "- **git-rebase**: Rebase a feature branch onto main without losing work.",
        "- **ops:deploy**: Deploy the service.",
        "- **tips**: Small tips.",
    ]
    assert "Flyway. Keep one migration" not in prompt  # bodies are read on demand
    names = {t["function"]["name"] for t in fake.requests[-1]["tools"]}
    assert {"read_skill", "read_skill_file", "skill_save", "skill_delete"} <= names


async def test_without_a_skills_folder_there_is_no_section_and_no_tool(
    fake, tmp_path, aiohttp_client
):
    client = await aiohttp_client(build_app(app_env(fake, tmp_path)))
    await run_turn(client, await new_conversation(client))
    assert system_prompt(fake.requests[-1]) == BASE_PROMPT
    assert "tools" not in fake.requests[-1]


# --- the tools ---------------------------------------------------------------------------


@pytest.fixture
async def app(skills_dir, fake, tmp_path, aiohttp_client) -> Any:
    env = app_env(fake, tmp_path, AGENTIK_SKILLS_DIR=str(skills_dir), AGENTIK_SKILLS_RESCAN="60")
    client = await aiohttp_client(build_app(env))
    return client.app


async def test_read_skill_gives_the_body_and_the_other_files(app):
    text, error = await invoke(app, "read_skill", name="backend:spring:db-base")
    assert not error
    assert text.startswith("# backend:spring:db-base\n\nSet up the base database layer")
    assert "Use Flyway. Keep one migration per change." in text
    listed = text.split("read_skill_file):\n")[1].splitlines()
    # not SKILL.md, not hidden files, not the nested skill's folder
    assert listed == [
        "- assets/big.txt",
        "- assets/logo.png",
        "- references/config.yaml",
        "- references/naming.md",
        "- scripts/migrate.sh",
    ]
    text, error = await invoke(app, "read_skill", name="tips")
    assert not error and text == "# tips\n\nSmall tips.\n\nBe brief."
    text, error = await invoke(app, "read_skill", name="git-rebas")
    assert error and "no skill named 'git-rebas'; did you mean git-rebase?" in text


async def test_read_skill_file_reads_text_cut_to_size_and_refuses_binary(app):
    text, error = await invoke(
        app, "read_skill_file", name="backend:spring:db-base", path="references/naming.md"
    )
    assert (text, error) == ("# Naming\nsnake_case tables.\n", False)
    text, error = await invoke(
        app, "read_skill_file", name="backend:spring:db-base", path="assets/big.txt"
    )
    assert not error and len(text) < 100_200
    assert text.endswith("[… cut: 220000 bytes, only the first 100000 shown]")
    text, error = await invoke(
        app, "read_skill_file", name="backend:spring:db-base", path="assets/logo.png"
    )
    assert error and "not a text file" in text
    text, error = await invoke(app, "read_skill_file", name="tips", path="x.md")
    assert error and "YAML skill" in text
    text, error = await invoke(app, "read_skill_file", name="git-rebase", path="nope.md")
    assert error and "has no file 'nope.md'" in text


async def test_skill_save_creates_nested_folders_that_skills_ref_accepts(app, skills_dir):
    text, error = await invoke(
        app,
        "skill_save",
        name="frontend:react:state-hooks",
        description="Manage state with hooks: useState, useReducer.",
        body="# Hooks\n\n---\n\nPrefer useReducer for related state.",
    )
    assert (text, error) == (
        "Created skill frontend:react:state-hooks (frontend/react/state-hooks/SKILL.md).",
        False,
    )
    folder = skills_dir / "frontend/react/state-hooks"
    assert skills_ref.validate(folder) == []
    props = skills_ref.read_properties(folder)
    assert props.name == "state-hooks"
    assert props.description == "Manage state with hooks: useState, useReducer."
    text, error = await invoke(app, "read_skill", name="frontend:react:state-hooks")
    assert not error and "Prefer useReducer for related state." in text
    # the next system prompt built lists it (the tool's own write is seen at once)
    assert "- **frontend:react:state-hooks**: Manage state with hooks" in (
        app[AGENT].system_prompt()
    )


async def test_skill_save_updates_and_keeps_the_optional_fields(app, skills_dir):
    text, error = await invoke(
        app, "skill_save", name="git-rebase", description="Rebase safely.", body="New steps."
    )
    assert (text, error) == ("Updated skill git-rebase (git-rebase/SKILL.md).", False)
    assert skills_ref.validate(skills_dir / "git-rebase") == []
    props = skills_ref.read_properties(skills_dir / "git-rebase")
    assert (props.description, props.license, props.metadata) == (
        "Rebase safely.",
        "MIT",
        {"author": "tests"},
    )
    text, _ = await invoke(app, "read_skill", name="git-rebase")
    assert text.endswith("Rebase safely.\n\nNew steps.")
    # a YAML skill is updated in its own file
    text, error = await invoke(app, "skill_save", name="tips", description="Tips.", body="Two.")
    assert (text, error) == ("Updated skill tips (tips.yaml).", False)
    assert "body: Two." in (skills_dir / "tips.yaml").read_text()
    assert not (skills_dir / "tips").exists()


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ({"name": "Bad Name"}, "not a skill name"),
        ({"name": "-lead"}, "not a skill name"),
        ({"name": "double--hyphen"}, "not a skill name"),
        ({"description": ""}, "description"),
        ({"description": "d" * 1025}, "longer than 1024"),
        ({"description": "a --- b"}, "must not contain '---'"),
        ({"body": 42}, "body: 42 is not of type 'string'"),  # the arguments check
    ],
)
async def test_skill_save_refuses_what_the_spec_refuses(app, skills_dir, args, why):
    before = sorted(p.relative_to(skills_dir) for p in skills_dir.rglob("*"))
    full = {"name": "fine-name", "description": "Fine.", "body": "Fine.", **args}
    text, error = await invoke(app, "skill_save", **full)
    assert error and why in text, text
    assert sorted(p.relative_to(skills_dir) for p in skills_dir.rglob("*")) == before


async def test_skill_delete_archives_and_moving_back_restores(app, skills_dir):
    text, error = await invoke(app, "skill_delete", name="git-rebase")
    assert not error and text.startswith(
        "Deleted skill git-rebase: archived as .archive/git-rebase@"
    )
    archived = skills_dir / text.split("archived as ")[1].rstrip(".")
    assert (archived / "SKILL.md").is_file() and not (skills_dir / "git-rebase").exists()
    # the duplicate that was skipped takes its place; deleting that one too leaves none
    assert "- **git-rebase**: A second git-rebase." in app[AGENT].system_prompt()
    text, error = await invoke(app, "skill_delete", name="git-rebase")
    assert not error and "archived as .archive/z-duplicate.yaml@" in text
    assert "git-rebase" not in app[AGENT].system_prompt()
    text, error = await invoke(app, "read_skill", name="git-rebase")
    assert error and "no skill named 'git-rebase'" in text
    # a YAML skill: its file moves
    text, error = await invoke(app, "skill_delete", name="ops:deploy")
    assert not error and "archived as .archive/ops/deploy.yml@" in text
    # one holding nested skills is refused
    text, error = await invoke(app, "skill_delete", name="backend:spring:db-base")
    assert error and "backend:spring:db-base:migrations" in text
    assert (skills_dir / "backend/spring/db-base/SKILL.md").is_file()
    # restore: move the folder back; read_skill finds it at once (an unknown name rescans)
    archived.rename(skills_dir / "git-rebase")
    text, error = await invoke(app, "read_skill", name="git-rebase")
    assert not error and "git fetch" in text


async def test_two_saves_of_one_skill_at_once_leave_one_valid_file(app, skills_dir):
    bodies = [f"Version {i}.\n" + "line\n" * 2000 for i in range(16)]
    results = await asyncio.gather(
        *(invoke(app, "skill_save", name="racy", description="Raced.", body=b) for b in bodies)
    )
    assert all(not error for _, error in results)
    folder = skills_dir / "racy"
    assert sorted(p.name for p in folder.iterdir()) == ["SKILL.md"]  # no temporary left
    assert skills_ref.validate(folder) == []
    text, _ = await invoke(app, "read_skill", name="racy")
    assert any(text.endswith(b.strip()) for b in bodies)


# --- path safety: through every tool, nothing outside the folder is touched ---------------


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else b"", p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture
def outside(tmp_path: Path, skills_dir: Path) -> Path:
    """Files next to the skills folder, and symlinks from inside it to them."""
    out = tmp_path / "outside"
    write(out / "secret.txt", "secret")
    write(out / "evil/SKILL.md", skill_md("evil", "Lives outside."))
    (skills_dir / "evil").symlink_to(out / "evil", target_is_directory=True)
    (skills_dir / "git-rebase/leak.txt").symlink_to(out / "secret.txt")
    (skills_dir / "linked").mkdir()
    (skills_dir / "linked/SKILL.md").symlink_to(out / "evil/SKILL.md")
    return out


BAD_NAMES = [
    "..",
    "../outside",
    "a/../../outside",
    "/etc/passwd",
    str(Path("/tmp").resolve()),
    "evil\\..\\x",
    "nul\x00name",
    "a" * 65,
    ":".join(["a"] * 9),
    "a:",
    "",
    "evil",  # a symlinked folder pointing out: not a skill, and not written through
    "linked",  # a SKILL.md symlink pointing out: skipped
]


@pytest.mark.parametrize("tool", ["read_skill", "read_skill_file", "skill_save", "skill_delete"])
async def test_no_name_leads_outside_the_folder(app, outside, skills_dir, tool):
    before = snapshot(outside)
    for name in BAD_NAMES:
        args: dict[str, Any] = {"name": name}
        if tool == "read_skill_file":
            args["path"] = "SKILL.md"
        if tool == "skill_save":
            args |= {"description": "Escape.", "body": "pwned"}
        text, error = await invoke(app, tool, **args)
        assert error, (name, text)
        assert "Lives outside" not in text and "secret" not in text
    assert snapshot(outside) == before


BAD_PATHS = [
    "../../outside/secret.txt",
    "../git-rebase/SKILL.md",
    "scripts/../../../x",
    "/etc/passwd",
    "C:/windows",
    "scripts\\migrate.sh",
    "scripts/migrate.sh\x00.txt",
    "x" * 2000,
    "",
]


async def test_no_file_path_leads_outside_the_skill(app, outside):
    before = snapshot(outside)
    for name, path in [
        *(("backend:spring:db-base", p) for p in BAD_PATHS),
        ("git-rebase", "leak.txt"),  # a symlink pointing out
    ]:
        text, error = await invoke(app, "read_skill_file", name=name, path=path)
        assert error and "secret" not in text, (path, text)
    assert snapshot(outside) == before


def test_symlinks_pointing_out_are_not_loaded(skills_dir, outside):
    cat = SkillCatalogue(skills_dir)
    assert "evil" not in [s.name for s in cat.skills()]  # symlinked folders are not followed
    assert {s.path: s.reason for s in cat.skipped()}["linked/SKILL.md"].startswith(
        "that path leads outside the skills folder"
    )


# --- changes on disk ---------------------------------------------------------------------


def test_hand_edits_are_seen_after_the_rescan_interval(skills_dir, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(folder, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    cat = SkillCatalogue(skills_dir, rescan=1.0)
    before = cat.prompt_section()
    write(skills_dir / "new-one/SKILL.md", skill_md("new-one", "Added by hand."))
    clock[0] += 0.5
    assert cat.prompt_section() is before  # within the interval: no scan, same text
    clock[0] += 0.6
    assert "- **new-one**: Added by hand." in cat.prompt_section()
    # an edit in place (same size, new mtime) is seen too
    path = skills_dir / "tips.yaml"
    path.write_text(path.read_text().replace("Small tips.", "Short tips."))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    clock[0] += 1.1
    assert "- **tips**: Short tips." in cat.prompt_section()


def test_an_unchanged_folder_is_not_parsed_again(skills_dir, monkeypatch):
    cat = SkillCatalogue(skills_dir, rescan=0)
    cat.skills()
    parsed: list[str] = []
    real = SkillCatalogue._parse
    monkeypatch.setattr(
        SkillCatalogue, "_parse", lambda self, c: parsed.append(c.path) or real(self, c)
    )
    version = cat.version
    assert cat.prompt_section() is cat.prompt_section()
    assert parsed == [] and cat.version == version
    write(skills_dir / "tips.yaml", "name: tips\ndescription: Changed tips.\n")
    cat.skills()
    assert parsed == ["tips.yaml"] and cat.version == version + 1


async def test_a_slow_check_runs_off_the_event_loop(skills_dir, monkeypatch):
    """On the event loop, a large folder is checked in a thread: the prompt built meanwhile
    uses what the catalogue knew, the next ones see the change."""
    cat = SkillCatalogue(skills_dir, rescan=0)
    cat.skills()  # the first check, inline
    monkeypatch.setattr(folder, "LOOP_SCAN_FILES", 10)  # as if the folder were large
    scans: list[bool] = []
    real = SkillCatalogue._refresh
    go = threading.Event()  # the thread's scan waits for it: what the caller sees is known

    def refresh(self: SkillCatalogue) -> None:
        scans.append(folder._on_event_loop())
        go.wait(10)
        real(self)

    monkeypatch.setattr(SkillCatalogue, "_refresh", refresh)
    write(skills_dir / "new-one/SKILL.md", skill_md("new-one", "Added by hand."))
    assert "new-one" not in cat.prompt_section()
    go.set()
    for _ in range(1000):  # the thread may wait for a CPU on a busy machine
        if "new-one" in cat.prompt_section():
            break
        await asyncio.sleep(0.01)
    assert "- **new-one**: Added by hand." in cat.prompt_section()
    assert scans and not any(scans)  # never on the loop's thread


async def test_a_change_reaches_a_live_conversation_at_its_next_turn(
    skills_dir, fake, tmp_path, aiohttp_client
):
    """The openai backend swaps the system message of the live conversation: the history stays,
    nothing is rebuilt."""
    env = app_env(fake, tmp_path, AGENTIK_SKILLS_DIR=str(skills_dir), AGENTIK_SKILLS_RESCAN="0")
    client = await aiohttp_client(build_app(env))
    first = await new_conversation(client)
    await run_turn(client, first)
    assert "late" not in system_prompt(fake.requests[-1])
    write(skills_dir / "late/SKILL.md", skill_md("late", "Added while it ran."))
    await run_turn(client, first, "again")
    sent = fake.requests[-1]["messages"]
    assert "- **late**: Added while it ran." in system_prompt(fake.requests[-1])
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert (await client.app[AGENT].get_conversation(first)).llm_builds == 1
    await invoke(
        client.app, "skill_save", name="saved", description="Saved by the model.", body="x"
    )
    await run_turn(client, first, "and again")
    assert "- **saved**: Saved by the model." in system_prompt(fake.requests[-1])


# --- banner and agentik plugins -----------------------------------------------------------


async def test_banner_line(app, skills_dir):
    lines = await banner(app, "127.0.0.1", 8080)
    assert f"  skills: 5 from {skills_dir} (12 skipped)" in lines


def test_agentik_plugins_shows_the_catalogue_and_every_skipped_file(
    skills_dir, monkeypatch, capsys
):
    monkeypatch.setenv("AGENTIK_SKILLS_DIR", str(skills_dir))
    monkeypatch.setenv("AGENTIK_LOAD_PLUGINS", "agentik_skills")
    assert main(["plugins", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    details = next(p for p in report["plugins"] if p["name"] == "agentik_skills")["details"]
    assert details["dir"] == str(skills_dir)
    assert sorted(details["skills"]) == SKILLS
    assert {s["path"] for s in details["skipped"]} == set(BROKEN)
    assert details["mining"] == "every 15 turns, reading the last 30"


def test_the_catalogue_is_readable_by_other_plugins(skills_dir):
    """The accessor the A2A agent card uses: the same object the agent's tools use."""
    plugins = test_plugins(builtins=("agentik_skills",))
    settings = load_settings(plugins, {"AGENTIK_SKILLS_DIR": str(skills_dir)})
    cat = catalogue(settings)
    assert cat is not None and cat is catalogue(settings)
    assert [s.to_json() for s in cat.skills()][2] == {
        "name": "git-rebase",
        "description": "Rebase a feature branch onto main without losing work.",
        "path": "git-rebase/SKILL.md",
        "license": "MIT",
        "metadata": {"author": "tests"},
    }
    assert catalogue(load_settings(plugins, {})) is None


def test_a_skills_dir_that_is_a_file_stops_start_up(tmp_path):
    from agentik.core.settings import SettingsError

    write(tmp_path / "file", "x")
    with pytest.raises(
        SettingsError, match=r"^AGENTIK_SKILLS_DIR='.*file' is invalid: is not a folder$"
    ):
        load_settings(
            test_plugins(builtins=("agentik_skills",)),
            {"AGENTIK_SKILLS_DIR": str(tmp_path / "file")},
        )
