"""The README's Python snippets run as written (issue #12, defect 11): the in-process API reads
like the example, and the agent shuts down cleanly."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def python_blocks(markdown: str) -> list[str]:
    """Every ```python block, dedented (README blocks sit inside list items)."""
    blocks = re.findall(r"^( *)```python\n(.*?)^\1```", markdown, re.S | re.M)
    return ["\n".join(line[len(indent) :] for line in body.splitlines()) for indent, body in blocks]


def test_the_readme_python_snippets_run(fake_openai_proc, tmp_path):
    blocks = python_blocks((ROOT / "README.md").read_text())
    assert blocks, "README.md has no Python example"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTIK_", "OPENAI_"))}
    env.update(
        OPENAI_BASE_URL=fake_openai_proc,
        OPENAI_API_KEY="sk-test",
        OPENAI_MODEL="fake-model",
        AGENTIK_DB_PATH=str(tmp_path / "embedded.db"),
        AGENTIK_MCP_CONFIG="off",
    )
    outputs = []
    for i, code in enumerate(blocks):
        script = tmp_path / f"readme_{i}.py"
        script.write_text(code)
        result = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60
        )
        assert result.returncode == 0, f"README block {i} failed:\n{code}\n{result.stderr}"
        assert "Traceback" not in result.stderr and "never awaited" not in result.stderr
        outputs.append(result.stdout)
    # the fake model echoes: the loop ended at End, and the turn is in the history
    assert "echo: hello\n['user', 'assistant']\n" in outputs
    # the clean shutdown checkpointed and closed the database: the turn is on disk
    import sqlite3

    with sqlite3.connect(tmp_path / "embedded.db") as db:
        kinds = [k for (k,) in db.execute("SELECT kind FROM message ORDER BY rowid")]
    assert kinds == ["user", "assistant"]


async def test_events_yields_event_objects_and_event_items_their_ids(make_agent):
    from agentik.core.events import StreamItem
    from agentik.core.types import End, TextPart

    agent = await make_agent()
    conv = await agent.create_conversation()
    events = conv.events()  # subscribed at the call, before the send
    items = conv.event_items()
    await conv.send([TextPart("hi")])
    got = []
    async for event in events:
        got.append(event)
        if isinstance(event, End):
            break
    assert [e.type for e in got] == ["UserMessage", "StartResponse", "AppendText", "End"]
    first = await items.__anext__()
    assert isinstance(first, StreamItem) and first.event == got[0]
    resumed = conv.event_items(after=first.seq)
    assert (await resumed.__anext__()).event == got[1]
    await items.aclose()
    await resumed.aclose()
