"""The metrics plugin: ``GET /metrics`` after a scripted run of turns (the real openai backend
against the fake server, tool calls, a failing model) says what the run did, in the
Prometheus text format as prometheus_client's own parser reads it."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from agentik.core.app import AGENT
from agentik.core.testing import make_app, started_agent
from agentik_llm_openai.backend import OpenAIBackend
from tests.conftest import free_port
from tests.fake_openai import FakeOpenAI, Reply
from tests.sample_tools import Tools

KEY = "metrics-test-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample by (name, sorted labels)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_metrics_count_what_a_run_of_turns_did(aiohttp_client):
    fake = FakeOpenAI()
    await fake.start()
    fake.script(
        Reply(tool_calls=[("add", {"a": 1, "b": 2})], usage=(10, 2)),
        Reply("three", usage=(15, 3)),
        Reply(tool_calls=[("boom", {})], usage=(20, 1)),
        Reply("it failed", usage=(25, 2)),
        Reply(status=503, text="overloaded"),
    )
    llm = OpenAIBackend(base_url=fake.base_url, api_key="sk", model="fake-model", max_retries=0)
    app = make_app(
        llm=llm,
        plugins=[("t", Tools())],
        builtins=("agentik_transport_http", "agentik_metrics"),
        env={"AGENTIK_METRICS": "1", "AGENTIK_API_KEY": KEY},
    )
    try:
        client = await aiohttp_client(app)
        assert (await client.get("/metrics")).status == 401  # behind the key like every route
        r = await client.post("/agentik/conversations", headers=AUTH)
        cid = (await r.json())["id"]
        conv = await app[AGENT].get_conversation(cid)
        for text in ("add them", "break it", "again"):
            body = [{"type": "text", "body": text}]
            r = await client.post(f"/agentik/conversations/{cid}/messages", json=body, headers=AUTH)
            assert r.status == 202
            await conv.wait_idle()
        r = await client.get("/metrics", headers=AUTH)
        assert r.status == 200 and r.content_type == "text/plain"
        got = samples(await r.text())
    finally:
        await fake.close()

    def value(name: str, **labels: str) -> float:
        return got.get((name, tuple(sorted(labels.items()))), 0.0)

    assert value("agentik_sends_total") == 3
    assert value("agentik_turns_total", outcome="done", transport="http") == 2
    assert value("agentik_turns_total", outcome="failed", transport="http") == 1
    assert value("agentik_turn_duration_seconds_count", outcome="done") == 2
    assert value("agentik_model_calls_total", model="fake-model", outcome="ok") == 4
    assert value("agentik_model_calls_total", model="fake-model", outcome="error") == 1
    assert value("agentik_llm_errors_total", code="http_503") == 1
    assert value("agentik_tokens_total", model="fake-model", direction="input") == 70
    assert value("agentik_tokens_total", model="fake-model", direction="output") == 8
    assert value("agentik_time_to_first_token_seconds_count", model="fake-model") == 4
    assert value("agentik_tool_calls_total", tool="add", outcome="ok") == 1
    assert value("agentik_tool_calls_total", tool="boom", outcome="error") == 1
    assert value("agentik_tool_call_duration_seconds_count", tool="add") == 1
    assert value("agentik_live_conversations") == 1
    assert value("agentik_queued_sends") == 0 and value("agentik_running_turns") == 0
    assert value("agentik_open_event_streams", stream="conversation") == 0
    assert value("agentik_event_gaps_total") == 0
    assert value("agentik_storage_errors_total") == 0


async def test_metrics_on_their_own_loopback_port():
    port = free_port()
    env = {"AGENTIK_METRICS": "1", "AGENTIK_METRICS_PORT": str(port)}
    async with started_agent(env=env, builtins=("agentik_metrics",)) as agent:
        from agentik.core.testing import run_turn

        await run_turn(agent, "hello")
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as r:
            assert r.status == 200
            got = samples(await r.text())
    key = ("agentik_turns_total", (("outcome", "done"), ("transport", "in-process")))
    assert got[key] == 1


async def test_metrics_off_serve_no_route_and_observe_nothing(aiohttp_client):
    app = make_app(builtins=("agentik_transport_http", "agentik_metrics"))
    client = await aiohttp_client(app)
    assert (await client.get("/metrics")).status == 404
    assert not app[AGENT].observers


async def test_without_prometheus_client_start_up_says_what_to_install(monkeypatch):
    import sys

    import pytest

    from agentik.api import StartupError

    monkeypatch.setitem(sys.modules, "agentik_metrics.collector", None)  # the import fails
    with pytest.raises(StartupError, match=r"pip install 'agentik-runtime\[metrics\]'"):
        async with started_agent(env={"AGENTIK_METRICS": "1"}, builtins=("agentik_metrics",)):
            pass
