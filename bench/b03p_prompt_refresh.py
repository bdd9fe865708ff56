"""B3p: what it costs that a changed prompt section reaches live conversations (issue 20.5).

Before every turn the conversation renders the system prompt again and compares it with the
one its live LLM conversation has; when it changed, the backend swaps it
(``LLMConversation.set_system_prompt``, the openai backend) or the live conversation is rebuilt
from working memory (a backend that cannot swap it, e.g. LiteRT-LM).

The agent is the one ``agentik serve`` builds (``running(make_app(...))``: services started),
with the sections a busy deployment has: a SOUL file (one ``stat`` per render), 20 skills
(``AGENTIK_SKILLS_RESCAN`` at its default 1 s), the memory section (md backend, prefetch and
review off so they add nothing to either side), three reflections' weak spots, the base prompt.
ScriptedLLM at the backend boundary, SQLite ``:memory:`` (the fsync of a file database is the
same on both sides and its noise on a shared machine would bury the difference). Measured:
process CPU µs per in-process turn (``send`` + ``wait_idle``), blocks of turns alternating A/B,
medians over repeats.

1. unchanged prompt: with the check (this code) vs the check patched out (the code before);
2. ``agent.system_prompt()`` alone, µs per call (the render the check adds);
3. a prompt that changes before every turn (the worst case), the conversation holding 50 turns
   (a fresh one per block):
   swapped by the backend vs rebuilt from working memory, both vs unchanged;
4. the openai backend itself, 100 history entries: ``create_conversation`` (what a rebuild
   costs it) vs ``set_system_prompt`` (a swap), µs per call.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

import common
from common import row, stats
from inproc import HI, LeanScriptedLLM

from agentik.core.app import running
from agentik.core.conversation import ChatConversation
from agentik.core.llm import HistoryItem, LLMConversation
from agentik.core.testing import ScriptedConversation, make_app
from agentik.core.tools import ToolSpec

SPOTS = [(3, ["answers too long", "did not ask which city"]), (4, ["forgot the units"])]


class SwappingConversation(ScriptedConversation):
    async def set_system_prompt(self, system_prompt: str) -> bool:
        self.system_prompt = system_prompt
        return True


class SwappingLLM(LeanScriptedLLM):
    """A backend that swaps the system prompt in place, as the openai backend does."""

    def create_conversation(
        self, system_prompt: str, history: Sequence[HistoryItem], tools: Sequence[ToolSpec]
    ) -> LLMConversation:
        return SwappingConversation(self, history)


def app_env(tmp: Any) -> dict[str, str]:
    soul = tmp / "SOUL.md"
    soul.write_text("You are Marvin, a patient technical assistant.\n" * 10)
    skills = tmp / "skills"
    for i in range(20):
        (skills / f"skill-{i}").mkdir(parents=True, exist_ok=True)
        (skills / f"skill-{i}" / "SKILL.md").write_text(
            f"---\nname: skill-{i}\ndescription: Does task {i} as agreed.\n---\n\nDo.\n"
        )
    return {
        "AGENTIK_DB_PATH": ":memory:",  # no fsync: its noise would hide what is measured
        "AGENTIK_SOUL": str(soul),
        "AGENTIK_SKILLS_DIR": str(skills),
        "AGENTIK_SKILL_MINING_INTERVAL": "0",
        "AGENTIK_MEMORY_BACKEND": "md",
        "AGENTIK_MEMORY_DIR": str(tmp / "memory"),
        "AGENTIK_MEMORY_PREFETCH": "0",
        "AGENTIK_MEMORY_REVIEW": "0",
        "AGENTIK_REFLECTION_INTERVAL": "1000000",
    }


async def turns(conv: Any, n: int, before: Any = None) -> float:
    """CPU µs per turn of ``n`` turns; ``before()`` runs before each (outside the timing)."""
    total = 0.0
    for _ in range(n):
        if before is not None:
            before()
        c0 = time.process_time()
        await conv.send(HI)
        await conv.wait_idle()
        total += time.process_time() - c0
    return total / n * 1e6


async def no_check(self: ChatConversation, llm: Any) -> None:
    """The code before issue 20.5: the prompt is rendered only when the conversation is built."""


async def measure(args: Any) -> dict[str, Any]:
    import agentik_memory
    import agentik_memory_md
    import agentik_reflection
    import agentik_skills
    import agentik_soul

    modules = [agentik_soul, agentik_skills, agentik_memory, agentik_memory_md, agentik_reflection]
    plugins = [(m.__name__, m) for m in modules]
    reps = common.repeats(args, 7, 2)
    n = 100 if args.quick else 300
    tmp = common.tmpdir()
    out: dict[str, list[float]] = {k: [] for k in ("check", "nocheck", "render", "swap",
                                                   "rebuild", "unchanged50")}  # fmt: skip
    real_update = ChatConversation._update_prompt
    for llm_kind in ("rebuild", "swap"):
        llm = LeanScriptedLLM() if llm_kind == "rebuild" else SwappingLLM()
        async with running(make_app(llm=llm, plugins=plugins, env=app_env(tmp))) as agent:
            reflector = agent.state["agentik_reflection"]
            reflector.latest = list(SPOTS)
            step = 0

            def change(reflector: Any = reflector) -> None:  # a new weak spot before each turn
                nonlocal step
                step += 1
                reflector.latest = [(2, [f"weak spot number {step}"]), *SPOTS]

            async def new_conversation(reflector: Any = reflector) -> Any:
                conv = await agent.create_conversation()
                # never due: its after_turn reads no table (the same on both sides)
                reflector.attempted[conv.id] = 0
                return conv

            if llm_kind == "rebuild":  # sections 1 and 2 once, on this agent
                conv = await new_conversation()
                await turns(conv, 20)
                for _ in range(reps * 6):  # short blocks, alternating: the machine is noisy
                    ChatConversation._update_prompt = no_check  # type: ignore[method-assign]
                    try:
                        out["nocheck"].append(await turns(conv, n // 6))
                    finally:
                        ChatConversation._update_prompt = real_update  # type: ignore[method-assign]
                    out["check"].append(await turns(conv, n // 6))
                    c0 = time.process_time()
                    for _ in range(2000):
                        agent.system_prompt()
                    out["render"].append((time.process_time() - c0) / 2000 * 1e6)
            m = max(10, n // 15)
            for _ in range(reps * 2):  # fresh conversations of 50 turns: the history is the same
                conv = await new_conversation()
                await turns(conv, 50)
                out[llm_kind].append(await turns(conv, m, change))
                if llm_kind == "rebuild":
                    conv = await new_conversation()
                    await turns(conv, 50)
                    out["unchanged50"].append(await turns(conv, m))
    return out


def openai_swap_vs_build(reps: int) -> dict[str, list[float]]:
    from agentik_llm_openai.backend import OpenAIBackend

    backend = OpenAIBackend(base_url="http://127.0.0.1:9/v1", api_key="k", model="m")
    history = []
    for i in range(50):
        history += [
            HistoryItem("user", f"question {i} " * 20),
            HistoryItem("assistant", "a " * 200),
        ]
    prompt = "You are Marvin.\n" * 60
    out: dict[str, list[float]] = {"build": [], "swap": []}
    conv = backend.create_conversation(prompt, history, [])
    for _ in range(reps):
        c0 = time.process_time()
        for _ in range(500):
            backend.create_conversation(prompt, history, [])
        out["build"].append((time.process_time() - c0) / 500 * 1e6)
        c0 = time.process_time()
        for i in range(500):
            # driven by hand: no event loop in the timing
            coro = conv.set_system_prompt(prompt if i % 2 else prompt + "x")
            with contextlib.suppress(StopIteration):
                coro.send(None)
        out["swap"].append((time.process_time() - c0) / 500 * 1e6)
    return out


async def main(args: Any) -> dict[str, Any]:
    s = await measure(args)
    o = openai_swap_vs_build(common.repeats(args, 7, 2))
    st = {k: stats(v) for k, v in {**s, **{f"openai_{k}": v for k, v in o.items()}}.items()}
    rows = [
        row(
            "turn CPU, prompt unchanged: with the check vs without (the code before)",
            st["check"],
            st["nocheck"],
            unit="µs",
            target="(info) the check's cost per turn",
            note=f"difference {st['check']['median'] - st['nocheck']['median']:.1f} µs",
        ),
        row(
            "agent.system_prompt() with soul, 20 skills, memory, reflection, base",
            st["render"],
            None,
            unit="µs",
            target="(info)",
        ),
        row(
            "turn CPU, prompt changed before each turn, 50-turn history: swapped by the backend",
            st["swap"],
            st["unchanged50"],
            unit="µs",
            target="(info) vs unchanged",
        ),
        row(
            "turn CPU, prompt changed before each turn, 50-turn history: rebuilt",
            st["rebuild"],
            st["unchanged50"],
            unit="µs",
            target="(info) vs unchanged",
        ),
        row(
            "openai backend, 100 history entries: create_conversation vs set_system_prompt",
            st["openai_build"],
            st["openai_swap"],
            unit="µs",
            target="(info)",
        ),
    ]
    return {"rows": rows}


if __name__ == "__main__":
    common.cli(main)
