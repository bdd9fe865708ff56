"""Semantic memory: the embedding contract in the core, the ``http`` embedding backend and the
``vector`` memory backend (SQLite + hnswlib), on real SQLite files and the fake OpenAI server's
``/embeddings`` (hashed bags of words: texts sharing words are close)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import numpy
import pytest

import agentik_embedding_http
import agentik_memory
import agentik_memory_md
import agentik_memory_vector
from agentik.core.app import StartupError
from agentik.core.db import Database
from agentik.core.embedding import EmbeddingBackend, EmbeddingError
from agentik.core.store import SqliteStore
from agentik.core.testing import EchoLLM, make_app, run_turn, started_agent
from agentik.hookspecs import hookimpl
from agentik_embedding_http.backend import HttpEmbedding
from agentik_memory.feature import BLOCK_START
from agentik_memory_vector import index as ann
from agentik_memory_vector.backend import VectorMemory, score
from tests.conftest import BIN, ROOT, script_fake
from tests.fake_openai import FakeOpenAI, embed_text
from tests.test_memory_e2e import say, turn_inputs
from tests.test_serve import new_conversation, openai_env

DIM = 256
FACTS = [
    ("user", "The user's cat is called Murka and sleeps on the piano."),
    ("world", "Oslo is the capital of Norway."),
    ("preference", "The user likes green tea without sugar."),
    ("user", "The user works as a nurse in a hospital at night."),
    ("world", "The Danube flows through Vienna and Budapest."),
]


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    server = FakeOpenAI()
    await server.start()
    yield server
    await server.close()


def http_embedding(fake: FakeOpenAI, dimension: int = DIM, **kw: Any) -> HttpEmbedding:
    return HttpEmbedding(
        base_url=fake.base_url,
        api_key="sk-test",
        model=kw.pop("model", "text-embedding-3-small"),
        dimension=dimension,
        **{"max_retries": 0, "timeout": 5.0, **kw},
    )


@contextlib.asynccontextmanager
async def vector_memory(
    path: Path, fake: FakeOpenAI, dimension: int = DIM, crash: bool = False
) -> AsyncIterator[VectorMemory]:
    """A vector memory on the SQLite file ``path``; ``crash``: the index is not saved on exit
    (as when the process is killed), the database is."""
    store = SqliteStore(Database(str(path)))
    await store.open()
    embedding = http_embedding(fake, dimension)
    await embedding.start()
    memory = VectorMemory(store, embedding, path.with_name(path.name + "-memory.hnsw"))
    try:
        await memory.start()
        yield memory
    finally:
        if not crash:
            await memory.close()
        await embedding.close()
        await store.close()


async def found(memory: VectorMemory, query: str, limit: int = 3) -> list[str]:
    return [n.text for n in await memory.search(query, limit)]


# --- the embedding contract in the core ---------------------------------------------------


class CountingEmbedding(EmbeddingBackend):
    model = "counting-1"

    def __init__(self) -> None:
        self.events: list[str] = []

    @property
    def dimension(self) -> int:
        return 8

    async def start(self) -> None:
        self.events.append("start")

    async def close(self) -> None:
        self.events.append("close")

    async def embed(self, texts: Sequence[str]) -> numpy.ndarray:
        return numpy.ones((len(texts), 8), dtype=numpy.float32)


class ThirdParty:
    """A third-party embedding backend and a memory factory that asks for it."""

    def __init__(self) -> None:
        self.embedding = CountingEmbedding()
        self.made: dict[str, Any] = {}

    @hookimpl
    def register_embedding_backends(self, register: Any) -> None:
        register("counting", lambda settings: self.embedding)

    @hookimpl
    def register_memory_backends(self, register: Any) -> None:
        def make(settings: Any, embedding: Any, store: Any) -> Any:
            self.made = {"embedding": embedding, "store": store}
            return agentik_memory_md.make_backend(settings)

        register("wants-embedding", make)


async def test_a_memory_factory_gets_the_selected_started_embedding_backend(tmp_path):
    plugin = ThirdParty()
    env = {
        "AGENTIK_MEMORY_BACKEND": "wants-embedding",
        "AGENTIK_EMBEDDING_BACKEND": "counting",
        "AGENTIK_MEMORY_DIR": str(tmp_path / "mem"),
    }
    plugins = [("third", plugin), ("agentik_memory_md", agentik_memory_md)]
    async with started_agent(plugins=plugins, env=env) as agent:
        assert plugin.made == {"embedding": plugin.embedding, "store": agent.store}
        assert agent.embedding is plugin.embedding and plugin.embedding.name == "counting"
        assert plugin.embedding.events == ["start"]  # started before requests
    assert plugin.embedding.events == ["start", "close"]


async def test_no_embedding_backend_is_built_for_a_memory_that_takes_none(tmp_path):
    plugin = ThirdParty()
    env = {"AGENTIK_MEMORY_BACKEND": "md", "AGENTIK_MEMORY_DIR": str(tmp_path / "mem"),
           "AGENTIK_EMBEDDING_BACKEND": "no-such-thing"}  # fmt: skip
    plugins = [("third", plugin), ("agentik_memory_md", agentik_memory_md)]
    async with started_agent(plugins=plugins, env=env) as agent:
        assert agent.embedding is None and plugin.embedding.events == []


def test_an_unknown_embedding_backend_stops_start_up_listing_the_names(tmp_path):
    plugins = [("third", ThirdParty()), ("agentik_embedding_http", agentik_embedding_http),
               ("agentik_memory_vector", agentik_memory_vector)]  # fmt: skip
    env = {"AGENTIK_MEMORY_BACKEND": "vector", "AGENTIK_EMBEDDING_BACKEND": "nope"}
    with pytest.raises(StartupError) as info:
        make_app(plugins=plugins, env=env)
    assert str(info.value) == (
        "AGENTIK_EMBEDDING_BACKEND='nope': unknown embedding backend; available: counting, http"
    )
    env["AGENTIK_EMBEDDING_BACKEND"] = "http"  # without OPENAI_API_KEY
    with pytest.raises(StartupError, match=r"^OPENAI_API_KEY must be set"):
        make_app(plugins=plugins, env=env)


# --- the http embedding backend -------------------------------------------------------------


async def test_http_embeddings_are_batched_cached_and_match_the_server(fake):
    embedding = http_embedding(fake)
    await embedding.start()
    try:
        texts = ["green tea", "black coffee", "green tea", "a cat"]
        vectors = await embedding.embed(texts)
        assert vectors.dtype == numpy.float32 and vectors.shape == (4, DIM)
        assert numpy.allclose(vectors[1], embed_text("black coffee", DIM))
        assert numpy.array_equal(vectors[0], vectors[2])
        # one request, each distinct text once, with the dimension asked for
        [body] = fake.embedding_requests
        assert body == {"model": "text-embedding-3-small", "input": texts[:2] + texts[3:],
                        "dimensions": DIM}  # fmt: skip
        again = await embedding.embed(["a cat", "green tea"])  # from the LRU cache
        assert len(fake.embedding_requests) == 1 and numpy.array_equal(again[0], vectors[3])
        assert (await embedding.embed([])).shape == (0, DIM)
    finally:
        await embedding.close()


async def test_dimensions_is_sent_only_to_models_that_take_it(fake):
    embedding = http_embedding(fake, EMBEDDING := 1536, model="nomic-embed-text")
    try:
        assert (await embedding.embed(["hello world"])).shape == (1, EMBEDDING)
        assert "dimensions" not in fake.embedding_requests[-1]
    finally:
        await embedding.close()


async def test_http_embedding_errors_are_one_clear_sentence(fake):
    embedding = http_embedding(fake)
    try:
        fake.embedding_faults.append("short")
        with pytest.raises(EmbeddingError) as info:
            await embedding.embed(["x marks the spot"])
        assert str(info.value) == (
            "the embedding model text-embedding-3-small answered vectors of length 255, not "
            "AGENTIK_EMBEDDING_DIMENSION=256; set it to the model's dimension"
        )
        fake.embedding_faults.append(500)
        with pytest.raises(EmbeddingError) as info:
            await embedding.embed(["one"])
        assert str(info.value) == (
            "the embedding server failed (HTTP 500): "
            "The server had an error while processing your request."
        )
    finally:
        await embedding.close()
    down = HttpEmbedding(base_url="http://127.0.0.1:9/v1", api_key="k",
                         model="m", dimension=4, max_retries=0)  # fmt: skip
    with pytest.raises(EmbeddingError, match=r"^could not connect to the embedding server at"):
        await down.embed(["x"])
    await down.close()


async def test_http_embeddings_retry_a_429_like_the_llm_client(fake, monkeypatch):
    from agentik_llm_openai import client

    monkeypatch.setattr(client, "retry_delay", lambda retry, after: 0.0)
    embedding = http_embedding(fake, max_retries=2)
    try:
        fake.embedding_faults.extend([429, 503])
        vectors = await embedding.embed(["retried text"])
        assert len(fake.embedding_requests) == 3
        assert numpy.allclose(vectors[0], embed_text("retried text", DIM))
    finally:
        await embedding.close()


# --- the vector backend -----------------------------------------------------------------------


async def test_notes_are_found_by_meaning_and_survive_a_restart(tmp_path, fake):
    db = tmp_path / "agent.db"
    async with vector_memory(db, fake) as memory:
        saved = [await memory.save(c, t, "USER") for c, t in FACTS]
        assert memory.describe() == "5 notes, dim 256, embeddings: http text-embedding-3-small"
        first = await found(memory, "What is my cat called?")
        assert first[0] == FACTS[0][1]
        assert await memory.get(saved[1].id) == saved[1]
        assert [n.id for n in await memory.list("world")] == [saved[1].id, saved[4].id]
    assert (tmp_path / "agent.db-memory.hnsw").is_file()
    async with vector_memory(db, fake) as memory:
        assert await memory.count() == 5
        assert await found(memory, "What is my cat called?") == first
        [best] = await memory.search("Which river flows through Vienna?", 1)
        assert best.text == FACTS[4][1] and 0.3 < best.score <= 1


async def test_deletes_and_archives_leave_the_index_and_the_count(tmp_path, fake):
    async with vector_memory(tmp_path / "a.db", fake) as memory:
        notes = [await memory.save(c, t, "USER") for c, t in FACTS]
        assert await memory.delete(notes[0].id) and not await memory.delete(notes[0].id)
        assert await memory.delete(notes[2].id, recoverable=False)
        assert FACTS[0][1] not in await found(memory, "cat called Murka")
        await memory.mark_used([notes[1].id])
        from datetime import timedelta

        assert await memory.archive_stale(timedelta(0)) == 2  # never used: nurse, Danube
        assert await memory.count() == 1 and await memory.get(notes[3].id) is None
        assert await found(memory, "Danube Vienna Budapest") == []
        assert await found(memory, "capital of Norway") == [FACTS[1][1]]


async def test_the_index_is_rebuilt_when_deleted_or_corrupt(tmp_path, fake, caplog):
    caplog.set_level(logging.INFO, logger="agentik.memory")
    db, index = tmp_path / "agent.db", tmp_path / "agent.db-memory.hnsw"
    async with vector_memory(db, fake) as memory:
        for c, t in FACTS:
            await memory.save(c, t, "USER")
        before = await found(memory, "green tea nurse hospital", 5)
    index.unlink()
    async with vector_memory(db, fake) as memory:
        assert await found(memory, "green tea nurse hospital", 5) == before
    assert "memory index rebuilt: 5 notes" in caplog.text
    caplog.clear()
    data = bytearray(index.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = os.urandom(64)
    index.write_bytes(bytes(data))
    async with vector_memory(db, fake) as memory:
        assert await found(memory, "green tea nurse hospital", 5) == before
    assert "is unusable (the file is not the one saved" in caplog.text
    assert "memory index rebuilt: 5 notes" in caplog.text
    index.write_bytes(b"not an index at all")
    (tmp_path / "agent.db-memory.hnsw.json").write_text("{")
    async with vector_memory(db, fake) as memory:
        assert await found(memory, "green tea nurse hospital", 5) == before


async def test_a_stale_index_catches_up_never_losing_nor_resurrecting_a_note(tmp_path, fake):
    db = tmp_path / "agent.db"
    async with vector_memory(db, fake) as memory:  # the index is saved with both notes
        kept = await memory.save(*FACTS[0], "USER")
        gone = await memory.save(*FACTS[2], "USER")
    async with vector_memory(db, fake, crash=True) as memory:  # the index is never saved
        assert await memory.delete(gone.id)
        late = await memory.save(*FACTS[4], "USER")
    async with vector_memory(db, fake) as memory:
        assert await found(memory, "green tea without sugar") == []
        assert await found(memory, "Danube Vienna") == [FACTS[4][1]]
        assert await found(memory, "cat Murka piano") == [FACTS[0][1]]
        assert {n.id for n in await memory.list("user")} == {kept.id}
        assert (await memory.get(late.id)).text == FACTS[4][1]


async def test_the_index_grows_without_a_rebuild(monkeypatch):
    monkeypatch.setattr(ann, "MIN_CAPACITY", 4)
    index = ann.AnnIndex(DIM, None)
    vectors = numpy.asarray([embed_text(f"note number {i} word{i}", DIM) for i in range(20)],
                            dtype=numpy.float32)  # fmt: skip
    graph = index.index
    for i in range(20):
        index.add([i + 1], vectors[i : i + 1])
    assert index.index is graph and graph.get_max_elements() >= 20
    [(label, cosine)] = index.query(vectors[7], 1)
    assert label == 8 and cosine == pytest.approx(1.0, abs=1e-5)


async def test_a_dimension_mismatch_stops_start_up_with_one_line(tmp_path, fake):
    db = tmp_path / "agent.db"
    async with vector_memory(db, fake, dimension=DIM) as memory:
        await memory.save(*FACTS[0], "USER")
    with pytest.raises(StartupError) as info:
        async with vector_memory(db, fake, dimension=128):
            pass
    message = str(info.value)
    assert "\n" not in message and message == (
        f"AGENTIK_EMBEDDING_BACKEND='http': the vector memory in {db} holds 1 notes of "
        "dimension 256 (embedded by http text-embedding-3-small), but http "
        "text-embedding-3-small gives 128; use that embedding model again "
        "(AGENTIK_EMBEDDING_MODEL, AGENTIK_EMBEDDING_DIMENSION) or another AGENTIK_DB_PATH"
    )


async def test_a_dimension_mismatch_names_the_variables_of_the_backend_in_use(tmp_path):
    """Issue #28 (12): it named the http backend's variables whatever backend was in use."""

    class Sized(EmbeddingBackend):
        name, model = "mine", "mine-v1"

        def __init__(self, dim: int) -> None:
            self.dim = dim

        @property
        def dimension(self) -> int:
            return self.dim

        async def embed(self, texts: Sequence[str]) -> numpy.ndarray:
            return numpy.ones((len(texts), self.dim), dtype=numpy.float32)

    db = tmp_path / "agent.db"

    async def start(dim: int) -> None:
        store = SqliteStore(Database(str(db)))
        await store.open()
        memory = VectorMemory(store, Sized(dim), None)
        try:
            await memory.start()
            await memory.save("user", "The user's dog is Bruno.", "USER")
            await memory.close()
        finally:
            await store.close()

    await start(8)
    with pytest.raises(StartupError) as info:
        await start(16)
    message = str(info.value)
    assert (
        message.startswith("AGENTIK_EMBEDDING_BACKEND='mine': ")
        and "AGENTIK_EMBEDDING_MODEL" not in message
    )
    assert "(the settings of the 'mine' embedding backend, see `agentik plugins`)" in message


def test_the_recency_weight():
    from datetime import timedelta

    assert score(0.8, timedelta(0)) == pytest.approx(0.8)
    assert score(0.8, timedelta(days=30)) == pytest.approx(0.8 * 0.95)
    assert score(0.8, timedelta(days=3650)) == pytest.approx(0.8 * 0.9)
    assert score(0.81, timedelta(days=365)) < score(0.8, timedelta(0))  # near equal: fresh wins
    assert score(0.9, timedelta(days=365)) > score(0.8, timedelta(0))  # else meaning wins


# --- failures: a turn never fails because memory could not be searched ------------------------


async def test_an_embedding_outage_is_a_tool_error_and_one_log_line(tmp_path, fake, caplog):
    caplog.set_level(logging.INFO, logger="agentik.memory")
    env = {"AGENTIK_MEMORY_BACKEND": "vector", "AGENTIK_MEMORY_REVIEW": "0",
           "AGENTIK_DB_PATH": str(tmp_path / "a.db"), "OPENAI_BASE_URL": fake.base_url,
           "OPENAI_API_KEY": "k", "OPENAI_MAX_RETRIES": "0"}  # fmt: skip
    plugins = [("agentik_memory", agentik_memory), ("agentik_memory_vector", agentik_memory_vector),
               ("agentik_embedding_http", agentik_embedding_http)]  # fmt: skip
    async with started_agent(llm=EchoLLM(), plugins=plugins, env=env) as agent:
        await agent.memory.save(*FACTS[2], "USER")
        fake.embedding_mode = 500
        text, error = await agent.tools.invoke(
            "memory_save", json.dumps({"category": "user", "text": "The user is 40."})
        )
        assert error and text.startswith(
            "Error: memory search failed: the embedding server failed (HTTP 500)"
        )
        text, error = await agent.tools.invoke("memory_read", json.dumps({"query": "tea"}))
        assert error and "the embedding server failed (HTTP 500)" in text
        for words in ("Do I like green tea?", "Any sugar in my tea?"):
            turn = await run_turn(agent, words)
            assert turn.types[-1] == "End" and turn.text == f"echo: {words}"  # no memory
        assert caplog.text.count("memory prefetch is off until search works again") == 1
        fake.embedding_mode = None
        turn = await run_turn(agent, "Do I like green tea with sugar?")
        assert "memory prefetch works again" in caplog.text
        assert turn.text.startswith(f"echo: {BLOCK_START}")


# --- end to end: agentik serve --------------------------------------------------------------


def vector_env(fake: str, db: Path, **extra: str) -> dict[str, str]:
    memory = {"AGENTIK_MEMORY_BACKEND": "vector", "AGENTIK_DB_PATH": str(db),
              "AGENTIK_EMBEDDING_DIMENSION": "256", "AGENTIK_MEMORY_REVIEW": "0"}  # fmt: skip
    return openai_env(fake, **{**memory, **extra})


NOTE = {"category": "preference", "text": "The user likes green tea without sugar."}


async def test_a_note_saved_in_one_conversation_is_recalled_in_another_after_a_restart(
    serve, fake_openai_proc, tmp_path
):
    db = tmp_path / "agent.db"
    proc, base = serve(vector_env(fake_openai_proc, db))
    banner = proc.wait_output("memory: vector (")
    assert "memory: vector (0 notes, dim 256, embeddings: http text-embedding-3-small)" in banner
    await script_fake(fake_openai_proc, {"tool_calls": [["memory_save", NOTE]]}, {"text": "Noted."})
    async with aiohttp.ClientSession() as s:
        a = await new_conversation(s, base)
        items = await say(s, base, a, "Remember: green tea, never sugar.")
        assert items[2]["text"].startswith("Saved as ")
        b = await new_conversation(s, base)
        await say(s, base, b, "Do I like green tea with sugar?")
        seen = (await turn_inputs(s, fake_openai_proc))[-1]
        assert seen.startswith("[Memory context") and f"- (preference) {NOTE['text']}" in seen
    proc.stop()
    proc, base = serve(vector_env(fake_openai_proc, db))
    assert "memory: vector (1 notes, dim 256" in proc.wait_output("memory: vector (")
    async with aiohttp.ClientSession() as s:
        await say(s, base, await new_conversation(s, base), "Green tea, no sugar, for me")
        assert NOTE["text"] in (await turn_inputs(s, fake_openai_proc))[-1]
    proc.stop()
    # another dimension: one line naming the variable, exit 2
    proc, _ = serve(vector_env(fake_openai_proc, db, AGENTIK_EMBEDDING_DIMENSION="128"), wait=False)
    assert proc.proc.wait(30) == 2
    assert "holds 1 notes of dimension 256" in proc.output and "Traceback" not in proc.output


SAVER = """
import asyncio, sys
from pathlib import Path
from agentik.core.db import Database
from agentik.core.store import SqliteStore
from agentik_embedding_http.backend import HttpEmbedding
from agentik_memory_vector.backend import VectorMemory

async def main(db, url):
    store = SqliteStore(Database(db))
    await store.open()
    embedding = HttpEmbedding(base_url=url, api_key="k", model="text-embedding-3-small",
                              dimension=256)
    memory = VectorMemory(store, embedding, Path(db + "-memory.hnsw"))
    await memory.start()
    for i in range(100000):
        note = await memory.save("world", f"Fact number {i:05d} is kept.", "AGENT")
        print("saved", i, note.id, flush=True)
        if i % 3 == 0:
            await memory.delete(note.id)
            print("deleted", i, note.id, flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def test_kill_9_during_saves_loses_no_note_and_resurrects_none(tmp_path, fake):
    db = tmp_path / "agent.db"
    async with vector_memory(db, fake) as memory:  # a saved index to go stale
        await memory.save("world", "A note from before.", "USER")
    script = tmp_path / "saver.py"
    script.write_text(SAVER)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), str(db), fake.base_url, stdout=subprocess.PIPE, cwd=ROOT
    )
    assert proc.stdout is not None
    lines: list[list[str]] = []
    while len(lines) < 60:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line, "the saver died"
        lines.append(line.decode().split())
    proc.send_signal(signal.SIGKILL)  # kill -9, in the middle of its saves and deletes
    await proc.wait()
    saved = {i: nid for kind, i, nid in lines if kind == "saved"}
    deleted = {i for kind, i, _ in lines if kind == "deleted"}
    async with vector_memory(db, fake) as memory:
        for i, note_id in saved.items():
            hits = [n.id for n in await memory.search(f"{int(i):05d}", 3)]
            if i in deleted:
                assert note_id not in hits and await memory.get(note_id) is None
            else:
                assert note_id in hits and (await memory.get(note_id)) is not None


def test_agentik_plugins_shows_the_vector_memory(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTIK_", "OPENAI_"))}
    env.update(AGENTIK_MEMORY_BACKEND="vector", AGENTIK_DB_PATH=str(tmp_path / "a.db"))
    out = subprocess.run(
        [str(BIN / "agentik"), "plugins", "--json"], capture_output=True, text=True, env=env
    )
    report = {p["name"]: p for p in json.loads(out.stdout)["plugins"]}
    assert report["agentik_memory_vector"]["details"] == {
        "database": str(tmp_path / "a.db"),
        "notes": "none yet",
        "index": f"{tmp_path / 'a.db-memory.hnsw'} (built at the first start)",
        "embeddings": "http text-embedding-3-small",
    }
    [http] = report["agentik_embedding_http"]["backends"]
    assert http["name"] == "http" and http["kind"] == "embedding" and http["selected"]
