"""agentik-heartbeat: a periodic job. Every ``HEARTBEAT_INTERVAL`` seconds it appends a line
(time, conversations) to ``HEARTBEAT_FILE``, for a monitor to watch; off while that is unset.
"""

import asyncio
import json
from datetime import UTC, datetime

from agentik.api import Setting, SettingPrefix, hookimpl, parse_path, parse_positive_float

STATE = "agentik_heartbeat"  # its key in agent.state: per agent, never a module global


@hookimpl
def register_settings(register):
    register(Setting("HEARTBEAT_INTERVAL", 60.0, parse_positive_float, "Seconds between beats."))
    register(Setting("HEARTBEAT_FILE", None, parse_path, "File the beats go to; unset: off."))
    register(SettingPrefix("HEARTBEAT_"))  # HEARTBEAT_INTERVL=5 gets a "did you mean" warning


def append(path, line):
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(line + "\n")


@hookimpl
def register_jobs(register, agent, settings):
    path = settings["HEARTBEAT_FILE"]
    if path is None:
        return

    async def beat():
        count = await agent.count_conversations()
        line = json.dumps({"at": datetime.now(UTC).isoformat(), "conversations": count})
        await asyncio.to_thread(append, path, line)  # file I/O off the event loop
        agent.state[STATE] = agent.state.get(STATE, 0) + 1

    register("beat", beat, interval=settings["HEARTBEAT_INTERVAL"])


@hookimpl
def banner_lines(settings):
    path = settings["HEARTBEAT_FILE"]
    if path is None:
        return ["heartbeat: off (HEARTBEAT_FILE)"]
    return [f"heartbeat: every {settings['HEARTBEAT_INTERVAL']:g} s to {path}"]
