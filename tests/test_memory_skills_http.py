"""Memory notes and skills over HTTP (the web page's panel reads them): the memory plugin's
``/agentik/memory/notes`` and the skills plugin's ``/agentik/skills``, present only when the
feature is on, behind the API key like every route."""

from __future__ import annotations

from pathlib import Path

from agentik.core.app import AGENT
from agentik.core.testing import make_app

KEY = "panel-test-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
PLUGINS = ("agentik_transport_http", "agentik_memory", "agentik_memory_md", "agentik_skills")


def app(tmp_path: Path, **env: str):
    return make_app(
        env={
            "AGENTIK_API_KEY": KEY,
            "AGENTIK_MEMORY_BACKEND": "md",
            "AGENTIK_MEMORY_DIR": str(tmp_path / "mem"),
            "AGENTIK_MEMORY_REVIEW": "0",
            "AGENTIK_SKILLS_DIR": str(tmp_path / "skills"),
            **env,
        },
        builtins=PLUGINS,
    )


async def test_notes_are_listed_by_category_and_deleted(aiohttp_client, tmp_path):
    application = app(tmp_path)
    client = await aiohttp_client(application)
    memory = application[AGENT].memory
    saved = [await memory.save("user", f"fact {i}", "USER") for i in range(3)]
    await memory.save("world", "the sky is blue", "AGENT")
    assert (await client.get("/agentik/memory/notes?category=user")).status == 401
    r = await client.get("/agentik/memory/notes?category=user&limit=2", headers=AUTH)
    page = await r.json()
    assert r.status == 200 and page["hasMore"] is True and page["limit"] == 2
    assert [n["text"] for n in page["items"]] == ["fact 0", "fact 1"]
    first = page["items"][0]
    assert first["id"] == saved[0].id and first["category"] == "user"
    assert first["source"] == "USER" and first["uses"] == 0 and first["lastUsedAt"] is None
    r = await client.get("/agentik/memory/notes?category=user&offset=2", headers=AUTH)
    assert [n["text"] for n in (await r.json())["items"]] == ["fact 2"]
    for bad in ["", "?category=nope", "?category=user&limit=0", "?category=user&offset=-1"]:
        r = await client.get(f"/agentik/memory/notes{bad}", headers=AUTH)
        assert r.status == 400, bad
        assert (await r.json())["error"]["code"] == "invalid_request"
    assert (await client.delete(f"/agentik/memory/notes/{saved[1].id}")).status == 401
    r = await client.delete(f"/agentik/memory/notes/{saved[1].id}", headers=AUTH)
    assert r.status == 204
    assert await memory.get(saved[1].id) is None
    r = await client.delete(f"/agentik/memory/notes/{saved[1].id}", headers=AUTH)
    assert r.status == 404 and (await r.json())["error"]["code"] == "not_found"
    r = await client.get("/agentik/memory/notes?category=user", headers=AUTH)
    assert [n["text"] for n in (await r.json())["items"]] == ["fact 0", "fact 2"]


async def test_skills_are_listed_and_read(aiohttp_client, tmp_path):
    folder = tmp_path / "skills" / "greeting"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(
        "---\nname: greeting\ndescription: How to greet\n---\nSay hello.\n"
    )
    client = await aiohttp_client(app(tmp_path))
    assert (await client.get("/agentik/skills")).status == 401
    r = await client.get("/agentik/skills", headers=AUTH)
    assert (await r.json())["items"] == [
        {"name": "greeting", "description": "How to greet", "path": "greeting/SKILL.md"}
    ]
    r = await client.get("/agentik/skills/greeting", headers=AUTH)
    skill = await r.json()
    assert skill["name"] == "greeting" and skill["body"].strip() == "Say hello."
    r = await client.get("/agentik/skills/greting", headers=AUTH)
    assert r.status == 404 and "did you mean greeting" in (await r.json())["error"]["message"]


async def test_off_features_have_no_routes(aiohttp_client, tmp_path):
    client = await aiohttp_client(
        app(tmp_path, AGENTIK_MEMORY_BACKEND="off", AGENTIK_SKILLS_DIR="")
    )
    for path in ["/agentik/memory/notes?category=user", "/agentik/skills"]:
        r = await client.get(path, headers=AUTH)
        assert r.status == 404, path
    assert (await client.get("/agentik/conversations", headers=AUTH)).status == 200
