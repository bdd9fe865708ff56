"""Build ``tests/models/tiny_siglip_text.onnx`` and ``tests/models/tiny_siglip.model``.

No model hub is reachable from the test machines, so the ``siglip`` embedding tests run the
real onnxruntime and sentencepiece on a tiny model of the same *signature* as the exported
SigLIP2 text tower (``text_model*.onnx`` of the ONNX exports of ``google/siglip2-*``):

- one input ``input_ids``, int64, shape ``(batch_size, sequence_length)`` - no
  ``attention_mask`` (optimum's ``SiglipTextOnnxConfig``: inputs ``input_ids`` only);
- outputs ``last_hidden_state`` ``(batch_size, sequence_length, hidden)`` and
  ``pooler_output`` ``(batch_size, dimension)``, not normalised;
- the same computation in miniature (``Siglip2TextTransformer``): token embedding + learned
  position embedding, one pre-LayerNorm encoder layer (self-attention (4 heads) without a
  mask, then a GELU MLP, each with a residual), the final LayerNorm, the *last position*
  pooled (``last_hidden_state[:, -1, :]``, a pad position for short texts), then the linear
  ``head``. Attention is what lets the last position see the text, as in the real model.

The weights are random (seeded), not trained: the tests compare the backend's vectors with a
numpy reference computed from these same weights, not with meanings.

The tokenizer is a SentencePiece BPE model (like Gemma's, which SigLIP2 uses) trained on a few
lines below, with Gemma's special ids: ``<pad>`` 0, ``</s>`` (eos) 1, ``<s>`` (bos) 2,
``<unk>`` 3, identity normalisation and no dummy prefix.

Regenerate with ``make tiny-siglip`` (onnx and sentencepiece come with ``make install-test``);
the output is the same bytes every time.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import onnx
import sentencepiece as spm
from onnx import TensorProto, helper, numpy_helper

OUT = Path(__file__).resolve().parent.parent / "tests" / "models"
MODEL = OUT / "tiny_siglip_text.onnx"
TOKENIZER = OUT / "tiny_siglip.model"
HIDDEN = 32
HEADS = 4
MLP = 64
DIMENSION = 24  # the head's output: what the backend must read from the model
POSITIONS = 64  # max_position_embeddings of the real text tower
VOCAB = 300
OPSET = 17  # LayerNormalization is in the default domain from 17

CORPUS = """\
the cat sat on the mat and looked at the garden
a dog runs in the park with a red ball
my favourite colour is blue and my sister likes green
we met in paris last spring and walked along the river
the meeting is on monday at ten in the small room
please remember that i am allergic to peanuts
the weather today is cold and rainy in the north
she plays the piano every evening after dinner
coffee with milk and no sugar in the morning
the train to berlin leaves at half past eight
our project uses python sqlite and a small web server
he prefers tea over coffee and reads books about history
"""


def train_tokenizer() -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS.splitlines() * 20),
        model_writer=model,
        vocab_size=VOCAB,
        model_type="bpe",
        character_coverage=1.0,
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        pad_piece="<pad>",
        eos_piece="</s>",
        bos_piece="<s>",
        unk_piece="<unk>",
        normalization_rule_name="identity",
        add_dummy_prefix=False,
        num_threads=1,
        minloglevel=2,
    )
    return model.getvalue()


def weights(
    vocab: int, hidden: int = HIDDEN, heads: int = HEADS, mlp: int = MLP, dimension: int = DIMENSION
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(15)

    def normal(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w = {
        "token_embedding": normal(vocab, hidden, scale=1.0),
        "position_embedding": normal(POSITIONS, hidden, scale=0.1),
        "ln1_scale": 1 + normal(hidden, scale=0.1),
        "ln1_bias": normal(hidden, scale=0.1),
        "ln2_scale": 1 + normal(hidden, scale=0.1),
        "ln2_bias": normal(hidden, scale=0.1),
        "final_ln_scale": 1 + normal(hidden, scale=0.1),
        "final_ln_bias": normal(hidden, scale=0.1),
        "fc1_bias": normal(mlp, scale=0.1),
        "fc2_bias": normal(hidden, scale=0.1),
        "head_bias": normal(dimension, scale=0.1),
        "attn_scale": np.array(1 / np.sqrt(hidden // heads), dtype=np.float32),
        "heads_shape": np.array([0, 0, heads, hidden // heads], dtype=np.int64),
        "merged_shape": np.array([0, 0, hidden], dtype=np.int64),
        "gelu_half": np.array(0.5, dtype=np.float32),
        "gelu_one": np.array(1.0, dtype=np.float32),
        "gelu_sqrt2": np.array(np.sqrt(2.0), dtype=np.float32),
        "zero": np.array([0], dtype=np.int64),
        "one": np.array([1], dtype=np.int64),
        "two": np.array([2], dtype=np.int64),
        "last": np.array(-1, dtype=np.int64),
    }
    qk = 0.3 * (32 / hidden) ** 0.5
    for name in ("q", "k", "v", "o"):
        # q and k large: peaked attention, so the last (pad) position sees the words
        w[f"{name}_weight"] = normal(hidden, hidden, scale=qk if name in "qk" else hidden**-0.5)
        w[f"{name}_bias"] = normal(hidden, scale=0.05)
    w["fc1_weight"] = normal(hidden, mlp, scale=hidden**-0.5)
    w["fc2_weight"] = normal(mlp, hidden, scale=mlp**-0.5)
    w["head_weight"] = normal(hidden, dimension, scale=hidden**-0.5)
    return w


def layer_norm(x: str, weights: str, out: str) -> onnx.NodeProto:
    return helper.make_node(
        "LayerNormalization",
        [x, f"{weights}_scale", f"{weights}_bias"],
        [out],
        axis=-1,
        epsilon=1e-6,  # SigLIP2's layer_norm_eps
    )


def graph(w: dict[str, np.ndarray]) -> onnx.ModelProto:
    node = helper.make_node
    nodes = [
        # embeddings: token lookup + the first sequence_length learned positions
        node("Gather", ["token_embedding", "input_ids"], ["tokens"], axis=0),
        node("Shape", ["input_ids"], ["ids_shape"]),
        node("Slice", ["ids_shape", "one", "two"], ["seq_len"]),
        node("Slice", ["position_embedding", "zero", "seq_len", "zero"], ["positions"]),
        node("Add", ["tokens", "positions"], ["embedded"]),
        # encoder layer: x + attn(ln1(x)), then x + mlp(ln2(x))
        layer_norm("embedded", "ln1", "ln1"),
    ]
    for name in ("q", "k", "v"):
        nodes += [
            node("MatMul", ["ln1", f"{name}_weight"], [f"{name}_mm"]),
            node("Add", [f"{name}_mm", f"{name}_bias"], [name]),
        ]
    for name in ("q", "k", "v"):  # (batch, seq, hidden) -> (batch, heads, seq, head_dim)
        nodes += [
            node("Reshape", [name, "heads_shape"], [f"{name}_split"]),
            node("Transpose", [f"{name}_split"], [f"{name}_heads"], perm=[0, 2, 1, 3]),
        ]
    nodes += [
        node("Transpose", ["k_heads"], ["k_t"], perm=[0, 1, 3, 2]),
        node("MatMul", ["q_heads", "k_t"], ["scores_raw"]),
        node("Mul", ["scores_raw", "attn_scale"], ["scores"]),
        node("Softmax", ["scores"], ["probs"], axis=-1),
        node("MatMul", ["probs", "v_heads"], ["attended_heads"]),
        node("Transpose", ["attended_heads"], ["attended_split"], perm=[0, 2, 1, 3]),
        node("Reshape", ["attended_split", "merged_shape"], ["attended"]),
        node("MatMul", ["attended", "o_weight"], ["o_mm"]),
        node("Add", ["o_mm", "o_bias"], ["attn_out"]),
        node("Add", ["embedded", "attn_out"], ["residual1"]),
        layer_norm("residual1", "ln2", "ln2"),
        node("MatMul", ["ln2", "fc1_weight"], ["fc1_mm"]),
        node("Add", ["fc1_mm", "fc1_bias"], ["fc1"]),
        # exact GELU: 0.5 x (1 + erf(x / sqrt 2))
        node("Div", ["fc1", "gelu_sqrt2"], ["gelu_in"]),
        node("Erf", ["gelu_in"], ["gelu_erf"]),
        node("Add", ["gelu_erf", "gelu_one"], ["gelu_sum"]),
        node("Mul", ["fc1", "gelu_sum"], ["gelu_x"]),
        node("Mul", ["gelu_x", "gelu_half"], ["gelu"]),
        node("MatMul", ["gelu", "fc2_weight"], ["fc2_mm"]),
        node("Add", ["fc2_mm", "fc2_bias"], ["mlp_out"]),
        node("Add", ["residual1", "mlp_out"], ["encoded"]),
        layer_norm("encoded", "final_ln", "last_hidden_state"),
        # pooling: the last position, then the head
        node("Gather", ["last_hidden_state", "last"], ["pooled"], axis=1),
        node("MatMul", ["pooled", "head_weight"], ["head_mm"]),
        node("Add", ["head_mm", "head_bias"], ["pooler_output"]),
    ]
    hidden, dimension = w["head_weight"].shape
    g = helper.make_graph(
        nodes,
        "tiny_siglip2_text",
        [
            helper.make_tensor_value_info(
                "input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]
            )
        ],
        [
            helper.make_tensor_value_info(
                "last_hidden_state", TensorProto.FLOAT, ["batch_size", "sequence_length", hidden]
            ),
            helper.make_tensor_value_info(
                "pooler_output", TensorProto.FLOAT, ["batch_size", dimension]
            ),
        ],
        initializer=[numpy_helper.from_array(v, k) for k, v in sorted(w.items())],
    )
    model = helper.make_model(
        g,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="agentik tools/build_tiny_siglip.py",
    )
    model.ir_version = 8  # readable by every onnxruntime the extra allows
    onnx.checker.check_model(model, full_check=True)
    return model


def build(model: Path, tokenizer: Path, **shape: int) -> None:
    """Write the tokenizer and the model; ``shape`` (hidden, heads, mlp, dimension) makes a wider
    one of the same signature, as the benchmark does."""
    tokenizer.write_bytes(train_tokenizer())
    vocab = spm.SentencePieceProcessor(model_file=str(tokenizer)).get_piece_size()
    onnx.save(graph(weights(vocab, **shape)), model)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    build(MODEL, TOKENIZER)
    print(f"{MODEL}: {MODEL.stat().st_size} bytes; {TOKENIZER}: {TOKENIZER.stat().st_size} bytes")


if __name__ == "__main__":
    main()
