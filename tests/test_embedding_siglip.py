"""The ``siglip`` embedding backend on the real onnxruntime and sentencepiece.

``tests/models/tiny_siglip_text.onnx`` and ``tiny_siglip.model`` are built by
``tools/build_tiny_siglip.py``: a text tower of the same signature as the SigLIP2 ONNX export
(``input_ids`` int64 in, ``pooler_output`` out), random weights, a BPE SentencePiece model with
Gemma's special ids. The vectors are checked against a numpy forward pass written here from
the same ONNX weights and SigLIP2's preprocessing as documented (docs/embedding_siglip.md),
not from the backend's code.

Without onnxruntime/sentencepiece the module is skipped, visibly, except under ``CI=true``.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import numpy as np
    import onnx
    import onnxruntime  # noqa: F401 - the backend needs it
    import sentencepiece as spm
    from onnx import TensorProto, helper, numpy_helper
except ImportError as e:  # never a silent skip: CI must have them
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        raise RuntimeError(f"the siglip extra is required under CI: {e}") from e
    pytest.skip(f"{e}; pip install 'agentik-runtime[siglip]' onnx", allow_module_level=True)

from agentik.core.app import load_settings, registries
from agentik.core.embedding import EmbeddingBackend, EmbeddingError
from agentik.core.plugins import StartupError, make_plugins
from agentik.core.settings import SettingsError

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "tests" / "models" / "tiny_siglip_text.onnx"
TOKENIZER = ROOT / "tests" / "models" / "tiny_siglip.model"
BIN = Path(sys.executable).parent
LENGTH = 64  # SigLIP2's text length
PAD, EOS, BOS = 0, 1, 2  # Gemma's ids, which the tiny tokenizer copies

TEXTS = [
    "The user's sister lives in Paris.",
    "the user's sister lives in paris.",  # the same once lowercased
    "Coffee with milk, no sugar",
    "",
    "Ünïcode café ☕ and emoji 🚀",
    " ".join(["the train to berlin leaves at half past eight"] * 12),  # far over 64 tokens
]


def create(**env: str) -> EmbeddingBackend:
    """The backend as start-up builds it: the plugin's registered factory, with settings."""
    plugins = make_plugins()
    settings = load_settings(plugins, env)
    backend: EmbeddingBackend = registries(plugins)["embedding"].create("siglip", settings)
    return backend


@pytest.fixture
async def siglip():
    backend = create(
        AGENTIK_EMBEDDING_MODEL_PATH=str(MODEL),
        AGENTIK_EMBEDDING_TOKENIZER_PATH=str(TOKENIZER),
        AGENTIK_EMBEDDING_THREADS="1",
    )
    await backend.start()
    yield backend
    await backend.close()


# --- the reference: SigLIP2's preprocessing and the tiny tower, in plain numpy -------------


def reference_ids(texts: list[str]) -> np.ndarray:
    sp = spm.SentencePieceProcessor(model_file=str(TOKENIZER))
    rows = []
    for text in texts:
        ids = [*sp.encode(text.lower())[: LENGTH - 1], EOS]  # no BOS; EOS kept on truncation
        rows.append(ids + [PAD] * (LENGTH - len(ids)))  # right padding to 64
    return np.array(rows, dtype=np.int64)


def layer_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-6) * scale + bias


def reference_vectors(texts: list[str]) -> np.ndarray:
    w = {
        t.name: numpy_helper.to_array(t).astype(np.float64)
        for t in onnx.load(MODEL).graph.initializer
    }
    heads = int(w["heads_shape"][2])
    ids = reference_ids(texts)
    x = w["token_embedding"][ids] + w["position_embedding"][:LENGTH]
    h = layer_norm(x, w["ln1_scale"], w["ln1_bias"])

    def split(name: str) -> np.ndarray:  # (batch, seq, hidden) -> (batch, heads, seq, dim)
        y = h @ w[f"{name}_weight"] + w[f"{name}_bias"]
        return y.reshape(len(texts), LENGTH, heads, -1).transpose(0, 2, 1, 3)

    q, k, v = split("q"), split("k"), split("v")
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])  # no mask: pads are attended
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    attended = (probs @ v).transpose(0, 2, 1, 3).reshape(len(texts), LENGTH, -1)
    x = x + attended @ w["o_weight"] + w["o_bias"]
    fc1 = layer_norm(x, w["ln2_scale"], w["ln2_bias"]) @ w["fc1_weight"] + w["fc1_bias"]
    gelu = 0.5 * fc1 * (1 + np.vectorize(math.erf)(fc1 / np.sqrt(2)))
    x = x + gelu @ w["fc2_weight"] + w["fc2_bias"]
    last = layer_norm(x, w["final_ln_scale"], w["final_ln_bias"])[:, -1, :]  # the last position
    pooled = last @ w["head_weight"] + w["head_bias"]
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)  # SigLIP2 compares unit vectors


# --- behaviour ------------------------------------------------------------------------------


async def test_vectors_match_the_numpy_reference(siglip):
    texts = TEXTS * 7  # 42 texts: more than one batch of 32
    got = await siglip.embed(texts)
    assert got.dtype == np.float32 and got.shape == (len(texts), 24)
    np.testing.assert_allclose(got, reference_vectors(texts), atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


async def test_the_dimension_is_read_from_the_model(siglip):
    assert siglip.dimension == 24  # the tiny head's width; 768 for SigLIP2 base
    assert siglip.name == "siglip" and siglip.model == MODEL.name
    assert (await siglip.embed([])).shape == (0, 24)


async def test_preprocessing_follows_siglip2(siglip):
    ids = siglip._loaded.tokenizer.encode(["Hello World", TEXTS[5]])
    assert ids.shape == (2, LENGTH) and ids.dtype == np.int64
    short = list(ids[0])
    end = short.index(EOS)
    assert BOS not in short and PAD not in short[:end] and set(short[end + 1 :]) == {PAD}
    assert ids[1, -1] == EOS and PAD not in ids[1]  # truncated to 63 tokens + EOS
    np.testing.assert_array_equal(ids, reference_ids(["Hello World", TEXTS[5]]))
    same, other, cased = await siglip.embed(["The Cat SAT", "the dog sat", "the cat sat"])
    np.testing.assert_allclose(same, cased, atol=1e-6)  # lowercased before tokenizing
    assert np.abs(same - other).max() > 1e-3  # and the words matter


async def test_inference_runs_off_the_event_loop_and_calls_queue(siglip):
    ticks = 0
    done = False

    async def heartbeat():
        nonlocal ticks
        while not done:
            ticks += 1
            await asyncio.sleep(0)

    beat = asyncio.create_task(heartbeat())
    await asyncio.sleep(0)
    first = ticks
    texts = [f"note number {i} about the garden" for i in range(300)]
    together = await asyncio.gather(*(siglip.embed(texts[i::3]) for i in range(3)))
    done = True
    await beat
    assert ticks > first + 1  # the loop ran while the model did
    alone = await siglip.embed(texts[1::3])
    np.testing.assert_array_equal(together[1], alone)


async def test_embed_before_start_or_after_close_is_an_embedding_error(siglip):
    fresh = create(
        AGENTIK_EMBEDDING_MODEL_PATH=str(MODEL), AGENTIK_EMBEDDING_TOKENIZER_PATH=str(TOKENIZER)
    )
    with pytest.raises(EmbeddingError, match="not started"):
        await fresh.embed(["x"])
    await siglip.close()
    with pytest.raises(EmbeddingError, match="not started"):
        await siglip.embed(["x"])


# --- bad files: one start-up line naming the variable ---------------------------------------


def tiny_graph(path: Path, inputs: list[str], output: str) -> Path:
    """A valid ONNX model of the wrong signature."""
    graph = helper.make_graph(
        [
            helper.make_node("Identity", [inputs[0]], ["hidden"]),
            helper.make_node("Cast", ["hidden"], [output], to=TensorProto.FLOAT),
        ],
        "wrong",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["b", "s"]) for n in inputs],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["b", "s"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def start_error(model: Path, tokenizer: Path) -> str:
    backend = create(
        AGENTIK_EMBEDDING_MODEL_PATH=str(model), AGENTIK_EMBEDDING_TOKENIZER_PATH=str(tokenizer)
    )
    with pytest.raises(StartupError) as caught:
        asyncio.run(backend.start())
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_bad_files_are_one_line_naming_the_variable(tmp_path):
    missing = tmp_path / "nope.onnx"
    assert start_error(missing, TOKENIZER) == (
        f"AGENTIK_EMBEDDING_MODEL_PATH={str(missing)!r}: no such file"
    )
    assert start_error(tmp_path, TOKENIZER).endswith("is a directory, not a file")
    text = tmp_path / "text_model_int8.onnx"
    text.write_text("this is not a model\n" * 20)
    assert start_error(text, TOKENIZER).startswith(
        f"AGENTIK_EMBEDDING_MODEL_PATH={str(text)!r}: not an ONNX model onnxruntime can load ("
    )
    with_mask = tiny_graph(tmp_path / "mask.onnx", ["input_ids", "attention_mask"], "pooler_output")
    assert start_error(with_mask, TOKENIZER).endswith(
        ": takes input_ids (tensor(int64)), attention_mask (tensor(int64)); "
        "a SigLIP2 text model takes input_ids (int64) alone"
    )
    no_pool = tiny_graph(tmp_path / "nopool.onnx", ["input_ids"], "logits")
    assert start_error(no_pool, TOKENIZER).endswith(
        ": has outputs logits; a SigLIP2 text model has pooler_output"
    )
    gone = tmp_path / "tokenizer.model"
    assert start_error(MODEL, gone) == (
        f"AGENTIK_EMBEDDING_TOKENIZER_PATH={str(gone)!r}: no such file"
    )
    assert start_error(MODEL, MODEL).startswith(
        f"AGENTIK_EMBEDDING_TOKENIZER_PATH={str(MODEL)!r}: not a SentencePiece model ("
    )


def test_the_factory_names_the_missing_variables():
    with pytest.raises(
        SettingsError,
        match=r"^AGENTIK_EMBEDDING_MODEL_PATH, AGENTIK_EMBEDDING_TOKENIZER_PATH must be set$",
    ):
        create()
    with pytest.raises(SettingsError, match="AGENTIK_EMBEDDING_THREADS"):
        create(AGENTIK_EMBEDDING_THREADS="0")


# --- agentik plugins --------------------------------------------------------------------------


def plugins_report(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AGENTIK_")}
    out = subprocess.run(
        [str(BIN / "agentik"), "plugins", "--json"],
        capture_output=True,
        text=True,
        env=clean | env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return {p["name"]: p for p in json.loads(out.stdout)["plugins"]}["agentik_embedding_siglip"]


def test_agentik_plugins_shows_the_model_or_what_is_wrong(tmp_path):
    report = plugins_report(
        AGENTIK_EMBEDDING_MODEL_PATH=str(MODEL), AGENTIK_EMBEDDING_TOKENIZER_PATH=str(TOKENIZER)
    )
    assert [(b["kind"], b["name"], b["available"]) for b in report["backends"]] == [
        ("embedding", "siglip", True)
    ]
    assert {s["name"]: s["value"] for s in report["settings"]} == {
        "AGENTIK_EMBEDDING_MODEL_PATH": str(MODEL),
        "AGENTIK_EMBEDDING_TOKENIZER_PATH": str(TOKENIZER),
        "AGENTIK_EMBEDDING_THREADS": "2",
    }
    assert report["details"] == {
        "model": str(MODEL),
        "tokenizer": str(TOKENIZER),
        "dimension": 24,
        "input": "input_ids (int64)",
        "output": "pooler_output",
        "sequence_length": 64,
        "vocabulary": 300,
    }
    broken = plugins_report(
        AGENTIK_EMBEDDING_MODEL_PATH=str(MODEL),
        AGENTIK_EMBEDDING_TOKENIZER_PATH=str(tmp_path / "tokenizer.model"),
    )
    assert broken["details"]["error"] == (
        f"AGENTIK_EMBEDDING_TOKENIZER_PATH={str(tmp_path / 'tokenizer.model')!r}: no such file"
    )
    assert plugins_report()["details"] is None  # not configured: nothing to say


def test_details_name_what_is_missing_once_siglip_is_chosen():
    import agentik_embedding_siglip as plugin
    from agentik.core.settings import Setting, Settings

    chooser = Setting("AGENTIK_EMBEDDING_BACKEND")  # the core's switch
    settings = Settings([*plugin.SETTINGS, chooser], {"AGENTIK_EMBEDDING_BACKEND": "siglip"})
    assert plugin.plugin_details(settings) == {
        "model": None,
        "tokenizer": None,
        "error": "AGENTIK_EMBEDDING_MODEL_PATH, AGENTIK_EMBEDDING_TOKENIZER_PATH must be set",
    }
    other = Settings([*plugin.SETTINGS, chooser], {"AGENTIK_EMBEDDING_BACKEND": "http"})
    assert plugin.plugin_details(other) is None
