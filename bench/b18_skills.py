"""B18: skills (F7). Start-up of ``agentik serve`` with 1,000 skills vs none; building the
system prompt with 1,000 skills cached; an in-process turn with 1,000 skills and skill mining
on vs without the skills plugin.

1. exec -> ``GET /health`` 200 of ``agentik serve`` (openai backend against the fake LLM,
   default plugins) with ``AGENTIK_SKILLS_DIR`` holding 1,000 SKILL.md skills (20 folders of
   50, ~1 KB bodies) vs without it; alternating repeats. /health answers only after the
   catalogue is loaded (the skills service loads it before requests are served).
2. ``agent.system_prompt()`` (what a new live LLM conversation is built with: base prompt and
   the ``## Skills`` section of 1,000 lines), nothing changed on disk, within the rescan
   interval: µs per call; floor: the same agent without the skills plugin (base prompt only).
   Also: one rescan that finds nothing changed (stat of every file; it runs at most once per
   AGENTIK_SKILLS_RESCAN seconds when a prompt is built), and the cold parse of 1,000 files.
3. In-process turn (``send`` + ``wait_idle`` + the background jobs, ScriptedLLM, SQLite
   file) with the skills plugin serving 1,000 skills, mining off and at its default interval
   (ScriptedLLM's one-shot answer is not JSON: the run reads the turns, builds the prompt,
   asks, logs), vs an agent without the plugin: µs of process CPU per turn.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import common
from common import row, stats

N_SKILLS = 1000
BODY = "Step: do the thing carefully and check the result.\n" * 20


def make_skills(root: Path, n: int = N_SKILLS) -> Path:
    for i in range(n):
        folder = root / f"area-{i % 20}" / f"skill-{i}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "SKILL.md").write_text(
            f"---\nname: skill-{i}\ndescription: Does task number {i} the way the team "
            f"agreed, when the user asks for it.\n---\n\n{BODY}"
        )
    return root


def cold_start(start: Any) -> float:
    p = start()
    try:
        return (common.wait_http(p, p.port, timeout=60) - p.t_exec) * 1e3
    finally:
        p.stop()


def startup(args: Any, skills: Path) -> dict[str, list[float]]:
    reps = common.repeats(args, 7, 2)
    fake = common.start_fake()
    tmp = common.tmpdir()
    out: dict[str, list[float]] = {"skills": [], "none": []}
    try:
        for i in range(reps + 1):  # alternate; the first round warms the page cache
            db = str(tmp / f"b18-{i}-{time.monotonic_ns()}.db")
            a = cold_start(
                lambda db=db: common.start_agentik(
                    fake.port, db=db, wait=False, AGENTIK_SKILLS_DIR=str(skills)
                )
            )
            db = str(tmp / f"b18-{i}-{time.monotonic_ns()}.db")
            b = cold_start(lambda db=db: common.start_agentik(fake.port, db=db, wait=False))
            if i:
                out["skills"].append(a)
                out["none"].append(b)
    finally:
        fake.stop()
    return out


def prompt_build(args: Any, skills: Path) -> dict[str, Any]:
    from agentik.core.app import build_agent, load_settings
    from agentik.core.testing import ScriptedLLM, test_plugins

    def agent(with_skills: bool) -> Any:
        names = ("agentik_transport_http", "agentik_skills") if with_skills else ()
        pm = test_plugins(builtins=names)
        env = {"AGENTIK_DB_PATH": ":memory:", "AGENTIK_SKILLS_RESCAN": "3600"}
        if with_skills:
            env["AGENTIK_SKILLS_DIR"] = str(skills)
        settings = load_settings(pm, env)
        return build_agent(pm, settings, ScriptedLLM()), settings

    def per_call_us(fn: Any, n: int) -> list[float]:
        samples = []
        for _ in range(common.repeats(args, 7, 2)):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            samples.append((time.perf_counter() - t0) / n * 1e6)
        return samples

    n = 2000 if args.quick else 20000
    (with_skills, settings), (bare, _) = agent(True), agent(False)
    prompt = with_skills.system_prompt()  # the first build loads the catalogue
    import agentik_skills
    from agentik_skills.folder import SkillCatalogue

    cat = agentik_skills.catalogue(settings)
    assert len(cat.skills()) == N_SKILLS, len(cat.skills())
    rescan, cold = [], []
    for _ in range(common.repeats(args, 7, 2)):
        t0 = time.perf_counter()
        cat.current(force=True)
        rescan.append((time.perf_counter() - t0) * 1e3)
        fresh = SkillCatalogue(skills)
        t0 = time.perf_counter()
        fresh.current()
        cold.append((time.perf_counter() - t0) * 1e3)
    return {
        "prompt": per_call_us(with_skills.system_prompt, n),
        "bare": per_call_us(bare.system_prompt, n),
        "rescan_ms": rescan,
        "cold_ms": cold,
        "chars": len(prompt),
    }


async def turns(args: Any, skills: Path) -> dict[str, list[float]]:
    from aiohttp.test_utils import TestServer
    from inproc import HI, LeanScriptedLLM

    from agentik.core.app import AGENT, create_app, load_settings
    from agentik.core.testing import test_plugins

    tmp = common.tmpdir()
    n = 100 if args.quick else 300
    out: dict[str, list[float]] = {"skills": [], "mining": [], "none": []}
    servers = {}
    for kind in out:
        names = ("agentik_transport_http", "agentik_skills") if kind != "none" else ()
        pm = test_plugins(builtins=names)
        env = {"AGENTIK_DB_PATH": str(tmp / f"b18-turns-{kind}-{os.getpid()}.db")}
        if kind != "none":
            env["AGENTIK_SKILLS_DIR"] = str(skills)
            env["AGENTIK_SKILL_MINING_INTERVAL"] = "15" if kind == "mining" else "0"
        app = create_app(load_settings(pm, env), pm, llm=LeanScriptedLLM())
        servers[kind] = server = TestServer(app)
        await server.start_server()  # the lifecycle: services (the catalogue), jobs
    try:
        convs = {k: await s.app[AGENT].create_conversation() for k, s in servers.items()}
        for _ in range(common.repeats(args, 7, 2)):
            for kind, conv in convs.items():  # alternate
                agent = servers[kind].app[AGENT]
                c0 = time.process_time()
                for _ in range(n):
                    await conv.send(HI)
                    await conv.wait_idle()
                    await agent.jobs.wait_idle()  # the after_turn jobs are part of the cost
                out[kind].append((time.process_time() - c0) / n * 1e6)
    finally:
        for server in servers.values():
            await server.close()
    return out


async def main(args: Any) -> dict[str, Any]:
    skills = make_skills(common.tmpdir() / "skills")
    up = await asyncio.to_thread(startup, args, skills)
    pb = prompt_build(args, skills)
    tu = await turns(args, skills)
    st = {k: stats(v) for k, v in up.items()}
    pst = {k: stats(pb[k]) for k in ("prompt", "bare", "rescan_ms", "cold_ms")}
    tst = {k: stats(v) for k, v in tu.items()}
    up_ratio = st["skills"]["median"] / st["none"]["median"]
    rows = [
        row(
            f"exec -> /health 200 with {N_SKILLS:,} skills (floor: no skills folder)",
            st["skills"],
            st["none"],
            unit="ms",
            target="< 2x",
            met=up_ratio < 2,
        ),
        row(
            f"system prompt build, {N_SKILLS:,} skills cached, nothing changed "
            "(floor: no skills plugin)",
            pst["prompt"],
            pst["bare"],
            unit="µs",
            target="≤ 50 µs",
            met=pst["prompt"]["median"] <= 50,
        ),
        row(
            f"rescan of {N_SKILLS:,} unchanged skills (at most once per AGENTIK_SKILLS_RESCAN)",
            pst["rescan_ms"],
            None,
            unit="ms",
        ),
        row(f"cold parse of {N_SKILLS:,} SKILL.md files", pst["cold_ms"], None, unit="ms"),
        row(
            f"in-process turn, CPU, {N_SKILLS:,} skills, mining off (floor: no skills plugin)",
            tst["skills"],
            tst["none"],
            unit="µs",
            target="≈ 1x (no per-turn catalogue cost)",
            met=tst["skills"]["median"] <= 1.1 * tst["none"]["median"],
        ),
        row(
            f"in-process turn, CPU, {N_SKILLS:,} skills, mining every 15 turns, its one-shot "
            "call answered at once (floor: no skills plugin)",
            tst["mining"],
            tst["none"],
            unit="µs",
            note="the mining run's CPU spread over its 15 turns",
        ),
    ]
    notes = [
        f"the prompt with {N_SKILLS:,} skills is {pb['chars']:,} characters",
        "the prompt is rendered only when a live LLM conversation is built (a new or "
        "reloaded conversation), not per turn",
    ]
    raw = {"startup": st, "prompt": pst, "turns": tst}
    return {"id": "B18", "title": "skills", "rows": rows, "notes": notes, "raw": raw}


if __name__ == "__main__":
    common.cli(main)
