"""Build ``tests/models/tiny.litertlm``: a tiny, deterministic LiteRT-LM model for the tests.

No model hub is reachable from the test machines, so the ``llm_litert`` tests run the real
LiteRT-LM engine on a model this script builds: a decoder-only transformer (2 layers, d=64,
4 heads, a byte-fallback SentencePiece vocabulary of 400 pieces, context 128) whose weights
are *set*, not trained, so that its answers are exact:

- to any prompt it answers :data:`REPLY` and stops;
- if a user message contains :data:`TRIGGER` (``/tool``), it instead calls the tool
  ``echo`` with ``{"text": "hi"}`` in qwen3's format (``<tool_call>{json}</tool_call>``,
  parsed by the runtime into a tool call: the model type in the metadata is qwen3), and once
  a tool response is in its context it answers :data:`REPLY` again.

How the weights do it: the feed-forward layers and layer 1 are zero, and so is most of layer
0's attention, so the residual stream at a position is mostly its token's embedding and the
model is a bigram table. Each token of the two replies ``r0 … rn`` gets a one-hot feature and
the LM head maps ``ri`` to ``r(i+1)`` and ``rn`` to the stop token ``<|im_end|>``. Two
attention heads look for a marker token (the trigger, ``<tool_response>``) anywhere in the
context, in the head dimensions RoPE leaves alone (``rotary_percentage=0.5``), and write a
"seen" feature; where no reply is under way, the LM head starts the tool call if the trigger
was seen and no tool response yet, otherwise the text reply. The torch model is checked on
the three cases before export. Decoding is greedy: sampler ``TOP_P`` with k=1 in the
metadata.

Regenerate (the toolchain is heavy and optional; the tests need only ``litert-lm-api``)::

    python3.11 -m venv /tmp/litert-build
    /tmp/litert-build/bin/pip install torch==2.13.0          # first: the CPU wheel, no CUDA
    /tmp/litert-build/bin/pip install litert-torch==0.10.0 litert-lm-builder==0.18.1 sentencepiece
    /tmp/litert-build/bin/python tools/build_tiny_litertlm.py      # about 10-20 s, one process

Facts this relies on (litert-lm 0.18, litert-torch 0.10):

- ``litert_torch/generative/layers/lora.py`` imports
  ``tensorflow.lite.python.schema_py_generated``; ``ai_edge_litert.schema_py_generated`` is
  the same schema and stands in for it, so TensorFlow is not needed.
- The KV cache must be exported with ``KV_LAYOUT_TRANSPOSED``: the runtime reads the context
  size from dim 2 of ``kv_cache_k_*``; with the default layout every prompt is "too long".
- The sampler in the metadata must be ``TOP_P`` (k=1 for greedy): ``TOP_K`` is not
  implemented on CPU.
- A byte-fallback SentencePiece vocabulary needs at least 400 pieces here (256 bytes + the
  specials + some learned pieces). Its normaliser is ``identity``: the default NFKC table
  alone would be 240 KB of the file.
- The runtime needs a prefill signature that fits in the free part of the KV cache: with only
  a 128-token one the second turn fails with ``FAILED_PRECONDITION: Chosen prefill work group
  size exceeds available state entries``; hence signatures of 8 and 32 tokens. Each costs a
  64 KB mask table in the file.
- ``dynamic_int8`` (the default here) keeps the file near 420 KB; ``none`` is about 800 KB.
- Without a cache dir the engine writes ``<model>_*.xnnpack_cache`` next to the model
  (``tests/models/.gitignore`` ignores it; the tests pass ``AGENTIK_GOOGLE_CACHE_DIR``).
- The build is not byte-for-byte reproducible (the tokenizer and converter differ run to
  run), but the model's behaviour is: the torch checks and the tests pin it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "models" / "tiny.litertlm"

#: What the tiny model answers, to every prompt.
REPLY = "Hello from the tiny model."
VOCAB_SIZE = 400
# Prefill signatures. The runtime needs a signature whose length fits in the free part of the
# KV cache: with only a 128-token one the second turn fails ("Chosen prefill work group size
# exceeds available state entries"). Each signature costs a 64 KB mask table in the file.
PREFILL_LENGTHS = [8, 32]
CONTEXT = 128
EMBED_DIM = 64
NUM_LAYERS = 2
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
#: A user message with this word gets a tool call instead of the text reply (until a tool
#: response is in the context).
TRIGGER = "/tool"
#: The tool call the model makes, in qwen3's format (which the runtime parses).
TOOL_NAME = "echo"
TOOL_ARGS = {"text": "hi"}
TOOL_JSON = '{"name":"echo","arguments":{"text":"hi"}}'
SPECIALS = [
    IM_START,
    IM_END,
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    TRIGGER,
    TOOL_JSON,
]

# A qwen-like chat template; the runtime renders it with minja. Newlines are written as
# {{ nl }} because every tag trims the whitespace around it.
JINJA_TEMPLATE = (
    "{%- set nl = '\\n' -%}"
    "{%- for message in messages -%}"
    "{%- if message.content is string -%}{%- set text = message.content -%}"
    "{%- else -%}{%- set text = namespace(v='') -%}"
    "{%- for item in message.content -%}"
    "{%- if item.type == 'text' -%}{%- set text.v = text.v + item.text -%}"
    "{%- elif item.type == 'tool_response' -%}"
    "{%- set text.v = text.v + (item.response | string) -%}{%- endif -%}"
    "{%- endfor -%}{%- set text = text.v -%}{%- endif -%}"
    "{%- if message.role == 'tool' -%}"
    "<|im_start|>user{{ nl }}<tool_response>{{ nl }}{{ text }}{{ nl }}</tool_response>"
    "<|im_end|>{{ nl }}"
    "{%- else -%}"
    "<|im_start|>{{ message.role }}{{ nl }}{{ text }}"
    "{%- if message.tool_calls is defined and message.tool_calls -%}"
    "{%- for call in message.tool_calls -%}"
    "<tool_call>{{ call.function.name }}</tool_call>"  # short: the context is 128 tokens
    "{%- endfor -%}{%- endif -%}"
    "<|im_end|>{{ nl }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant{{ nl }}{%- endif -%}"
)


def _import_lora_without_tensorflow() -> None:
    """Import litert_torch's lora.py (it wants TensorFlow's TFLite schema) without TensorFlow.

    The stand-in modules exist only while lora.py imports: left in ``sys.modules``, a
    ``tensorflow`` without a spec breaks ``torch._dynamo``'s import checks.
    """
    import litert_torch  # noqa: F401
    import torch._dynamo  # noqa: F401 - before the stand-ins (it probes for tensorflow)

    schema = importlib.import_module("ai_edge_litert.schema_py_generated")
    names = ("tensorflow", "tensorflow.lite", "tensorflow.lite.python")
    stubs = {name: type(sys)(name) for name in names if name not in sys.modules}
    stubs["tensorflow.lite.python.schema_py_generated"] = schema
    if "tensorflow.lite.python" in stubs:
        stubs["tensorflow.lite.python"].schema_py_generated = schema  # type: ignore[attr-defined]
    sys.modules.update(stubs)
    try:
        importlib.import_module("litert_torch.generative.layers.lora")
    finally:
        for name in stubs:
            sys.modules.pop(name, None)


def train_tokenizer(workdir: Path) -> Path:
    import sentencepiece as spm

    corpus = workdir / "corpus.txt"
    words = [
        "hello",
        "from",
        "the",
        "tiny",
        "model",
        "agentik",
        "chat",
        "tool",
        "call",
        "result",
        "user",
        "assistant",
        "system",
        "what",
        "time",
        "is",
        "it",
        "please",
        "answer",
        "the",
        "question",
        "with",
        "a",
        "short",
        "reply",
        "thanks",
        "and",
        "you",
        "one",
        "two",
        "three",
        "four",
        "five",
        "six",
        "seven",
        "eight",
        "nine",
        "ten",
        "echo",
        "text",
        "weather",
        "city",
        "name",
    ]
    lines = [REPLY] * 50
    for i in range(400):
        lines.append(" ".join(words[(i * 7 + j) % len(words)] for j in range(8)))
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    prefix = workdir / "tiny_sp"
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(prefix),
        vocab_size=VOCAB_SIZE,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=1.0,
        add_dummy_prefix=False,
        normalization_rule_name="identity",  # no NFKC table: it would be most of the file
        remove_extra_whitespaces=False,
        user_defined_symbols=SPECIALS,
        pad_id=0,
        unk_id=1,
        bos_id=2,
        eos_id=3,
        num_threads=1,
        minloglevel=2,
    )
    return prefix.with_suffix(".model")


# residual-stream dimensions (d=64): 0 is 1 for every token; 1.. are the reply chains'
# one-hot features; the rest carry the trigger and tool-response markers and switches
D_CONST, D_TRIGGER, D_RESPONSE, D_SAW_TRIGGER, D_SAW_RESPONSE = 0, 60, 61, 62, 63
HEAD_DIM = 16
UNROTATED = 8  # rotary_percentage 0.5: dims 8-15 of each head are not rotated by RoPE


def build_model(chains: list[list[int]], stop_id: int, trigger: int, response: int):
    """Weights for the bigram chains plus two marker-detecting attention heads.

    ``chains[0]`` is the text reply, ``chains[1]`` the tool call. Layer 0's head 0 attends to
    the trigger token (if the context has one) and writes D_SAW_TRIGGER; head 1 does the same
    for the tool-response token into D_SAW_RESPONSE. Where no chain is running, the LM head
    then picks the tool call's first token if the trigger was seen and no tool response yet,
    otherwise the text reply's.
    """
    import torch
    from litert_torch.generative.layers import model_config as cfg
    from litert_torch.generative.utilities import model_builder

    norm = cfg.NormalizationConfig(type=cfg.NormalizationType.RMS_NORM, epsilon=1e-6)
    attn = cfg.AttentionConfig(
        num_heads=4,
        head_dim=HEAD_DIM,
        num_query_groups=4,
        rotary_base=10000,
        rotary_percentage=0.5,
        qkv_use_bias=False,
    )
    ff = cfg.FeedForwardConfig(
        type=cfg.FeedForwardType.GATED,
        activation=cfg.ActivationConfig(cfg.ActivationType.SILU),
        intermediate_size=64,
    )
    block = cfg.TransformerBlockConfig(
        attn_config=attn,
        ff_config=ff,
        pre_attention_norm_config=norm,
        post_attention_norm_config=norm,
    )
    config = cfg.ModelConfig(
        vocab_size=VOCAB_SIZE,
        num_layers=NUM_LAYERS,
        max_seq_len=CONTEXT,
        embedding_dim=EMBED_DIM,
        block_configs=block,
        final_norm_config=norm,
        lm_head_use_bias=True,
        lm_head_share_weight_with_embedding=False,
    )
    model = model_builder.DecoderOnlyModel(config, mask_cache_size=CONTEXT)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.fill_(1.0)  # RMS norm scales (a zero scale would erase the residual)
        emb = model.tok_embedding.weight
        head_w, head_b = model.lm_head.weight, model.lm_head.bias
        emb[:, D_CONST] = 1.0
        dim = 1
        for chain in chains:
            for i, tok in enumerate(chain):
                assert emb[tok, 1:D_TRIGGER].abs().sum() == 0, "a token is in two chains"
                emb[tok, dim] = 1.0
                nxt = chain[i + 1] if i + 1 < len(chain) else stop_id
                head_w[nxt, dim] = 50.0
                dim += 1
        assert dim < D_TRIGGER, "the replies are too long for one-hot features"
        emb[trigger, D_TRIGGER] = 1.0
        emb[response, D_RESPONSE] = 1.0
        # layer 0: head h looks for its marker; q and k live in the unrotated dims
        att = model.transformer_blocks[0].atten_func
        qkv, out = att.qkv_projection.weight, att.output_projection.weight
        for h, (marker, saw) in enumerate(
            [(D_TRIGGER, D_SAW_TRIGGER), (D_RESPONSE, D_SAW_RESPONSE)]
        ):
            base = h * 3 * HEAD_DIM  # this head's [q | k | v] rows
            qkv[base + UNROTATED, D_CONST] = 1.6
            qkv[base + HEAD_DIM + UNROTATED, marker] = 1.6
            qkv[base + 2 * HEAD_DIM, marker] = 1.0
            out[saw, h * HEAD_DIM] = 0.2
        text0, call0 = chains[0][0], chains[1][0]
        head_w[text0, D_CONST] = 1.0
        head_b[text0] = 0.5  # the text reply, unless a switch says otherwise
        head_w[call0, D_CONST] = 1.0
        head_w[call0, D_SAW_TRIGGER] = 4.0
        head_w[text0, D_SAW_RESPONSE] = 8.0
    model.eval()
    return model, config


def greedy(model, prompt: list[int], stop_id: int, limit: int = 12) -> list[int]:
    """Run the torch model greedily (no cache): the tokens up to and including the stop."""
    import torch
    from litert_torch.generative.layers import kv_cache as kv_utils

    tokens = list(prompt)
    out: list[int] = []
    for _ in range(limit):
        kv = kv_utils.KVCache.from_model_config(CONTEXT, model.config)
        t = torch.tensor([tokens], dtype=torch.int)
        pos = torch.arange(0, len(tokens), dtype=torch.int)
        nxt = int(model(t, pos, kv)["logits"][0, -1].argmax())
        out.append(nxt)
        tokens.append(nxt)
        if nxt == stop_id:
            break
    return out


def build(out: Path, quantize: str) -> None:
    _import_lora_without_tensorflow()
    import sentencepiece as spm
    import torch
    from litert_lm_builder import litertlm_builder as lb
    from litert_lm_builder.runtime.proto import (
        llm_metadata_pb2,
        llm_model_type_pb2,
        sampler_params_pb2,
    )
    from litert_torch.generative.layers import kv_cache as kv_utils
    from litert_torch.generative.utilities import converter, export_config

    torch.manual_seed(0)
    workdir = Path(tempfile.mkdtemp(prefix="tiny-litertlm-"))
    try:
        sp_path = train_tokenizer(workdir)
        sp = spm.SentencePieceProcessor(model_file=str(sp_path))
        assert sp.get_piece_size() == VOCAB_SIZE
        reply_ids = sp.encode(REPLY)
        assert sp.decode(reply_ids) == REPLY
        assert len(set(reply_ids)) == len(reply_ids), f"reply tokens repeat: {reply_ids}"
        call_ids = [sp.piece_to_id(p) for p in ("<tool_call>", TOOL_JSON, "</tool_call>")]
        stop_id = sp.piece_to_id(IM_END)
        trigger, response = sp.piece_to_id(TRIGGER), sp.piece_to_id("<tool_response>")
        print(f"reply tokens: {[sp.id_to_piece(i) for i in reply_ids]}; stop {stop_id}")

        model, config = build_model([reply_ids, call_ids], stop_id, trigger, response)
        turn = f"{IM_START}user\n{{}}{IM_END}\n{IM_START}assistant\n"
        said = turn.format("hi")
        asked = turn.format(f"{TRIGGER} hi")
        called = (
            f"{asked}<tool_call>{TOOL_JSON}</tool_call>{IM_END}\n"
            f"{IM_START}user\n<tool_response>\nhi\n</tool_response>{IM_END}\n"
            f"{IM_START}assistant\n"
        )
        for prompt, want in ((said, reply_ids), (asked, call_ids), (called, reply_ids)):
            got = greedy(model, sp.encode(prompt), stop_id)
            assert got == [*want, stop_id], f"{prompt!r}: {sp.decode(got)!r}"

        ecfg = export_config.ExportConfig()
        ecfg.kvcache_layout = kv_utils.KV_LAYOUT_TRANSPOSED
        tflite = converter.convert_to_tflite(
            model,
            output_path=str(workdir),
            output_name_prefix="tiny",
            prefill_seq_len=PREFILL_LENGTHS,
            kv_cache_max_len=CONTEXT,
            quantize=quantize,
            config=config,
            export_config=ecfg,
        )

        meta = llm_metadata_pb2.LlmMetadata()
        meta.start_token.token_ids.ids.append(sp.bos_id())
        meta.stop_tokens.add().token_ids.ids.append(stop_id)
        meta.stop_tokens.add().token_ids.ids.append(sp.eos_id())
        meta.prompt_templates.user.prefix = f"{IM_START}user\n"
        meta.prompt_templates.user.suffix = f"{IM_END}\n"
        meta.prompt_templates.model.prefix = f"{IM_START}assistant\n"
        meta.prompt_templates.model.suffix = f"{IM_END}\n"
        meta.prompt_templates.system.prefix = f"{IM_START}system\n"
        meta.prompt_templates.system.suffix = f"{IM_END}\n"
        meta.max_num_tokens = CONTEXT
        meta.sampler_params.type = sampler_params_pb2.SamplerParameters.TOP_P
        meta.sampler_params.k = 1
        meta.sampler_params.p = 1.0
        meta.sampler_params.temperature = 1.0
        meta.sampler_params.seed = 0
        # qwen3: the runtime parses <tool_call>{json}</tool_call> into tool calls
        meta.llm_model_type.CopyFrom(
            llm_model_type_pb2.LlmModelType(qwen3=llm_model_type_pb2.Qwen3())
        )
        meta.supports_function_calling = True
        meta.jinja_prompt_template = JINJA_TEMPLATE
        meta_path = workdir / "llm_metadata.pb"
        meta_path.write_bytes(meta.SerializeToString())

        builder = lb.LitertLmFileBuilder()
        builder.add_system_metadata(
            lb.Metadata(key="Authors", value="agentik tests", dtype=lb.DType.STRING)
        )
        builder.add_llm_metadata(str(meta_path))
        builder.add_sentencepiece_tokenizer(str(sp_path))
        builder.add_tflite_model(tflite, lb.TfLiteModelType.PREFILL_DECODE)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            builder.build(f)
        os.replace(tmp, out)
        print(f"wrote {out} ({out.stat().st_size} bytes)")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--quantize",
        default="dynamic_int8",
        help="litert-torch quantization: none, fp16, dynamic_int8",
    )
    args = parser.parse_args(argv)
    build(args.out, args.quantize)


if __name__ == "__main__":
    main()
