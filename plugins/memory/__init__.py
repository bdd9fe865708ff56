"""Long-term memory, whatever backend holds it (``agent.memory``, chosen by
``AGENTIK_MEMORY_BACKEND``): the ``memory_*`` tools, the ``[Memory context …]`` block before each
turn, the review that saves durable facts after a turn and before a compaction, and the
curator. A third-party backend gets all of it by implementing ``MemoryBackend``. See
``docs/memory.md``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

from agentik.core import settings as cfg
from agentik.core.memory import memory_off
from agentik.core.settings import Setting, Settings
from agentik.hookspecs import hookimpl

SETTINGS = (
    Setting(
        "AGENTIK_MEMORY_PREFETCH",
        5,
        cfg.parse_non_negative_int,
        "Notes at most in the [Memory context …] block before each turn; 0 turns prefetch off.",
    ),
    Setting(
        "AGENTIK_MEMORY_PREFETCH_CHARS",
        2000,
        cfg.parse_positive_int,
        "Characters at most of the [Memory context …] block.",
    ),
    Setting(
        "AGENTIK_MEMORY_MIN_SCORE",
        0.5,
        cfg.parse_fraction,
        "Relevance (0-1) a note needs to be prefetched; md: the share of the message's words "
        "known to the memory that the note has (three count as a full match), vector: cosine "
        "with a recency weight.",
    ),
    Setting(
        "AGENTIK_MEMORY_REVIEW",
        True,
        cfg.parse_bool,
        "1: a background model call saves the durable facts of the conversation's turns "
        "(every AGENTIK_MEMORY_REVIEW_EVERY turns and when it goes idle, once the user pauses: "
        "AGENTIK_BACKGROUND_IDLE); 0: off.",
    ),
    Setting(
        "AGENTIK_MEMORY_REVIEW_EVERY",
        4,
        cfg.parse_positive_int,
        "The review reads a conversation's turns in batches of this many (one model call per "
        "batch); 1 reviews after every turn.",
    ),
    Setting(
        "AGENTIK_MEMORY_REVIEW_IDLE",
        120.0,
        cfg.parse_positive_float,
        "Seconds without a new turn after which a conversation's turns not yet reviewed are "
        "reviewed (fewer than AGENTIK_MEMORY_REVIEW_EVERY).",
    ),
    Setting(
        "AGENTIK_MEMORY_CURATOR_INTERVAL",
        86400.0,
        cfg.parse_positive_float,
        "Seconds between the curator's passes (it archives stale notes).",
    ),
    Setting(
        "AGENTIK_MEMORY_MAX_AGE",
        90.0,
        cfg.parse_non_negative_float,
        "Days after which the curator archives a note the prefetch never used.",
    ),
)

PROMPT = (
    "You have a long-term memory that lasts across conversations. Notes relevant to the user's "
    "message come before it in a [Memory context …] block. Save what is worth remembering "
    "about the user, their preferences and their world with memory_save; find, list and "
    "delete notes with memory_read, memory_list and memory_delete."
)


def feature_of(agent: Any) -> Any:
    """The agent's :class:`~agentik_memory.feature.MemoryFeature`, None when memory is off."""
    return agent.state.get("agentik_memory")


@hookimpl
def register_settings(register: Callable[[Setting], None]) -> None:
    for setting in SETTINGS:
        register(setting)


def memory_prompt(agent: Any) -> str | None:
    """The system prompt section: said only once the memory service is up (the default backend
    may be missing, and then there are no memory tools to tell the model about)."""
    return PROMPT if feature_of(agent) is not None else None


@hookimpl
def register_prompt_sections(register: Callable[..., Any], settings: Settings) -> None:
    if not memory_off(settings):
        register("memory", memory_prompt, order=300)


@hookimpl
def register_services(register: Callable[..., None], agent: Any, settings: Settings) -> None:
    if agent.memory is not None:
        register("memory", lambda: memory_service(agent, settings))


@contextlib.asynccontextmanager
async def memory_service(agent: Any, settings: Settings) -> AsyncIterator[Any]:
    """The tools go on the agent and the hooks below find the feature (the core has started
    the backend already)."""
    from agentik_memory.feature import MemoryFeature

    feature = MemoryFeature(agent, agent.memory, settings)
    for t in feature.tools():
        agent.tools.add(t)
    agent.state["agentik_memory"] = feature
    try:
        yield feature
    finally:
        agent.state.pop("agentik_memory", None)
        feature.close()


def add_routes(app: Any, agent: Any, settings: Settings) -> None:
    if agent.memory is not None:
        from agentik_memory.routes import add_routes

        add_routes(app, agent.memory)


@hookimpl
def register_transports(register: Callable[..., None]) -> None:
    register("memory", add_routes)  # GET /agentik/memory/notes, DELETE …/notes/{id}


@hookimpl
def register_debug_actions(register: Callable[..., None], agent: Any, settings: Settings) -> None:
    if agent.memory is None:
        register("curate", None, off="AGENTIK_MEMORY_BACKEND (memory is off)")
        return
    from agentik_memory.feature import curate

    days = settings["AGENTIK_MEMORY_MAX_AGE"]

    async def run() -> dict[str, Any]:  # POST /debug/curate: the curator's pass now
        return {"archived": await curate(agent.memory, timedelta(days=days)), "maxAgeDays": days}

    register("curate", run, conversation=False)


@hookimpl
def register_jobs(register: Callable[..., None], agent: Any, settings: Settings) -> None:
    if agent.memory is None:
        return
    from agentik_memory.feature import curate

    max_age = timedelta(days=settings["AGENTIK_MEMORY_MAX_AGE"])
    register(
        "memory-curator",
        lambda: curate(agent.memory, max_age),
        interval=settings["AGENTIK_MEMORY_CURATOR_INTERVAL"],
    )


@hookimpl
def before_turn(conversation: Any, text: str) -> Any:
    feature = feature_of(conversation.agent)
    return None if feature is None else feature.prefetch(conversation.id, text)


@hookimpl
def after_turn(conversation: Any, user_text: str, assistant_text: str) -> None:
    feature = feature_of(conversation.agent)
    if feature is not None:
        feature.turn_ended(conversation.id, user_text, assistant_text)


@hookimpl
def before_compaction(conversation: Any, items: Any) -> Any:
    feature = feature_of(conversation.agent)
    return None if feature is None else feature.review_items(conversation.id, items)


@hookimpl
def banner_lines(agent: Any, settings: Settings) -> list[str]:
    if agent.memory is None:
        return ["memory: off", "curator: off (memory is off)"]
    name = settings["AGENTIK_MEMORY_BACKEND"]
    where = agent.memory.describe()
    every = _duration(settings["AGENTIK_MEMORY_CURATOR_INTERVAL"])
    days = settings["AGENTIK_MEMORY_MAX_AGE"]
    return [
        f"memory: {name}" + (f" ({where})" if where else ""),
        f"curator: on (every {every}, archives notes unused for {days:g}d)",
    ]


def _duration(seconds: float) -> str:
    """``86400`` → ``1d``, ``7200`` → ``2h``, ``90`` → ``90s``: the largest whole unit."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


@hookimpl
def plugin_details(settings: Settings) -> dict[str, Any]:
    if memory_off(settings):
        return {"memory": "off"}
    days = settings["AGENTIK_MEMORY_MAX_AGE"]
    return {
        "memory": f"on, backend {settings['AGENTIK_MEMORY_BACKEND']}",
        "prefetch": f"up to {settings['AGENTIK_MEMORY_PREFETCH']} notes, "
        f"{settings['AGENTIK_MEMORY_PREFETCH_CHARS']} chars, "
        f"min score {settings['AGENTIK_MEMORY_MIN_SCORE']:g}",
        "review": f"every {settings['AGENTIK_MEMORY_REVIEW_EVERY']} turns and after "
        f"{settings['AGENTIK_MEMORY_REVIEW_IDLE']:g} s idle"
        if settings["AGENTIK_MEMORY_REVIEW"]
        else "off",
        "curator": f"every {settings['AGENTIK_MEMORY_CURATOR_INTERVAL']:g} s, archives notes "
        f"never used after {days:g} days",
    }
