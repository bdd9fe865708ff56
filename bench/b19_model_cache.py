"""B19: start-up of ``agentik serve`` on the default on-device path with the model in the cache
(nothing configured but ``AGENTIK_GOOGLE_MODEL_REPO``/``FILE`` naming the tiny test model and
``AGENTIK_MODELS_DIR``) vs the same model by ``AGENTIK_GOOGLE_MODEL_PATH`` (the floor),
exec -> ``GET /health`` 200, alternating every repeat. The cache is filled once by ``agentik
models pull`` from the fake hub of tests/fake_hub.py, which is then stopped: ``HF_ENDPOINT``
points at a closed port, so a start that asked the hub anything would fail. Also the cache
lookup alone in-process (``models.resolve``, µs). The first-token latency of the real default
model (Qwen3-0.6B) cannot be measured on machines without the hub.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import common
from common import row, stats

sys.path.insert(0, str(common.ROOT))
from tests.fake_hub import FakeHub

MODEL = common.ROOT / "tests" / "models" / "tiny.litertlm"
REPO, FILE = "agentik-bench/tiny", "tiny.litertlm"
RATIO_TARGET = 1.10
N_INPROC = 300
INPROC = f"""
import json, os, time
from agentik.core.app import load_settings
from agentik.core.plugins import make_plugins
import agentik_llm_litert as plugin
from agentik_llm_litert.models import resolve
p = make_plugins()
cached = load_settings(p)
explicit = load_settings(p, dict(os.environ, AGENTIK_GOOGLE_MODEL_PATH=str(resolve(cached)[0])))
out = {{"cached": [], "explicit": [], "lookup": []}}
pc = time.perf_counter_ns
for i in range({N_INPROC} + 20):
    for name in (("cached", "explicit") if i % 2 else ("explicit", "cached")):
        t = pc(); b = plugin.make_backend(cached if name == "cached" else explicit); d = pc() - t
        b.executor.shutdown()
        t = pc(); resolve(cached); dl = pc() - t
        if i >= 20:
            out[name].append(d / 1e3); out["lookup"].append(dl / 1e3)
print(json.dumps(out))
"""


def start_ms(env: dict[str, str]) -> float:
    port = common.free_port()
    p = common.Proc(
        [str(common.BIN / "agentik"), "serve"],
        {**env, "AGENTIK_PORT": str(port), "AGENTIK_DB_PATH": str(common.tmpdir() / f"{port}.db")},
        "agentik",
    )
    try:
        return (common.wait_http(p, port, timeout=60) - p.t_exec) * 1e3
    finally:
        p.stop()


async def main(args: Any) -> dict[str, Any]:
    return await asyncio.to_thread(measure, args)


def measure(args: Any) -> dict[str, Any]:
    reps = common.repeats(args, 9, 2)
    models = common.tmpdir() / "models"
    hub = FakeHub({f"{REPO}/{FILE}": MODEL.read_bytes()}).start()
    base = common.clean_env(
        HF_ENDPOINT=hub.url,
        HF_HUB_OFFLINE="0",
        AGENTIK_MODELS_DIR=str(models),
        AGENTIK_GOOGLE_MODEL_REPO=REPO,
        AGENTIK_GOOGLE_MODEL_FILE=FILE,
        AGENTIK_GOOGLE_THREADS="1",
        AGENTIK_GOOGLE_CACHE_DIR=str(common.tmpdir() / "engine"),
        AGENTIK_HOST=common.HOST,
        AGENTIK_LOG_LEVEL="warning",
        AGENTIK_MEMORY_BACKEND="off",
        AGENTIK_REFLECTION_INTERVAL="0",
    )
    try:
        subprocess.run([str(common.BIN / "agentik"), "models", "pull"], env=base, check=True)
    finally:
        hub.stop()
    base["HF_ENDPOINT"] = f"http://{common.HOST}:{common.free_port()}"  # nothing there now
    cached = dict(base)
    explicit = dict(base, AGENTIK_GOOGLE_MODEL_PATH=str(models / REPO / FILE))
    s: dict[str, list[float]] = {"cached": [], "explicit": []}
    for i in range(reps + 1):  # alternate which goes first; round 0 warms the page cache
        order = ("cached", "explicit") if i % 2 else ("explicit", "cached")
        for name in order:
            ms = start_ms(cached if name == "cached" else explicit)
            if i:
                s[name].append(ms)
    # in-process, alternating, many repeats: the plugin's factory (cache lookup + the header
    # check both paths do) with the cached model vs the explicit path; and the lookup alone
    inproc = json.loads(
        subprocess.run(
            [common.PY, "-c", INPROC], env=cached, capture_output=True, text=True, check=True
        ).stdout
    )
    st = {k: stats(v) for k, v in s.items()}
    ratio = st["cached"]["median"] / st["explicit"]["median"]
    fac = {k: stats(v) for k, v in inproc.items()}
    fratio = fac["cached"]["median"] / fac["explicit"]["median"]
    rows = [
        row(
            "exec -> /health 200, model from the cache",
            st["cached"],
            st["explicit"],
            unit="ms",
            target=f"≤ {RATIO_TARGET}x explicit path",
            met=ratio <= RATIO_TARGET,
        ),
        row(
            "the litert factory in-process (make_backend, no engine), cached vs explicit",
            fac["cached"],
            fac["explicit"],
            unit="µs",
            target=f"≤ {RATIO_TARGET}x explicit path",
            met=fratio <= RATIO_TARGET,
        ),
        row("the cache lookup alone (models.resolve)", fac["lookup"], unit="µs"),
    ]
    notes = [
        f"{reps} alternating process starts after one warm-up round; floor: the same file by "
        f"AGENTIK_GOOGLE_MODEL_PATH; in-process: {N_INPROC} alternating calls each",
        "no request reached the hub: HF_ENDPOINT pointed at a closed port during the starts",
    ]
    return {"id": "B19", "title": "start-up from the model cache", "rows": rows, "notes": notes}


if __name__ == "__main__":
    common.cli(main)
