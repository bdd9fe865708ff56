"""The four skill tools the model gets: read_skill, read_skill_file, skill_save, skill_delete.

Each runs its file work in a thread (writes fsync) and turns a broken rule or a failed file
operation into a tool error the model reads; nothing outside the skills folder is ever touched.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from agentik.core.tools import Tool, ToolError, tool
from agentik_skills.folder import SkillCatalogue
from agentik_skills.format import SkillError

T = TypeVar("T")

NAME = {
    "type": "string",
    "description": "The skill's name, e.g. `git-rebase` or nested `backend:spring:db-base`.",
}


async def _run(fn: Callable[..., T], *args: Any) -> T:
    try:
        return await asyncio.to_thread(fn, *args)
    except SkillError as e:
        raise ToolError(str(e)) from None
    except OSError as e:
        raise ToolError(f"the skills folder refused it: {e.strerror or e}") from None


def skill_tools(catalogue: SkillCatalogue) -> list[Tool]:
    @tool(
        description=(
            "Read a skill's full instructions (the system prompt lists only names and "
            "descriptions), and the names of the other files in its folder."
        ),
        parameters={"type": "object", "properties": {"name": NAME}, "required": ["name"]},
    )
    async def read_skill(name: str) -> str:
        skill, body, files = await _run(catalogue.read, name)
        text = f"# {skill.name}\n\n{skill.description}\n\n{body}".rstrip()
        if files:
            listed = "\n".join(f"- {f}" for f in files)
            text += f"\n\nOther files of this skill (read them with read_skill_file):\n{listed}"
        return text

    @tool(
        description=(
            "Read a text file of a skill's folder (scripts/, references/, …) by its path "
            "relative to that folder, as read_skill lists them. Long files are cut."
        ),
        parameters={
            "type": "object",
            "properties": {
                "name": NAME,
                "path": {"type": "string", "description": "e.g. `references/api.md`"},
            },
            "required": ["name", "path"],
        },
    )
    async def read_skill_file(name: str, path: str) -> str:
        return await _run(catalogue.read_file, name, path)

    @tool(
        description=(
            "Save a reusable skill (create it, or update the one of that name) so it is "
            "available in later conversations. Save procedures that worked and are likely to "
            "be needed again."
        ),
        parameters={
            "type": "object",
            "properties": {
                "name": {
                    **NAME,
                    "description": NAME["description"]
                    + " Lowercase letters, digits and hyphens; `:` nests.",
                },
                "description": {
                    "type": "string",
                    "description": "One line: what the skill does and when to use it.",
                },
                "body": {"type": "string", "description": "The instructions, in markdown."},
            },
            "required": ["name", "description", "body"],
        },
    )
    async def skill_save(name: str, description: str, body: str) -> str:
        skill, created = await _run(catalogue.save, name, description, body)
        return f"{'Created' if created else 'Updated'} skill {skill.name} ({skill.path})."

    @tool(
        description="Delete a skill. It is moved to the skills folder's archive, not erased.",
        parameters={"type": "object", "properties": {"name": NAME}, "required": ["name"]},
    )
    async def skill_delete(name: str) -> str:
        where = await _run(catalogue.delete, name)
        return f"Deleted skill {name}: archived as {where}."

    return [read_skill, read_skill_file, skill_save, skill_delete]
