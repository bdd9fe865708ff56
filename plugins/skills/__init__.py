"""Skills (F7): a folder of SKILL.md / YAML skills, the tools to read and write them, the
``## Skills`` system-prompt section, and background skill mining. See ``docs/skills.md``.

Other plugins read the catalogue through :func:`catalogue` (the A2A agent card lists it)::

    import agentik_skills
    cat = agentik_skills.folder(settings)   # None when AGENTIK_SKILLS_DIR is unset
    for skill in cat.skills():                 # agentik_skills.Skill: name, description, path, …
        ...

and run a mining pass with ``await agentik_skills.miner(settings).mine(conversation)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentik.core import settings as cfg
from agentik.core.settings import Setting, Settings
from agentik.hookspecs import hookimpl

if TYPE_CHECKING:
    from agentik.core.agent import ChatAgent
    from agentik.core.conversation import ChatConversation
    from agentik_skills.folder import SkillCatalogue, Skipped
    from agentik_skills.format import Skill, SkillError
    from agentik_skills.mining import MiningReport, SkillMiner

__all__ = [
    "MiningReport",
    "Skill",
    "SkillCatalogue",
    "SkillError",
    "SkillMiner",
    "Skipped",
    "catalogue",
    "miner",
]

#: where the public names live: imported on first use, so loading the plugin stays cheap
_LAZY = {
    "MiningReport": "agentik_skills.mining",
    "SkillMiner": "agentik_skills.mining",
    "SkillCatalogue": "agentik_skills.folder",
    "Skipped": "agentik_skills.folder",
    "Skill": "agentik_skills.format",
    "SkillError": "agentik_skills.format",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


PROMPT_ORDER = 200  # persona 0, base prompt 100, skills 200, memory 300, reflection 400


def parse_skills_dir(raw: str) -> Path:
    path = cfg.parse_path(raw)
    if path.exists() and not path.is_dir():
        raise ValueError("is not a folder")
    return path


SETTINGS = (
    Setting(
        "AGENTIK_SKILLS_DIR",
        None,
        parse_skills_dir,
        "Folder of skills: SKILL.md folders and *.yaml files, recursively (unset: no skills; "
        "created by the first skill_save). See docs/skills.md.",
    ),
    Setting(
        "AGENTIK_SKILLS_RESCAN",
        1.0,
        cfg.parse_non_negative_float,
        "Seconds between checks of the skills folder for changes made outside the agent "
        "(0: at every use).",
    ),
    Setting(
        "AGENTIK_SKILL_MINING_INTERVAL",
        15,
        cfg.parse_non_negative_int,
        "Skill mining: every this many turns of a conversation, a background LLM call saves "
        "the reusable skills it finds in them (0: off).",
    ),
    Setting(
        "AGENTIK_SKILL_MINING_MAX_TURNS",
        30,
        cfg.parse_positive_int,
        "How many of the conversation's last turns skill mining reads.",
    ),
)

# One catalogue per folder (and one miner per catalogue and mining settings), shared by
# everything built from the same settings; alive as long as an agent's tools hold it.
_catalogues: weakref.WeakValueDictionary[tuple[Any, ...], SkillCatalogue] = (
    weakref.WeakValueDictionary()
)
_miners: weakref.WeakValueDictionary[tuple[Any, ...], SkillMiner] = weakref.WeakValueDictionary()


def catalogue(settings: Settings) -> SkillCatalogue | None:
    """The skills catalogue of these settings, or ``None`` when ``AGENTIK_SKILLS_DIR`` is unset.

    Public API for other plugins: ``skills()``, ``get(name)``, ``skipped()``, ``version``."""
    root = settings.get("AGENTIK_SKILLS_DIR")
    if root is None:
        return None
    key = (str(root), settings["AGENTIK_SKILLS_RESCAN"])
    cat = _catalogues.get(key)
    if cat is None:
        from agentik_skills.folder import SkillCatalogue

        cat = _catalogues[key] = SkillCatalogue(root, settings["AGENTIK_SKILLS_RESCAN"])
    return cat


def miner(settings: Settings) -> SkillMiner | None:
    """The skill miner of these settings (``None`` without a skills folder). ``await
    miner(settings).mine(conversation)`` runs one mining pass now, whatever the interval."""
    cat = catalogue(settings)
    if cat is None:
        return None
    interval = settings["AGENTIK_SKILL_MINING_INTERVAL"]
    max_turns = settings["AGENTIK_SKILL_MINING_MAX_TURNS"]
    key = (id(cat), interval, max_turns)
    found = _miners.get(key)
    if found is None or found.catalogue is not cat:
        from agentik_skills.mining import SkillMiner

        found = _miners[key] = SkillMiner(cat, interval, max_turns)
    return found


@hookimpl
def register_settings(register: Callable[[Setting], None]) -> None:
    for setting in SETTINGS:
        register(setting)


@hookimpl
def register_tools(register: Callable[..., None], settings: Settings) -> None:
    cat = catalogue(settings)
    if cat is not None:
        from agentik_skills.tools import skill_tools

        for t in skill_tools(cat):
            register(t)


def add_routes(app: Any, agent: Any, settings: Settings) -> None:
    cat = catalogue(settings)
    if cat is not None:
        from agentik_skills.routes import add_routes

        add_routes(app, cat)


@hookimpl
def register_transports(register: Callable[..., None]) -> None:
    register("skills", add_routes)  # GET /agentik/skills, GET /agentik/skills/{name}


@hookimpl
def register_prompt_sections(register: Callable[..., None], settings: Settings) -> None:
    cat = catalogue(settings)
    if cat is not None:
        register("skills", cat.prompt_section, order=PROMPT_ORDER)


@hookimpl
def register_services(register: Callable[..., None], agent: ChatAgent, settings: Settings) -> None:
    found = miner(settings)
    if found is not None:
        register("skills", lambda: _serve(agent, found))


@contextlib.asynccontextmanager
async def _serve(agent: ChatAgent, found: SkillMiner) -> AsyncIterator[SkillMiner]:
    """Load the catalogue before requests are served (off the event loop) and mine after the
    turns of this agent while it runs."""
    await asyncio.to_thread(found.catalogue.current, True)
    agent.state["agentik_skills"] = found
    try:
        yield found
    finally:
        agent.state.pop("agentik_skills", None)


@hookimpl
def after_turn(conversation: ChatConversation) -> Awaitable[Any] | None:
    found = conversation.agent.state.get("agentik_skills")
    return None if found is None else found.after_turn(conversation)


@hookimpl
def register_debug_actions(register: Callable[..., None], settings: Settings) -> None:
    found = miner(settings)
    if found is None:
        register("skill-mine", None, off="AGENTIK_SKILLS_DIR")
        return

    async def mine(conversation: ChatConversation) -> dict[str, Any]:
        return (await found.mine(conversation)).to_json()

    register("skill-mine", mine)  # POST /debug/skill-mine: one pass now, whatever the interval


@hookimpl
def banner_lines(settings: Settings) -> list[str] | None:
    cat = catalogue(settings)
    if cat is None:
        return None
    return [f"skills: {len(cat.skills())} from {cat.root} ({len(cat.skipped())} skipped)"]


@hookimpl
def plugin_details(settings: Settings) -> dict[str, Any] | None:
    """For ``agentik plugins``: the folder, its skills and every file left out, and why."""
    found = miner(settings)
    if found is None:
        return None
    cat = found.catalogue
    return {
        "dir": str(cat.root),
        "skills": [s.name for s in cat.skills()],
        "skipped": [{"path": s.path, "reason": s.reason} for s in cat.skipped()],
        "mining": (
            f"every {found.interval} turns, reading the last {found.max_turns}"
            if found.interval
            else "off"
        ),
    }
