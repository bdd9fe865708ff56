"""Periodic jobs on many instances on one PostgreSQL (issue 26, item 5): each runs on one
instance at a time (a session advisory lock per job), and another takes it over when that one
stops or loses its connection. Each "instance" is an agent with a store of its own on one
schema, as several processes are."""

from __future__ import annotations

import asyncio

import pytest

from agentik.core.agent import ChatAgent
from agentik.core.testing import EchoLLM
from tests.conftest import wait_until

PERIOD = 0.1


@pytest.fixture
async def agents(postgres_url):
    from agentik.core.store.postgres import PgDatabase, PostgresStore

    opened: list[ChatAgent] = []

    async def start() -> ChatAgent:
        agent = ChatAgent(store=PostgresStore(PgDatabase(postgres_url, exclusive=False)),
                          llm=EchoLLM())  # fmt: skip
        await agent.open()
        opened.append(agent)
        return agent

    yield start
    for agent in opened:
        await agent.close()


def count_runs(agents: list[ChatAgent], runs: list[int], job: str = "curator") -> None:
    for n, agent in enumerate(agents):

        async def run(n: int = n) -> None:
            runs.append(n)

        agent.jobs.every(job, PERIOD, run, one_instance=True)


async def test_a_periodic_job_runs_once_a_period_across_instances(agents):
    three = [await agents() for _ in range(3)]
    runs: list[int] = []
    count_runs(three, runs)
    await asyncio.sleep(12 * PERIOD)
    # one instance leads it: about one run a period, not three
    assert 6 <= len(runs) <= 13, runs
    assert len(set(runs)) == 1, runs


async def test_each_job_has_its_own_lead(agents):
    a, b = await agents(), await agents()
    runs: list[int] = []
    other: list[int] = []
    count_runs([a, b], runs, "curator")
    count_runs([a, b], other, "approval-timeout")
    await wait_until(lambda: len(runs) >= 3 and len(other) >= 3)
    assert len(set(runs)) == 1 and len(set(other)) == 1  # each led by one instance


async def test_when_the_leader_stops_another_instance_runs_the_job(agents):
    three = [await agents() for _ in range(3)]
    runs: list[int] = []
    count_runs(three, runs)
    await wait_until(lambda: len(runs) >= 2)
    leader = runs[0]
    await three[leader].close()  # its session ends: the lock is free
    seen = len(runs)
    await wait_until(lambda: any(n != leader for n in runs[seen:]))
    await asyncio.sleep(5 * PERIOD)
    after = runs[seen:]
    assert leader not in after
    assert len(set(after)) == 1, after  # one new leader, not both others


async def test_a_leader_that_loses_its_connection_stops_its_run_and_another_takes_over(
    agents, postgres_server
):
    a, b = await agents(), await agents()
    started: list[int] = []
    stopped: list[int] = []
    for n, agent in enumerate((a, b)):

        async def run(n: int = n) -> None:
            started.append(n)
            try:
                await asyncio.sleep(60)  # a long pass of the curator
            except asyncio.CancelledError:
                stopped.append(n)
                raise

        agent.jobs.every("curator", PERIOD, run, one_instance=True)
    await wait_until(lambda: started)
    leader = started[0]
    # the server ends the leader's lock session (a network cut, an administrator)
    postgres_server.psql(
        "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
        "AND objsubid = 2 AND granted AND pid <> pg_backend_pid()"
    )
    await wait_until(lambda: stopped == [leader])  # it stopped its run at once
    await wait_until(lambda: 1 - leader in started)  # and the other runs it now
    assert started.count(1 - leader) == 1  # one long run at a time, not one per period


async def test_an_instances_own_upkeep_runs_on_every_instance(agents):
    a, b = await agents(), await agents()
    runs: list[int] = []
    for n, agent in enumerate((a, b)):

        async def beat(n: int = n) -> None:
            runs.append(n)

        agent.jobs.every("heartbeat", PERIOD, beat)  # not one_instance: each its own
    await wait_until(lambda: 0 in runs and 1 in runs)


async def test_on_one_process_every_job_runs_without_a_lead(tmp_path):
    from agentik.core.db import Database
    from agentik.core.store import SqliteStore

    store = SqliteStore(Database(str(tmp_path / "a.db")))
    assert store.leader() is None  # SQLite: one process, nothing to decide
    agent = ChatAgent(store=store, llm=EchoLLM())
    await agent.open()
    runs: list[int] = []
    count_runs([agent], runs)
    await wait_until(lambda: len(runs) >= 2)
    await agent.close()
