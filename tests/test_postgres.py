"""The PostgreSQL store beyond the store contract (tests/test_store_contract.py runs that on
it): choosing it, its start-up messages, the audit log's guard, plugin tables through peewee's
asyncio layer, and a write that outlives its cancelled caller. All on the throwaway server of
tests/postgres.py (skipped without PostgreSQL). ``make test`` also runs the A2A, turn and
``agentik serve`` modules with their agents on PostgreSQL (AGENTIK_TEST_DATABASE=postgres)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import peewee
import pytest

from agentik.core.app import StartupError, make_store
from agentik.core.models import BaseModel, for_agent
from agentik.core.store.url import parse_database_url, shown_url
from agentik.core.testing import make_app, running
from agentik.core.types import TextPart
from tests.conftest import ROOT, free_port
from tests.store_contract import conv, msg, send


def store_on(url: str):
    from agentik.core.store.postgres import PgDatabase, PostgresStore

    return PostgresStore(PgDatabase(url))


@pytest.fixture
async def store(postgres_url):
    """An opened PostgreSQL store on a fresh schema; closed after the test."""
    opened = store_on(postgres_url)
    await opened.open()
    yield opened
    await opened.close()


class Note(BaseModel):
    """A plugin's table, as plugins define theirs."""

    id = peewee.AutoField()
    key = peewee.TextField(unique=True)
    count = peewee.IntegerField(default=0)
    done = peewee.BooleanField(default=False)


def test_the_url_is_checked_and_its_password_never_shown():
    assert parse_database_url(" postgresql://a@h/db ") == "postgresql://a@h/db"
    for bad in ("mysql://h/db", "h/db", "postgresql://h:port/db"):
        with pytest.raises(ValueError):
            parse_database_url(bad)
    assert shown_url("postgresql://me:s3cret@h:5/db") == "postgresql://me:***@h:5/db"


async def test_a_bad_url_stops_start_up_naming_the_variable():
    with pytest.raises(Exception, match="AGENTIK_DATABASE_URL") as info:
        make_app(env={"AGENTIK_DATABASE_URL": "sqlite:///x.db"})
    assert "postgresql://" in str(info.value)


async def test_an_unreachable_server_stops_start_up_naming_the_variable():
    url = f"postgresql://me:s3cret@127.0.0.1:{free_port()}/agentik"
    with pytest.raises(StartupError) as info:
        async with running(make_app(env={"AGENTIK_DATABASE_URL": url})):
            pass
    text = str(info.value)
    assert "AGENTIK_DATABASE_URL=postgresql://me:***@127.0.0.1" in text and "s3cret" not in text


def test_the_driver_is_imported_only_when_the_url_names_postgresql():
    code = (
        "import sys; from agentik.core.testing import make_app; make_app(); "
        "sys.exit(any(m in sys.modules for m in ('asyncpg', 'greenlet', 'playhouse.pwasyncio')))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


async def test_the_url_selects_the_postgresql_store(postgres_url):
    from agentik.core.store.postgres import PostgresStore

    async with running(make_app(env={"AGENTIK_DATABASE_URL": postgres_url})) as agent:
        assert isinstance(agent.store, PostgresStore)
        conv_ = await agent.create_conversation()
        assert (await agent.store.get_conversation(conv_.id)) is not None
    settings = {"AGENTIK_DATABASE_URL": None, "AGENTIK_DB_PATH": ":memory:"}
    assert type(make_store(settings)).__name__ == "SqliteStore"  # type: ignore[arg-type]


async def test_the_audit_log_is_append_only(store):
    await store.create_conversation(conv())
    await send(store, "u1")
    with pytest.raises(peewee.DatabaseError, match="append-only"):
        await store.db.write(
            lambda: store.db.execute("UPDATE message SET kind = 'x' WHERE id = ?", ("u1",))
        )
    assert [m.kind for m in await store.list_messages("c1", None, 0, 5)] == ["user"]


async def test_a_plugins_peewee_table_works_and_a_unique_key_raises_peewees_error(store):
    (model,) = for_agent(Note)
    db = await store.add_models([model])
    assert db is not None
    await db.write(lambda: model.insert(key="a", count=1).execute())
    await db.write(lambda: model.update(count=model.count + 1, done=True).execute())
    row = await db.read(lambda: model.get(model.key == "a"))
    assert (row.count, row.done) == (2, True)
    with pytest.raises(peewee.IntegrityError):  # what a plugin catches on SQLite too
        await db.write(lambda: model.insert(key="a").execute())
    assert await db.read(lambda: model.select().count()) == 1  # the failed write rolled back
    assert await store.add_models([model]) is not None  # a second start finds the table


async def test_a_write_completes_though_its_caller_is_cancelled(store):
    await store.create_conversation(conv())
    writes = [
        asyncio.ensure_future(store.append("c1", [msg(f"m{i}", "assistant")])) for i in range(20)
    ]
    await asyncio.sleep(0)  # they started
    for w in writes:
        w.cancel()
    await asyncio.gather(*writes, return_exceptions=True)
    await asyncio.sleep(0.5)
    assert len(await store.list_messages("c1", None, 0, 50)) == 20
    assert await store.count_conversations() == 1  # and the pool still serves


async def test_many_requests_share_a_small_pool(postgres_url):
    from agentik.core.store.postgres import PgDatabase, PostgresStore

    store = PostgresStore(PgDatabase(postgres_url, pool_size=3))
    await store.open()
    try:
        await store.create_conversation(conv())
        await asyncio.gather(*(send(store, f"u{i}") for i in range(50)))
        counts = await asyncio.gather(*(store.count_turns("c1") for _ in range(50)))
        assert set(counts) == {50}
    finally:
        await store.close()


async def test_background_usage_adds_up(store):
    await store.add_background_usage("titles", "c1", 10, 2, False)
    await store.add_background_usage("titles", None, 5, 1, True)
    usage = (await store.background_usage())["titles"]
    assert (usage.calls, usage.input, usage.output, usage.estimated) == (2, 15, 3, 1)


async def test_only_a_durable_write_waits_for_the_servers_flush(store):
    """As on SQLite: what a client was told is stored (the send) survives the server's power
    loss; the turn's other writes survive a crash of agentik, at less cost."""

    def setting() -> str:
        return str(store.db.execute("SHOW synchronous_commit").fetchone()[0])

    assert await store.db.write(setting, durable=True) == "on"
    assert await store.db.write(setting) == "off"


async def test_a_server_restart_fails_requests_as_storage_errors_then_they_recover():
    """A request during the restart fails with peewee's OperationalError (the HTTP layer
    answers 503 storage_unavailable, retry), never the ConnectionError of a client's hang-up;
    after it the pool's dead connections are dropped and nothing stored is lost."""
    from tests.postgres import start_server

    server = start_server()
    if isinstance(server, str):
        pytest.skip(server)
    store = store_on(server.fresh_url())
    try:
        await store.open()
        await store.create_conversation(conv())
        await send(store, "u1")
        await asyncio.to_thread(server.restart)
        outcomes = []
        for i in range(5):
            try:
                await send(store, f"after{i}")
                outcomes.append("ok")
            except peewee.OperationalError:
                outcomes.append("503")
        assert outcomes[-1] == "ok" and set(outcomes) <= {"ok", "503"}, outcomes
        assert (await store.get_turn("u1")) is not None
        assert await store.count_turns("c1") == 1 + outcomes.count("ok")
        server.stop()  # and while it is down
        with pytest.raises(peewee.OperationalError):
            await store.get_conversation("c1")
    finally:
        await store.close()
        server.stop()


async def test_a_second_instance_on_the_same_schema_starts_beside_the_first(postgres_url):
    """Many instances share one schema (tests/test_postgres_instances.py): the second starts
    beside the first, each beating under an id of its own; a stopped one's conversations are
    free at once."""
    env = {"AGENTIK_DATABASE_URL": postgres_url}
    async with running(make_app(env=env)) as a, running(make_app(env=env)) as b:
        assert a.instance_id != b.instance_id
        beating = await a.store.db.read(
            lambda: a.store.db.execute("SELECT id FROM agentik_instance ORDER BY id").fetchall()
        )
        assert sorted(r[0] for r in beating) == sorted([a.instance_id, b.instance_id])
        conv_ = await a.create_conversation()
        await conv_.send([TextPart("hi")])
        await conv_.wait_idle()
        assert a.ownership.owns(conv_.id)
    async with running(make_app(env=env)) as c:  # A's lease went with its stop
        assert await c.ownership.take(conv_.id)


async def test_a_start_on_an_existing_schema_locks_none_of_its_tables(postgres_url):
    """An instance starting while others write: its schema step creates only what is missing,
    so it neither waits for their transactions nor makes them wait (CREATE INDEX IF NOT EXISTS
    at every start held the tables' locks together and deadlocked with running turns)."""
    import asyncpg

    from agentik.core.store.pg_events import PgEvents

    first = store_on(postgres_url)
    await first.open()
    (model,) = for_agent(Note)
    await first.add_models([model])
    await PgEvents(first.db, "first").start(lambda _stream: None)
    writer = await asyncpg.connect(postgres_url)  # its search_path: the test's schema
    try:
        # a turn's write under way on another instance: its tables' ROW EXCLUSIVE locks held
        tables = "message, turn, working_memory, conversation, agentik_event, "
        tables += model._meta.table_name
        await writer.execute(f"BEGIN; LOCK TABLE {tables} IN ROW EXCLUSIVE MODE")
        second = store_on(postgres_url)
        await asyncio.wait_for(second.open(), 10)  # blocked for good before
        await asyncio.wait_for(second.add_models([model]), 10)
        await asyncio.wait_for(PgEvents(second.db, "second").start(lambda _stream: None), 10)
        await second.close()
    finally:
        await writer.close()
        await first.close()


async def test_notifications_reach_every_listener_of_the_schema_and_survive_a_restart():
    """Instances tell each other through the server: a notification reaches each listener on
    the same schema (not another schema's); after the server restarts, the listener is opened
    again and told it may have missed some (caught_up), and hears the next ones."""
    from tests.postgres import start_server

    server = start_server()
    if isinstance(server, str):
        pytest.skip(server)
    url = server.fresh_url()
    a, b, other = store_on(url), store_on(url), store_on(server.fresh_url())
    a.db.exclusive = b.db.exclusive = False
    heard: dict[str, list[str]] = {"a": [], "b": [], "other": []}
    caught_up = {name: asyncio.Event() for name in heard}
    try:
        for name, store in (("a", a), ("b", b), ("other", other)):
            await store.open()
            await store.db.listen("wake", heard[name].append, caught_up[name].set)
        await a.db.notify("wake", "c1")
        for _ in range(50):
            if heard["a"] and heard["b"]:
                break
            await asyncio.sleep(0.02)
        assert heard == {"a": ["c1"], "b": ["c1"], "other": []}
        await asyncio.to_thread(server.restart)
        for event in caught_up.values():  # each listens again
            await asyncio.wait_for(event.wait(), 10)
        for _ in range(100):  # the pool drops the connections the restart closed
            try:
                await a.db.notify("wake", "c2")
                break
            except peewee.OperationalError:
                await asyncio.sleep(0.1)
        for _ in range(50):
            if "c2" in heard["b"]:
                break
            await asyncio.sleep(0.02)
        assert heard["b"][-1] == "c2" and heard["other"] == []
    finally:
        for store in (a, b, other):
            await store.close()
        server.stop()
