"""The turn as durable state (F19), in-process on real SQLite files: its states and moves, a turn
that waits (holding no task) and goes on when answered, and a turn taken up after its process
stopped. The same across real process kills: tests/test_turns_e2e.py."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from agentik import hookimpl
from agentik.core.inbox import NotWaiting
from agentik.core.llm import LLMError, ToolCallRequest
from agentik.core.plugins import Plugins
from agentik.core.progress import Progress
from agentik.core.records import utcnow
from agentik.core.testing import ScriptedLLM
from agentik.core.tool_steps import CUT_CALL
from agentik.core.tools import tool
from agentik.core.turns import TurnRecord, TurnState, TurnStateError, Wait, check_move
from agentik.core.types import Message, TextPart, UnknownReference
from tests.conftest import ON_POSTGRES, collect_turn

Q, R, W, D, F, C = (TurnState.QUEUED, TurnState.RUNNING, TurnState.WAITING, TurnState.DONE,
                    TurnState.FAILED, TurnState.CANCELLED)  # fmt: skip
# every move a turn can make, written out apart from the module that enforces them
MOVES = {
    (Q, R), (Q, W), (Q, D), (Q, F), (Q, C),
    (R, R), (R, W), (R, D), (R, F), (R, C),
    (W, W), (W, R), (W, F), (W, C),
}  # fmt: skip


@pytest.mark.parametrize(("old", "new"), list(itertools.product(TurnState, TurnState)))
def test_each_move_between_turn_states_is_allowed_or_refused(old, new):
    if (old, new) in MOVES:
        check_move(old, new)
    else:
        with pytest.raises(TurnStateError, match=f"from {old} to {new}"):
            check_move(old, new)


def text(body: str) -> list[TextPart]:
    return [TextPart(body)]


class Gate:
    """Holds every call of the tools named in ``held`` until answered."""

    def __init__(self, *held: str) -> None:
        self.held = set(held)

    @hookimpl
    def tool_call_gate(self, call):
        if call.name in self.held:
            return Wait("", "check", {"tool": call.name, "argsJson": call.args_json})
        return None


def hooks(*plugins) -> object:
    manager = Plugins()
    for i, plugin in enumerate(plugins):
        manager.pm.register(plugin, name=f"test-{i}")
    return manager.pm.hook


def counting_tools(ran: list[str]):
    @tool
    def launch(target: str) -> str:
        ran.append(f"launch {target}")
        return f"launched at {target}"

    @tool(idempotent=True)
    def look(target: str) -> str:
        ran.append(f"look {target}")
        return f"{target} looks fine"

    return [launch, look]


def call(call_id: str, name: str, target: str) -> ToolCallRequest:
    return ToolCallRequest(call_id, name, f'{{"target": "{target}"}}')


async def history(conv) -> list[tuple[str, str]]:
    out = []
    for m in await conv.get_messages(None, 0, 100):
        p = m.payload
        field = {"assistant": "text", "tool_call": "callId", "tool_result": "text"}
        detail = p["content"][0]["body"] if m.kind == "user" else p.get(field.get(m.kind, "code"))
        out.append((m.kind, detail))
    return out


async def test_a_waiting_turn_holds_no_task_and_goes_on_when_answered(make_agent):
    ran: list[str] = []
    llm = ScriptedLLM([call("c1", "launch", "moon")], ["landed"])
    agent = await make_agent(llm, tools=counting_tools(ran), hooks=hooks(Gate("launch")))
    conv = await agent.create_conversation()
    events = asyncio.ensure_future(collect_turn(conv))
    user = await conv.send(text("go"))
    await conv.wait_idle()  # returns: nothing runs while the turn waits
    turn = await conv.turn(user.id)
    assert turn.state is TurnState.WAITING and turn.step == 1 and ran == []
    assert not conv.inbox.running and conv.runner.task is None and conv.busy
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("turn")]
    # what it waits for, and the recorded step
    assert [(w.call_id, w.request["tool"], w.answered) for w in turn.waits] == [
        ("c1", "launch", False)
    ]
    assert await history(conv) == [("user", "go"), ("tool_call", "c1")]
    assert not events.done()  # no End while it waits
    await conv.resume_turn(user.id, "c1", {"approve": True})
    got = await events
    assert [e.type for e in got] == ["UserMessage", "ToolCall", "Waiting", "ToolResult",
                                     "StartResponse", "AppendText", "End"]  # fmt: skip
    assert got[2].waits == (turn.waits[0].to_json(),)  # what it waited for, on the stream
    assert ran == ["launch moon"]
    assert await history(conv) == [
        ("user", "go"),
        ("tool_call", "c1"),
        ("tool_result", "launched at moon"),
        ("assistant", "landed"),
    ]
    assert (await conv.turn(user.id)).state is TurnState.DONE


async def test_answers_that_do_not_fit_are_refused(make_agent):
    llm = ScriptedLLM([call("c1", "launch", "moon"), call("c2", "launch", "sun")], ["ok"])
    agent = await make_agent(llm, tools=counting_tools([]), hooks=hooks(Gate("launch")))
    conv = await agent.create_conversation()
    user = await conv.send(text("go"))
    await conv.wait_idle()
    other = await agent.create_conversation()
    with pytest.raises(UnknownReference):
        await conv.resume_turn("msg-none", "c1", True)
    with pytest.raises(UnknownReference):
        await other.resume_turn(user.id, "c1", True)  # another conversation's turn
    with pytest.raises(UnknownReference):
        await conv.resume_turn(user.id, "c9", True)  # no such wait
    await conv.resume_turn(user.id, "c1", True)
    with pytest.raises(NotWaiting):
        await conv.resume_turn(user.id, "c1", False)  # answered already
    assert (await conv.turn(user.id)).state is TurnState.WAITING  # c2 still waits
    await conv.resume_turn(user.id, "c2", True)
    await conv.wait_idle()
    with pytest.raises(NotWaiting):
        await conv.resume_turn(user.id, "c2", True)  # the turn is over


async def test_sends_behind_a_waiting_turn_wait_and_run_after_it(make_agent):
    llm = ScriptedLLM([call("c1", "launch", "moon")], ["landed"])
    agent = await make_agent(llm, tools=counting_tools([]), hooks=hooks(Gate("launch")))
    conv = await agent.create_conversation()
    first = await conv.send(text("go"))
    await conv.wait_idle()
    second = await conv.send(text("and then?"))
    await asyncio.sleep(0.05)
    assert (await conv.turn(second.id)).state is TurnState.QUEUED
    await conv.resume_turn(first.id, "c1", True)
    await conv.wait_idle()
    assert await history(conv) == [
        ("user", "go"),
        ("tool_call", "c1"),
        ("user", "and then?"),
        ("tool_result", "launched at moon"),
        ("assistant", "landed"),
        ("assistant", "echo: and then?"),
    ]


async def test_an_interrupt_ends_a_waiting_turn(make_agent):
    ran: list[str] = []
    llm = ScriptedLLM([call("c1", "launch", "moon")])
    agent = await make_agent(llm, tools=counting_tools(ran), hooks=hooks(Gate("launch")))
    conv = await agent.create_conversation()
    user = await conv.send(text("go"))
    await conv.wait_idle()
    events = asyncio.ensure_future(collect_turn(conv))
    await asyncio.sleep(0)
    assert conv.interrupt()
    got = await events
    assert [e.type for e in got] == ["ToolResult", "Interrupted", "End"]
    await conv.wait_idle()
    assert (await conv.turn(user.id)).state is TurnState.CANCELLED and ran == []
    assert await history(conv) == [
        ("user", "go"),
        ("tool_call", "c1"),
        ("tool_result", "Error: interrupted"),
        ("assistant", ""),
    ]
    assert not conv.interrupt()  # nothing left to stop
    with pytest.raises(NotWaiting):
        await conv.resume_turn(user.id, "c1", True)
    await conv.send(text("again"))  # the line moves on
    await conv.wait_idle()
    assert (await history(conv))[-1] == ("assistant", "echo: again")


async def test_a_waiting_turn_waits_on_across_a_restart(make_agent, tmp_path):
    db = str(tmp_path / "w.db")
    ran: list[str] = []
    llm = ScriptedLLM([call("c1", "launch", "moon"), call("c2", "look", "moon")])
    agent = await make_agent(llm, tools=counting_tools(ran), hooks=hooks(Gate("launch")), db=db)
    conv = await agent.create_conversation()
    user = await conv.send(text("go"))
    await conv.send(text("queued behind"))
    await conv.wait_idle()
    await agent.close()
    agent2 = await make_agent(ScriptedLLM(["landed"]), tools=counting_tools(ran), db=db)
    # the queued send behind the waiting turn; where instances share the store, nothing is
    # taken up until the answer (a free conversation whose turn waits is left to it)
    assert await agent2.resume() == (0 if ON_POSTGRES else 1)
    conv2 = await agent2.get_conversation(conv.id)
    assert conv2.busy and not conv2.inbox.running  # the queued send waits behind it
    await conv2.resume_turn(user.id, "c1", True)
    await conv2.wait_idle()
    assert ran == ["launch moon", "look moon"]  # c2 was not held: it ran as the model made it
    kinds = await history(conv2)
    assert kinds[-3:] == [
        ("tool_result", "moon looks fine"),
        ("assistant", "landed"),
        ("assistant", "echo: queued behind"),
    ]


def crash(agent) -> None:
    """The process dies here: nothing more of this agent reaches the database."""
    db = agent.store.db
    if hasattr(db, "terminate"):  # PostgreSQL (AGENTIK_TEST_DATABASE=postgres)
        db.terminate()
    else:
        db.conn.close()
        db._conn = None
        db._unlock()  # and the OS drops its lock on the file
    for conv in agent._live.values():
        conv.closed = True
    agent._closed = True


class HangAt(ScriptedLLM):
    """Plays its steps, but stops in send number ``at`` after its first chunk, for good."""

    def __init__(self, *steps, at: int | None = None) -> None:
        super().__init__(*steps)
        self.at = at
        self.hung = asyncio.Event()
        self.sent = 0

    def create_conversation(self, system_prompt, history, tools):
        conv = super().create_conversation(system_prompt, history, tools)
        real = conv.stream

        async def stream(inputs):
            n, self.sent = self.sent, self.sent + 1
            async for chunk in real(inputs):
                yield chunk
                if n == self.at:
                    self.hung.set()
                    await asyncio.sleep(60)

        conv.stream = stream
        return conv


STEPS = [[call("c1", "launch", "moon")], [call("c2", "look", "moon")], ["all ", "done"]]
# where the process stops: the model send that hangs, or the tool that hangs, and the model
# replies recorded by then
CUTS = {
    "first model call": (0, None, 0),
    "launch": (None, "launch", 1),
    "second model call": (1, None, 1),
    "look": (None, "look", 2),
    "final reply": (2, None, 2),
}


@pytest.mark.parametrize("cut_at", list(CUTS))
async def test_a_turn_cut_at_any_step_resumes_from_its_last_recorded_one(
    make_agent, tmp_path, cut_at
):
    """A 3-step tool loop whose process stops at each point: after the restart the turn
    completes, with one End; a tool whose result was recorded never runs again, a
    non-idempotent one that may have started is reported cut to the model, an idempotent one
    runs again; the history has the shape of a turn that was never cut."""
    db = str(tmp_path / "cut.db")
    hang_send, hang_tool, recorded = CUTS[cut_at]
    ran: list[str] = []
    tool_hung = asyncio.Event()

    def counted(name: str, idempotent: bool):
        @tool(name=name, idempotent=idempotent)
        async def run(target: str) -> str:
            ran.append(f"{name} {target}")
            if name == hang_tool and ran.count(f"{name} {target}") == 1:
                tool_hung.set()
                await asyncio.sleep(60)
            return f"{name}: {target} ok"

        return run

    tools = [counted("launch", False), counted("look", True)]
    llm = HangAt(*STEPS, at=hang_send)
    agent = await make_agent(llm, tools=tools, db=db)
    conv = await agent.create_conversation()
    user = await conv.send(text("go"))
    await asyncio.wait_for((llm.hung if hang_tool is None else tool_hung).wait(), 5)
    crash(agent)

    agent2 = await make_agent(ScriptedLLM(*STEPS[recorded:]), tools=tools, db=db)
    assert await agent2.resume() == 1
    conv2 = await agent2.get_conversation(conv.id)
    got = await collect_turn(conv2, after=0)
    await conv2.wait_idle()
    assert [e.type for e in got].count("End") == 1 and "Error" not in [e.type for e in got]
    assert (await conv2.turn(user.id)).state is TurnState.DONE
    kinds = await history(conv2)
    assert [k for k, _ in kinds] == [
        "user", "tool_call", "tool_result", "tool_call", "tool_result", "assistant"
    ]  # fmt: skip
    assert kinds[-1] == ("assistant", "all done")
    results = [d for k, d in kinds if k == "tool_result"]
    if cut_at == "launch":
        assert ran == ["launch moon", "look moon"] and results[0] == CUT_CALL
    elif cut_at == "look":
        assert ran == ["launch moon", "look moon", "look moon"]
        assert results == ["launch: moon ok", "look: moon ok"]
    else:
        assert ran == ["launch moon", "look moon"]
        assert results == ["launch: moon ok", "look: moon ok"]


async def test_with_resume_off_a_turn_cut_after_a_step_ends_with_a_restart_error(
    make_agent, tmp_path
):
    db = str(tmp_path / "off.db")
    llm = HangAt([call("c1", "look", "moon")], ["never"], at=1)
    agent = await make_agent(llm, tools=counting_tools([]), db=db)
    conv = await agent.create_conversation()
    await conv.send(text("cut after a step"))
    await asyncio.wait_for(llm.hung.wait(), 5)
    crash(agent)
    agent2 = await make_agent(ScriptedLLM(), db=db, resume_turns=False)
    assert await agent2.resume() == 0
    conv2 = await agent2.get_conversation(conv.id)
    await conv2.wait_idle()  # on PostgreSQL its worker settles what the sweep took over
    assert (await history(conv2))[-1] == ("error", "restart")


@pytest.mark.parametrize("resume", [True, False])
async def test_a_plain_turn_cut_before_its_first_step_runs_again(make_agent, tmp_path, resume):
    """Nothing of it was recorded (it did nothing yet): the next start runs it, then the
    sends queued behind it, in order; with resume_turns off it ends with a restart error, as
    a turn the process cut off always did."""
    db = str(tmp_path / "crash.db")
    agent = await make_agent(ScriptedLLM(["slow "] * 1000, delay=0.01), db=db)
    conv = await agent.create_conversation()
    for body in ("one", "two", "three"):
        await conv.send(text(body))
    await asyncio.sleep(0.05)
    crash(agent)
    agent2 = await make_agent(ScriptedLLM(), db=db, resume_turns=resume)
    assert await agent2.resume() == (3 if resume else 2)
    conv2 = await agent2.get_conversation(conv.id)
    await conv2.wait_idle()
    first = ("assistant", "echo: one") if resume else ("error", "restart")
    assert (await history(conv2))[3:] == [
        first,
        ("assistant", "echo: two"),
        ("assistant", "echo: three"),
    ]


async def test_a_turn_whose_end_could_not_be_recorded_is_taken_up_at_the_next_start(
    make_agent, tmp_path
):
    db = str(tmp_path / "u.db")
    agent = await make_agent(ScriptedLLM(), db=db)
    conv = await agent.create_conversation()
    real_append = agent.store.append

    async def failing_append(conversation_id, messages=(), memory=(), **kw):
        if messages and messages[0].kind == "assistant":
            raise OSError("disk full")
        return await real_append(conversation_id, messages, memory, **kw)

    async def failing_fail_turn(*args):
        raise OSError("disk full")

    agent.store.append = failing_append
    agent.store.fail_turn = failing_fail_turn
    events = asyncio.ensure_future(collect_turn(conv))
    user = await conv.send(text("x"))
    assert [e.type for e in await events][-2:] == ["Error", "End"]
    assert (await conv.turn(user.id)).state is TurnState.QUEUED  # as the store knows it
    await agent.close()
    agent2 = await make_agent(ScriptedLLM(), db=db)
    assert await agent2.resume() == 1
    conv2 = await agent2.get_conversation(conv.id)
    await conv2.wait_idle()
    assert (await history(conv2))[-1] == ("assistant", "echo: x")


async def test_a_move_counts_only_once_written():
    """A turn whose end could not be written is still running: its failure can be recorded
    (taken for done, its failure was refused as a move from done, on PostgreSQL read as ended
    elsewhere: the turn stayed running in the store, unanswered)."""

    class Refusing:
        async def append(self, *args, **kwargs):
            raise OSError("deadlock detected")

    user = Message("u1", "c1", "user", utcnow(), {"content": [{"type": "text", "body": "x"}]})
    turn = Progress(TurnRecord(user, R))
    with pytest.raises(OSError):
        await turn.write(Refusing(), update=turn.move(D))  # type: ignore[arg-type]
    assert turn.state is R
    check_move(turn.state, F)


async def test_a_failing_step_after_a_wait_fails_the_turn_and_cleans_working_memory(make_agent):
    llm = ScriptedLLM([call("c1", "launch", "moon")], LLMError("the model is gone", "http_503"))
    agent = await make_agent(llm, tools=counting_tools([]), hooks=hooks(Gate("launch")))
    conv = await agent.create_conversation()
    user = await conv.send(text("go"))
    await conv.wait_idle()
    await conv.resume_turn(user.id, "c1", True)
    await conv.wait_idle()
    assert (await conv.turn(user.id)).state is TurnState.FAILED
    assert (await history(conv))[-1] == ("error", "http_503")
    assert [r.turn_id for r in await conv.store.list_memory(conv.id)] == []


def test_a_plugin_tool_keeps_its_idempotent_flag_in_the_agent():
    from agentik.core.app import AGENT
    from agentik.core.testing import make_app

    class P:
        @hookimpl
        def register_tools(self, register):
            for t in counting_tools([]):
                register(t)

    agent = make_app(llm=ScriptedLLM(), plugins=[("p", P())])[AGENT]
    assert agent.tools.idempotent("look") and not agent.tools.idempotent("launch")


async def test_an_approved_call_cut_by_a_crash_is_not_run_again(make_agent, tmp_path):
    """The answer let it run; the process died while it ran: it may have taken effect, so the
    resumed turn tells the model instead of running it a second time."""
    db = str(tmp_path / "approved.db")
    ran: list[str] = []
    started = asyncio.Event()

    @tool
    async def launch(target: str) -> str:
        ran.append(target)
        started.set()
        await asyncio.sleep(60)
        return "launched"

    llm = ScriptedLLM([call("c1", "launch", "moon")])
    agent = await make_agent(llm, tools=[launch], hooks=hooks(Gate("launch")), db=db)
    conv = await agent.create_conversation()
    user = await conv.send(text("go"))
    await conv.wait_idle()
    await conv.resume_turn(user.id, "c1", {"approve": True})
    await asyncio.wait_for(started.wait(), 5)
    crash(agent)
    agent2 = await make_agent(ScriptedLLM(["understood"]), tools=[launch], db=db)
    assert await agent2.resume() == 1
    conv2 = await agent2.get_conversation(conv.id)
    await conv2.wait_idle()
    assert ran == ["moon"]
    assert (await history(conv2))[-2:] == [("tool_result", CUT_CALL), ("assistant", "understood")]
