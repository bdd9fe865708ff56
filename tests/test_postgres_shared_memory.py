"""The vector memory on many instances on one PostgreSQL (issue 26, item 5): the notes and their
vectors are in the database, each instance's hnswlib index is a cache caught up from it, so a
note saved through one instance is found on another within a second. Each "instance" is a store
and a memory of its own on one schema, as several processes are."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentik_memory_vector.backend import VectorMemory
from tests.fake_openai import FakeOpenAI
from tests.test_memory_vector import found, http_embedding


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    server = FakeOpenAI()
    await server.start()
    yield server
    await server.close()


@pytest.fixture
async def instances(postgres_url, fake, tmp_path):
    from agentik.core.store.postgres import PgDatabase, PostgresStore

    stack = contextlib.AsyncExitStack()

    async def start(name: str) -> VectorMemory:
        store = PostgresStore(PgDatabase(postgres_url, exclusive=False))
        await store.open()
        stack.push_async_callback(store.close)
        embedding = http_embedding(fake)
        await embedding.start()
        stack.push_async_callback(embedding.close)
        # each instance's index file is its own (instances on one host share AGENTIK_DB_PATH's
        # folder: the file is a cache, whichever saved it last)
        memory = VectorMemory(store, embedding, Path(tmp_path / f"{name}-memory.hnsw"))
        await memory.start()
        stack.push_async_callback(memory.close)
        return memory

    async with stack:
        yield start


async def eventually_found(memory: VectorMemory, query: str, text: str, within: float) -> float:
    started = time.monotonic()
    while text not in await found(memory, query):
        assert time.monotonic() - started < within, f"{text!r} not found within {within} s"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


async def test_a_note_saved_on_one_instance_is_found_on_the_others_within_a_second(instances):
    a, b, c = await instances("a"), await instances("b"), await instances("c")
    text = "The user's cat is called Murka and sleeps on the piano."
    await a.save("user", text, "test")
    for other in (b, c):
        await eventually_found(other, "what is the cat called", text, within=1.0)
        assert await other.count() == 1
    await b.save("world", "Oslo is the capital of Norway.", "test")
    await eventually_found(a, "capital of Norway", "Oslo is the capital of Norway.", within=1.0)
    await eventually_found(c, "capital of Norway", "Oslo is the capital of Norway.", within=1.0)
    assert c.describe().startswith("2 notes")  # its count follows the others' saves


async def test_a_note_deleted_on_one_instance_leaves_the_others_indexes(instances):
    a, b = await instances("a"), await instances("b")
    note = await a.save("user", "The user likes green tea without sugar.", "test")
    await eventually_found(b, "green tea", note.text, within=1.0)
    assert await a.delete(note.id)
    assert await found(b, "green tea") == []  # the database says it is gone at once
    deadline = time.monotonic() + 1.0
    while b._index is not None and b._index.labels:  # and the index drops it too
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)


async def test_an_instance_that_lost_its_notifications_catches_up_from_the_table(
    instances, postgres_server
):
    a, b = await instances("a"), await instances("b")
    # the server cuts every listening session (a restart of a proxy between them)
    postgres_server.psql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE query LIKE 'LISTEN%' AND pid <> pg_backend_pid()"
    )
    text = "The Danube flows through Vienna and Budapest."
    await a.save("world", text, "test")  # maybe while b was not listening
    await eventually_found(b, "which river flows through Vienna", text, within=5.0)
