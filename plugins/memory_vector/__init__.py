"""The ``vector`` long-term memory backend: notes and their vectors in the agent's database
(``AGENTIK_DB_PATH``), found by meaning through an hnswlib index saved beside it. Its factory
takes the selected embedding backend (``AGENTIK_EMBEDDING_BACKEND``) and the agent's store from
the core. Hooks only: numpy, hnswlib and ``backend.py`` load when this backend is chosen. See
``docs/memory.md``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentik.core.memory import memory_off
from agentik.core.registry import Register
from agentik.core.settings import Settings
from agentik.hookspecs import hookimpl


def index_path(settings: Settings) -> Path | None:
    """``<AGENTIK_DB_PATH>-memory.hnsw``; None for an in-memory database (nothing saved)."""
    db = settings["AGENTIK_DB_PATH"]
    if db == ":memory:":
        return None
    path = Path(db).expanduser()
    return path.with_name(f"{path.name}-memory.hnsw")


def make_backend(settings: Settings, embedding: Any, store: Any) -> Any:
    from agentik_memory_vector.backend import VectorMemory

    return VectorMemory(store, embedding, index_path(settings))


@hookimpl
def register_memory_backends(register: Register) -> None:
    register("vector", make_backend, requires=("numpy", "hnswlib"), extra="vector")


@hookimpl
def plugin_details(settings: Settings) -> dict[str, Any] | None:
    """For ``agentik plugins``: where the notes and the index are, how many (read only)."""
    if memory_off(settings) or settings["AGENTIK_MEMORY_BACKEND"] != "vector":
        return None
    import sqlite3

    db = settings["AGENTIK_DB_PATH"]
    notes: str | int = "none yet"
    if db != ":memory:" and Path(db).expanduser().is_file():
        # read only, without starting a store: AGENTIK_DB_PATH names the SQLite store's file
        # (a store on another database would answer this through the agent)
        try:
            with sqlite3.connect(f"file:{Path(db).expanduser()}?mode=ro", uri=True) as conn:
                notes = conn.execute(
                    "SELECT COUNT(*) FROM memory_vector_note WHERE archived IS NULL"
                ).fetchone()[0]
        except sqlite3.Error:
            pass  # no table yet
    index = index_path(settings)
    return {
        "database": db,
        "notes": notes,
        "index": "in memory"
        if index is None
        else f"{index}" + ("" if index.exists() else " (built at the first start)"),
        "embeddings": f"{settings['AGENTIK_EMBEDDING_BACKEND']}"
        + (
            f" {settings['AGENTIK_EMBEDDING_MODEL']}"
            if settings["AGENTIK_EMBEDDING_BACKEND"] == "http"
            and "AGENTIK_EMBEDDING_MODEL" in settings
            else ""
        ),
    }
