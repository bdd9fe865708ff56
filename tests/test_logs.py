"""AGENTIK_LOG_FORMAT=json: the real ``agentik serve`` logs one JSON object per line, with the
running turn's ids on the lines logged inside a turn."""

from __future__ import annotations

import json
import logging
import sys

import aiohttp

from agentik.core.logs import JsonFormatter
from agentik.core.observe import TurnScope, turn_scope
from tests.conftest import read_sse, script_fake
from tests.test_serve import new_conversation, openai_env, post_message


def json_lines(output: str) -> list[dict]:
    # the start-up banner is printed on stdout, which the test's log file shares
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


async def test_serve_logs_json_lines_with_the_turn_ids(serve, fake_openai_proc):
    proc, base = serve(openai_env(fake_openai_proc, AGENTIK_LOG_FORMAT="json"))
    await script_fake(fake_openai_proc, {"status": 503, "text": "overloaded"})
    async with aiohttp.ClientSession() as s:
        cid = await new_conversation(s, base)
        events = await s.get(f"{base}/agentik/conversations/{cid}/events")
        sent = await post_message(s, base, cid)
        frames = await read_sse(events)
        events.close()
    assert frames[-2]["event"] == "Error"
    lines = json_lines(proc.output)
    assert lines, proc.output
    for line in lines:
        assert {"time", "level", "logger", "message"} <= line.keys()
    upstream = [line for line in lines if "answered HTTP 503" in line["message"]]
    assert upstream, proc.output
    assert upstream[0]["level"] == "WARNING"
    assert upstream[0]["logger"] == "agentik_llm_openai.client"
    assert upstream[0]["conversation_id"] == cid
    assert upstream[0]["turn_id"] == sent["id"]
    assert "trace_id" not in upstream[0]  # no tracing plugin is on
    # lines outside a turn (start-up) carry no turn
    assert all(
        "turn_id" not in line
        for line in lines
        if line is not upstream[0] and "503" not in line["message"]
    )


def test_the_formatter_adds_the_scope_and_the_exception():
    formatter = JsonFormatter()
    try:
        raise ValueError("bad")
    except ValueError:
        record = logging.LogRecord(
            "x", logging.ERROR, __file__, 1, "failed %s", ("it",), sys.exc_info()
        )
    token = turn_scope.set(TurnScope("conv_1", "msg_1", "http", "ab" * 16))
    try:
        line = json.loads(formatter.format(record))
    finally:
        turn_scope.reset(token)
    assert line["message"] == "failed it" and line["level"] == "ERROR"
    assert (line["conversation_id"], line["turn_id"], line["trace_id"]) == (
        "conv_1",
        "msg_1",
        "ab" * 16,
    )
    assert "ValueError: bad" in line["exception"]
    assert line["time"].endswith("+00:00")
