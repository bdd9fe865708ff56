"""Run the benchmark suite (docs/PERFORMANCE.md says how to read it).

    python bench/run.py                 # everything (~5 min on 2 CPUs)
    python bench/run.py --only B4,B9    # some
    python bench/run.py --quick         # fewer repeats: a smoke test of the harness

Each benchmark runs in its own process (bench/bNN_*.py, also runnable alone). Results go to
bench/results/latest.json and bench/results/latest.md (the tables for docs/PERFORMANCE.md).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"

SUITE = {  # id -> (module, timeout s)
    "B1": ("b01_cold_start.py", 240),
    "B3": ("b03_inproc_turn.py", 240),
    "B4": ("b04_http_turn.py", 400),
    "B5": ("b05_relay.py", 300),
    "B6": ("b06_ttft.py", 240),
    "B7": ("b07_concurrency.py", 400),
    "B8": ("b08_streams.py", 300),
    "B9": ("b09_store.py", 240),
    "B9B": ("b09b_send_burst.py", 300),
    "B10": ("b10_long_conversation.py", 240),
    "B11": ("b11_memory.py", 400),
    "B12": ("b12_vector.py", 900),
    "B12S": ("b12s_siglip.py", 600),
    "B13": ("b13_tool_loop.py", 600),
    "B14": ("b14_loop_lag.py", 240),
    "B16": ("b16_trivial_route.py", 240),
    "B17": ("b17_litert.py", 240),
    "B18": ("b18_skills.py", 400),
    "B19": ("b19_model_cache.py", 300),
    "B20": ("b20_a2a.py", 400),
    "B21": ("b21_client_events.py", 300),
    "B22": ("b22_agui_turn.py", 300),
    "B23": ("b23_doors.py", 400),
    "B24": ("b24_web_page.py", 900),
    "B25": ("b25_big_pages.py", 300),
    "B26": ("b26_local_model.py", 1800),  # needs AGENTIK_REAL_LLM_PYTHON (make test-real)
    "B27": ("b27_waiting_turns.py", 900),
    "B28": ("b28_observe.py", 400),
    "B29": ("b29_postgres.py", 400),  # needs PostgreSQL (make install-test installs it)
    "B30": ("b30_cluster.py", 600),  # needs PostgreSQL and HAProxy (make install-test)
    "B31": ("b31_event_relay.py", 200),  # needs PostgreSQL (make install-test installs it)
}


def fmt(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, bool):
        return str(x)
    x = float(x)
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def cell(value: Any, st: dict[str, float] | None) -> str:
    if value is None:
        return "-"
    if st and st.get("n", 0) > 1 and "p95" in st:
        return f"{fmt(value)} <sub>p95 {fmt(st['p95'])} · p99 {fmt(st['p99'])}</sub>"
    return fmt(value)


def met_mark(met: Any) -> str:
    return {True: "✅ met", False: "❌ missed", None: ""}.get(met, str(met))


def markdown(result: dict[str, Any]) -> str:
    lines = [f"### {result['id']} \u2014 {result.get('title', '')}", ""]
    if "error" in result:
        return "\n".join([*lines, f"**failed:** `{result['error'][:500]}`", ""])
    lines.append("| metric | unit | agentik | floor | ratio | target | met | note |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for r in result["rows"]:
        ratio = f"{r['ratio']:.2f}\u00d7" if r.get("ratio") is not None else "-"
        lines.append(
            f"| {r['metric']} | {r['unit']} | {cell(r['agentik'], r.get('agentik_stats'))} | "
            f"{cell(r['floor'], r.get('floor_stats'))} | {ratio} | {r['target']} | "
            f"{met_mark(r['met'])} | {r.get('note', '')} |"
        )
    lines.append("")
    for n in result.get("notes", []):
        lines.append(f"- {n}")
    if result.get("commit"):
        lines.append(f"- measured at commit {result['commit']}, {result.get('seconds')} s")
    lines.append("")
    return "\n".join(lines)


def text_table(result: dict[str, Any]) -> str:
    out = [f"== {result['id']} {result.get('title', '')} =="]
    if "error" in result:
        return "\n".join([*out, "  FAILED: " + result["error"][-800:]])
    for r in result["rows"]:
        ratio = f"{r['ratio']:.2f}x" if r.get("ratio") is not None else "-"
        out.append(
            f"  {r['metric'][:78]:78s} {fmt(r['agentik']):>9s} {fmt(r['floor']):>9s} "
            f"{ratio:>7s} {r['unit']:>7s}  {met_mark(r['met'])}"
        )
    return "\n".join(out)


def git_commit() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()


def machine() -> dict[str, Any]:
    commit = git_commit()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "agentik", "plugins"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.strip()
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    with contextlib.suppress(OSError):
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split(":")[1].strip()
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory": mem,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "commit": commit + (" (+ uncommitted changes in agentik/ or plugins/)" if dirty else ""),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma list of ids, e.g. B4,B9")
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke test)")
    args = parser.parse_args()
    ids = [i.strip().upper() for i in args.only.split(",")] if args.only else list(SUITE)
    unknown = [i for i in ids if i not in SUITE]
    if unknown:
        parser.error(f"unknown ids {unknown}; known: {', '.join(SUITE)}")
    RESULTS.mkdir(exist_ok=True)
    info = machine()
    print(
        f"agentik benchmarks {info['date']} · {info['nproc']} CPUs · Python {info['python']} · "
        f"commit {info['commit']}",
        flush=True,
    )
    results = []
    t_all = time.perf_counter()
    for bid in ids:
        module, timeout = SUITE[bid]
        out = RESULTS / f"{bid}.json"
        out.unlink(missing_ok=True)
        cmd = [sys.executable, str(BENCH / module), "--json-out", str(out)]
        if args.quick:
            cmd.append("--quick")
        t0 = time.perf_counter()
        commit = git_commit()  # the code can move during a run: record what each one measured
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
            if proc.returncode != 0 or not out.exists():
                result = {"id": bid, "title": module, "error": proc.stderr[-3000:]}
            else:
                result = json.loads(out.read_text())
        except subprocess.TimeoutExpired:
            result = {"id": bid, "title": module, "error": f"timed out after {timeout} s"}
        result["seconds"] = round(time.perf_counter() - t0, 1)
        result["commit"] = commit
        results.append(result)
        print(text_table(result) + f"\n  ({result['seconds']} s)", flush=True)
    info["total_seconds"] = round(time.perf_counter() - t_all, 1)
    info["quick"] = args.quick
    doc = {"machine": info, "results": results}
    (RESULTS / "latest.json").write_text(json.dumps(doc, indent=1, default=str))
    md = [
        f"Run {info['date']}, commit {info['commit']}, {info['nproc']} CPUs ({info['cpu']}), "
        f"{info['memory']} RAM, Python {info['python']}, {info['total_seconds']} s"
        + (" (--quick)" if args.quick else "")
        + ".",
        "",
    ]
    md += [markdown(r) for r in results]
    (RESULTS / "latest.md").write_text("\n".join(md))
    print(
        f"\nwrote {RESULTS / 'latest.json'} and {RESULTS / 'latest.md'} ({info['total_seconds']} s)"
    )
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
