"""Diagnosis: what the cheap fixes that docs/PERFORMANCE.md recommends would gain, measured by
patching them into agentik at run time (agentik's files are not touched) and running A/B against
the unpatched code in the same process or on the same machine.

    python bench/try_fixes.py inproc     # B3's in-process turn: item_json, noshield
    python bench/try_fixes.py server     # B8's paced broadcast and 50 tok/s streams: pending,
                                         # passthrough, sockread

Fixes (``--fix`` takes a comma list; ``serve`` runs ``agentik serve`` with some patched in):

* ``item_json``   agentik/core/store.py ``_item_json``: build the JSON field by field instead
                  of ``dataclasses.asdict`` (a recursive deep copy) per working-memory row
* ``noshield``    agentik/core/conversation.py ``_write``: no ``asyncio.shield`` (a task and
                  two loop callbacks) around a write that has no ``await`` inside
* ``pending``     agentik/core/events.py ``_pending``: take the new items from the right end of
                  the deque instead of ``islice`` from the left (O(buffer) per read)
* ``passthrough`` agentik/core/conversation.py ``event_batches``: hand the transport the event
                  log's generator instead of wrapping it in a second async generator
* ``sockread``    plugins/llm_openai/client.py: no aiohttp ``sock_read`` timeout, which
                  re-arms a timer on every network read of the model's stream (this only
                  measures that timer; a real fix keeps an idle timeout, e.g. one shared
                  watchdog)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import common
from common import CpuMeter, TurnClient, spec_text, stats

FIXES = ("item_json", "noshield", "pending", "passthrough", "sockread")


def apply(fixes: set[str]) -> None:
    """Monkeypatch the named fixes into the imported agentik modules."""
    from itertools import islice

    import agentik.core.store as store_mod
    from agentik.core.conversation import ChatConversation
    from agentik.core.events import EventLog, StreamItem
    from agentik.core.types import Gap

    if "item_json" in fixes:

        def item_json(item: Any) -> str:
            data: dict[str, Any] = {}
            if item.text:
                data["text"] = item.text
            if item.call_id:
                data["call_id"] = item.call_id
            if item.tool_name:
                data["tool_name"] = item.tool_name
            if item.args_json:
                data["args_json"] = item.args_json
            if item.extra:
                data["extra"] = item.extra
            return json.dumps(data, ensure_ascii=False)

        store_mod._item_json = item_json  # type: ignore[assignment]

    if "noshield" in fixes:

        async def write(self: Any, messages: Any = (), memory: Any = (), turn: Any = None) -> None:
            if turn is not None and turn.memory:
                memory, turn.memory = [*turn.memory, *memory], []
            await self._store.append(
                self.id, messages, memory, turn_id=turn.user.id if turn else None
            )

        ChatConversation._write = write  # type: ignore[method-assign]

    if "pending" in fixes:

        def pending(self: Any, cursor: int) -> list[Any]:
            if cursor >= self._seq:
                return []
            items = self._items
            first = items[0].seq if items else self._seq + 1
            if cursor < first - 1:
                return [StreamItem(first - 1, Gap(cursor)), *items]
            n = self._seq - cursor
            if n == 1:
                return [items[-1]]
            out = list(islice(reversed(items), n))
            out.reverse()
            return out

        EventLog._pending = pending  # type: ignore[method-assign]

    if "passthrough" in fixes:
        orig = ChatConversation.event_batches

        def event_batches(self: Any, after: Any = None, linger: float = 0.0) -> Any:
            if self._evicted:
                return orig(self, after, linger)
            return self._events.batches(after, linger)

        ChatConversation.event_batches = event_batches  # type: ignore[method-assign]

    if "sockread" in fixes:
        import aiohttp

        from agentik_llm_openai.client import OpenAIClient

        prop = OpenAIClient.session

        def session(self: Any) -> Any:
            made = self._session is None
            s = prop.fget(self)  # type: ignore[attr-defined]
            if made:
                s._timeout = aiohttp.ClientTimeout(total=None, connect=self.timeout)
            return s

        OpenAIClient.session = property(session)  # type: ignore[method-assign,assignment]


# --- in process (B3) ------------------------------------------------------------------------


async def inproc(rounds: int = 40, block: int = 50) -> None:
    from inproc import agentik_turns, open_agent

    from agentik.core import store
    from agentik.core.conversation import ChatConversation

    saved = store._item_json, ChatConversation._write

    def use(fixes: set[str]) -> None:
        store._item_json, ChatConversation._write = saved  # type: ignore[method-assign]
        apply(fixes)

    modes = {"none": set(), "item_json": {"item_json"}, "noshield": {"noshield"}}
    modes["both"] = {"item_json", "noshield"}
    for path in (":memory:", str(common.tmpdir() / "try-fixes.db")):
        agent = await open_agent(path)
        conv = await agent.create_conversation()
        await agentik_turns(conv, 50, [], [])
        cpu: dict[str, list[float]] = {m: [] for m in modes}
        for _ in range(rounds):  # fine-grained alternation: this VM drifts
            for m, fixes in modes.items():
                use(fixes)
                await agentik_turns(conv, block, cpu[m], [])
        use(set())
        await agent.close()
        base = stats(cpu["none"])["median"]
        out = ", ".join(
            f"{m} {stats(v)['median']:.0f} µs ({stats(v)['median'] - base:+.0f})"
            for m, v in cpu.items()
        )
        print(f"B3 turn CPU, {'file DB' if path != ':memory:' else ':memory:'}: {out}")


# --- a server with fixes (B7, B8) -----------------------------------------------------------


def start_patched(fake_port: int, fixes: str) -> common.Proc:
    port = common.free_port()
    env = common.agentik_env(fake_port, port)
    p = common.Proc([common.PY, __file__, "serve", "--fix", fixes], env, f"fixed-{fixes}")
    p.port = port
    common.wait_http(p, port)
    return p


async def broadcast(c: TurnClient, pid: int, cid: str, k: int, t: int, pace: float) -> int:
    subs = await asyncio.gather(*(c.open_events(cid) for _ in range(k)))
    try:
        with CpuMeter(pid) as m:
            reads = [asyncio.ensure_future(x.read_turn()) for x in subs]
            await c.post(cid, spec_text(t, delay=pace))
            await asyncio.wait_for(asyncio.gather(*reads), 60)
    finally:
        for x in subs:
            x.close()
    return m.ns


async def stream_cpu(c: TurnClient, proc: common.Proc, s: Any, n: int) -> float:
    """µs of server CPU per delivered token, ``n`` streams at 50 tok/s, 3 s window."""
    from load import StreamLoad

    load = StreamLoad("agentik", proc.port, s, n, tokens=300, ramp=1.0)
    await load.start()
    await asyncio.sleep(2.0)
    t0 = time.perf_counter()
    with CpuMeter(proc.pid) as m:
        await asyncio.sleep(3.0)
    t1 = time.perf_counter()
    await load.stop()
    return m.ns / 1e3 / max(1, load.tokens_between(t0, t1))


async def server(fixes: str, reps: int = 5) -> None:
    fake = common.start_fake()
    procs = {"none": start_patched(fake.port, "none"), fixes: start_patched(fake.port, fixes)}
    k, t, pace = 100, 200, 0.002
    try:
        async with common.session() as s:
            clients = {m: TurnClient(p.port, s) for m, p in procs.items()}
            chats = {m: await c.new_conversation() for m, c in clients.items()}
            for m, c in clients.items():  # a long chat: its event log (1,024) is full
                for _ in range(6):
                    await c.turn(spec_text(200), cid=chats[m])
            per: dict[str, list[float]] = {m: [] for m in procs}
            tok: dict[str, list[float]] = {m: [] for m in procs}
            for _ in range(reps):
                for m, p in procs.items():
                    c = clients[m]
                    big = await broadcast(c, p.pid, chats[m], k, t, pace)
                    one = await broadcast(c, p.pid, chats[m], 1, t, pace)
                    per[m].append((big - one) / ((k - 1) * t) / 1e3)
            for _ in range(max(2, reps // 2)):
                for m, p in procs.items():
                    tok[m].append(await stream_cpu(clients[m], p, s, 100))
    finally:
        common.stop_all(*procs.values(), fake)
    for label, d in (
        (f"broadcast, {k} readers of a long chat, tokens {pace * 1e3:g} ms apart, µs/frame", per),
        ("100 streams at 50 tok/s, server CPU µs/token", tok),
    ):
        out = ", ".join(f"{m} {stats(v)['median']:.2f}" for m, v in d.items())
        print(f"{label}: {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("inproc", "server", "serve"))
    parser.add_argument("--fix", default="pending,passthrough,sockread")
    args = parser.parse_args()
    fixes = {f for f in args.fix.split(",") if f and f != "none"}
    unknown = fixes - set(FIXES)
    if unknown:
        parser.error(f"unknown fixes {sorted(unknown)}; known: {', '.join(FIXES)}")
    if args.what == "serve":
        apply(fixes)
        from agentik.core.cli import main as cli_main

        sys.exit(cli_main(["serve"]))
    if args.what == "inproc":
        asyncio.run(inproc())
    else:
        asyncio.run(server(args.fix))


if __name__ == "__main__":
    main()
