"""B12S: ``siglip`` embedding throughput (texts/s) through agentik vs the same ONNX session run
by hand, in the same process and run, alternating A/B call by call.

agentik: ``await backend.embed(texts)`` on the backend built by the plugin's registered
factory (``registries(...)["embedding"].create("siglip", settings)``): SigLIP2's preprocessing,
one worker thread, batches of 32, L2 normalisation. By hand (the floor): the *same*
``InferenceSession`` object (the backend's), the same SentencePiece model, the preprocessing
written inline (lowercase, encode, cut to 63 + EOS, pad to 64) and the normalisation, run on the
calling thread with one ``session.run`` per call of the same size.

Models (no real SigLIP2 weights are reachable here; both built by ``tools/build_tiny_siglip.py``
with the same signature): ``tiny`` (the test model, hidden 32: the cost is nearly all
overhead, agentik's worst case) and ``wide`` (hidden 768, 12 heads, MLP 3072, dimension 768:
one encoder layer of SigLIP2-base's width, about 1/12 of its compute per text). Call shapes: 1
text per call (a prefetch), 32 (a batch of saves) and 256 (a rebuild). ``AGENTIK_EMBEDDING_THREADS``
1 and 2 (the machine has 2 CPUs).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import sys
import time
from typing import Any

import common
import numpy as np
from common import row, stats

sys.path.insert(0, str(common.ROOT / "tools"))
import build_tiny_siglip as tiny

from agentik.core.app import load_settings, registries
from agentik.core.plugins import make_plugins

pc = time.perf_counter_ns
RATIO_TARGET = 0.9  # agentik's texts/s at least this share of by hand's
WORDS = " ".join(tiny.CORPUS.split("\n")).split()


def texts(n: int, seed: int) -> list[str]:
    """Note-like texts of 4 to 40 words (a few Capitalised), from the tokenizer's corpus."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 40))]
        words[0] = words[0].capitalize()
        out.append(" ".join(words) + ".")
    return out


def by_hand(session: Any, sp: Any, batch: list[str]) -> np.ndarray:
    ids = np.zeros((len(batch), 64), dtype=np.int64)  # <pad> is 0
    for i, text in enumerate(batch):
        tokens = [*sp.encode(text.lower())[:63], sp.eos_id()]
        ids[i, : len(tokens)] = tokens
    (pooled,) = session.run(["pooler_output"], {"input_ids": ids})
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


async def measure(backend: Any, corpus: list[str], per_call: int, reps: int) -> dict[str, Any]:
    loaded = backend._loaded
    session, sp = loaded.model.session, loaded.tokenizer.processor
    calls = [corpus[i : i + per_call] for i in range(0, len(corpus), per_call)]
    a: list[float] = []
    f: list[float] = []
    for rep in range(reps):
        spent = {"agentik": 0, "hand": 0}
        for i, call in enumerate(calls):  # A/B call by call: the load here drifts within seconds
            for side in ("agentik", "hand") if (rep + i) % 2 == 0 else ("hand", "agentik"):
                t0 = pc()
                if side == "agentik":
                    await backend.embed(call)
                else:
                    by_hand(session, sp, call)
                spent[side] += pc() - t0
        a.append(len(corpus) / (spent["agentik"] / 1e9))
        f.append(len(corpus) / (spent["hand"] / 1e9))
    same = np.abs(await backend.embed(calls[0]) - by_hand(session, sp, calls[0])).max()
    return {"agentik": stats(a), "hand": stats(f), "max_abs_diff": float(same)}


async def thread_round_trip(n: int) -> dict[str, float]:
    """µs for the loop to hand an empty function to a one-worker executor and get it back: what
    every ``embed`` call pays to keep the model off the event loop."""
    executor = concurrent.futures.ThreadPoolExecutor(1)
    loop = asyncio.get_running_loop()
    out = []
    try:
        for _ in range(n):
            t0 = pc()
            await loop.run_in_executor(executor, int)
            out.append((pc() - t0) / 1e3)
    finally:
        executor.shutdown()
    return stats(out)


async def main(args: Any) -> dict[str, Any]:
    reps = common.repeats(args, 7, 2)
    tmp = common.tmpdir()
    shapes = {
        "tiny": (tiny.MODEL, tiny.TOKENIZER, 512),
        "wide": (tmp / "wide.onnx", tmp / "wide.model", 64),
    }
    tiny.build(shapes["wide"][0], shapes["wide"][1], hidden=768, heads=12, mlp=3072, dimension=768)
    plugins = make_plugins()
    rows: list[dict[str, Any]] = []
    raw: dict[str, Any] = {}
    for name, (model, tokenizer, n) in shapes.items():
        corpus = texts(n, seed=12)
        for threads in (1, 2):
            settings = load_settings(
                plugins,
                {
                    "AGENTIK_EMBEDDING_MODEL_PATH": str(model),
                    "AGENTIK_EMBEDDING_TOKENIZER_PATH": str(tokenizer),
                    "AGENTIK_EMBEDDING_THREADS": str(threads),
                },
            )
            backend = registries(plugins)["embedding"].create("siglip", settings)
            await backend.start()
            try:
                await backend.embed(corpus[:32])  # warm the session
                for per_call in (1, 32, 256):
                    r = await measure(backend, corpus, per_call, reps)
                    raw[f"{name}/t{threads}/{per_call}"] = r
                    ratio = r["agentik"]["median"] / r["hand"]["median"]
                    rows.append(
                        row(
                            f"{name} (dim {backend.dimension}), {threads} thread(s), "
                            f"{min(per_call, n)} text(s) per call",
                            r["agentik"],
                            r["hand"],
                            unit="texts/s",
                            target=f"≥ {RATIO_TARGET}x by hand",
                            met=ratio >= RATIO_TARGET,
                            note=f"max |agentik - by hand| {r['max_abs_diff']:.1e}",
                        )
                    )
            finally:
                await backend.close()
    rows.append(
        row(
            "thread round trip per call (an empty function on a one-worker executor)",
            await thread_round_trip(500),
            unit="µs",
            target="(info)",
            note="the part of a call's cost that does not shrink with the model",
        )
    )
    return {
        "id": "B12S",
        "title": "siglip embedding throughput",
        "rows": rows,
        "notes": [
            f"{reps} repeats per row, A/B alternating call by call; texts/s over all calls of "
            "a repeat; "
            "by hand = the backend's own InferenceSession, synchronous on the calling thread",
            "tiny = tests/models/tiny_siglip_text.onnx (hidden 32); wide = hidden 768, one "
            "encoder layer (about 1/12 of SigLIP2-base's compute per text)",
        ],
        "raw": raw,
    }


if __name__ == "__main__":
    common.cli(main)
