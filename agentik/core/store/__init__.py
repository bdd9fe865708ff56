"""Where conversations live: the contract (:mod:`.base`), SQLite (:mod:`.sqlite`, the default)
and memory (:mod:`.memory`, temporary conversations)."""

from agentik.core.records import utcnow
from agentik.core.store.base import FeatureUsage, MemoryRow, Store, TokenStats
from agentik.core.store.memory import MemoryStore
from agentik.core.store.sqlite import SqliteStore

__all__ = [
    "FeatureUsage",
    "MemoryRow",
    "MemoryStore",
    "SqliteStore",
    "Store",
    "TokenStats",
    "utcnow",
]
