"""The skills over HTTP, read-only, for people (the web page's skills panel) and scripts:
``GET /agentik/skills`` (the catalogue) and ``GET /agentik/skills/{name}`` (one skill with its
body). The routes exist only with a skills folder; they sit behind the API key."""

from __future__ import annotations

import asyncio

from aiohttp import web

from agentik_skills.folder import SkillCatalogue
from agentik_skills.format import SkillError

PREFIX = "/agentik/skills"


def add_routes(app: web.Application, catalogue: SkillCatalogue) -> None:
    async def list_skills(request: web.Request) -> web.Response:
        skills = await asyncio.to_thread(catalogue.skills)  # it may rescan the folder
        return web.json_response({"items": [s.to_json() for s in skills]})

    async def get_skill(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        try:
            skill, body, files = await asyncio.to_thread(catalogue.read, name)
        except SkillError as e:  # no such skill (or no longer readable): it says which
            raise web.HTTPNotFound(text=str(e)) from None
        return web.json_response({**skill.to_json(), "body": body, "files": files})

    app.router.add_get(PREFIX, list_skills)
    app.router.add_get(PREFIX + "/{name}", get_skill)
