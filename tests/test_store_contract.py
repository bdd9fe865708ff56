"""The store contract (tests/store_contract.py) run against every store of the core."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agentik.core.db import Database
from agentik.core.store import MemoryStore, SqliteStore, Store
from tests.store_contract import *  # noqa: F403 - the contract's tests, collected here


@pytest.fixture(params=["sqlite", "memory", "postgres"])
async def contract_store(request, tmp_path) -> AsyncIterator[Store]:
    store: Store
    if request.param == "sqlite":
        store = SqliteStore(Database(str(tmp_path / "contract.db")))
    elif request.param == "memory":
        store = MemoryStore()
    else:  # the throwaway server of tests/postgres.py (skipped without PostgreSQL)
        from agentik.core.store.postgres import PgDatabase, PostgresStore

        store = PostgresStore(PgDatabase(request.getfixturevalue("postgres_url")))
    await store.open()
    yield store
    await store.close()
