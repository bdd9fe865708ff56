"""SigLIP2 text embeddings with onnxruntime and sentencepiece (imported only when chosen).

The preprocessing is SigLIP2's, from the sources listed in docs/embedding_siglip.md: the text is
lowercased, tokenized with the model's SentencePiece vocabulary (Gemma's) without a
beginning-of-sequence token, cut to 63 tokens, ended with the end-of-sequence token and padded
on the right with the pad id to 64 tokens. The model takes ``input_ids`` alone (no
``attention_mask``: the text tower was trained without one and pools the *last* position,
which is a pad for short texts, so the padding is part of the meaning). Its
``pooler_output`` is not normalised; SigLIP2 compares L2-normalised vectors, and so do we.

Inference runs on one worker thread per backend (calls queue there; onnxruntime's own
``intra_op`` threads do the parallel work), in batches of :data:`BATCH_SIZE` texts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import sentencepiece as spm

from agentik.core.embedding import EmbeddingBackend, EmbeddingError
from agentik.core.plugins import StartupError
from agentik_embedding_siglip import MODEL_PATH, TOKENIZER_PATH

log = logging.getLogger(__name__)

#: the text tower's context (max_position_embeddings), used when the model's input shape is
#: dynamic, as in the published exports
SEQUENCE_LENGTH = 64
#: texts per onnxruntime call: large enough to amortise the call, small enough that a burst of
#: saves does not hold one call for long
BATCH_SIZE = 32
#: the pooled output of an export of the text model, or of a text model with projection
OUTPUT_NAMES = ("pooler_output", "text_embeds")
INPUT_TYPES: dict[str, Any] = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}


def one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    text = lines[0] if lines else type(error).__name__
    return text if len(text) <= 240 else text[:237] + "..."


def check_file(path: Path, where: str) -> None:
    if not path.exists():
        raise StartupError(f"{where}: no such file")
    if path.is_dir():
        raise StartupError(f"{where}: is a directory, not a file")


class Tokenizer:
    """SigLIP2's text preprocessing on a SentencePiece model, into fixed-length id rows."""

    def __init__(self, processor: spm.SentencePieceProcessor, length: int) -> None:
        self.processor = processor
        self.length = length
        self.pad_id = processor.pad_id()
        self.eos_id = processor.eos_id()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        ids = np.full((len(texts), self.length), self.pad_id, dtype=np.int64)
        for row, text in zip(ids, texts, strict=True):
            # one text at a time: encoding a list starts a thread pool, slower for the few
            # texts of a call (bench B12S)
            tokens = self.processor.encode(text.lower())
            # truncation keeps room for the end-of-sequence token, as the HF tokenizer does
            tokens = [*tokens[: self.length - 1], self.eos_id]
            row[: len(tokens)] = tokens
        return ids


def load_tokenizer(path: Path, length: int) -> Tokenizer:
    where = f"{TOKENIZER_PATH}={str(path)!r}"
    check_file(path, where)
    processor = spm.SentencePieceProcessor()
    try:
        processor.Load(str(path))
    except Exception as e:  # OSError or RuntimeError, depending on what is wrong
        raise StartupError(f"{where}: not a SentencePiece model ({one_line(e)})") from e
    if processor.pad_id() < 0 or processor.eos_id() < 0:
        raise StartupError(
            f"{where}: the tokenizer has no pad or no end-of-sequence token; "
            "SigLIP2's tokenizer.model (Gemma's) has both"
        )
    return Tokenizer(processor, length)


@dataclass(frozen=True)
class TextModel:
    session: ort.InferenceSession
    input_type: Any
    output_name: str
    dimension: int
    sequence_length: int


def load_model(path: Path, threads: int) -> TextModel:
    where = f"{MODEL_PATH}={str(path)!r}"
    check_file(path, where)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only: its warnings are about graph optimisation
    # idle intra-op threads sleep instead of spinning: the event loop and the rest of the
    # server share these CPUs (bench B12S)
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise StartupError(
            f"{where}: not an ONNX model onnxruntime can load ({one_line(e)})"
        ) from e
    inputs = {i.name: i for i in session.get_inputs()}
    ids = inputs.get("input_ids")
    if ids is None or set(inputs) != {"input_ids"} or ids.type not in INPUT_TYPES:
        found = ", ".join(f"{i.name} ({i.type})" for i in inputs.values())
        raise StartupError(
            f"{where}: takes {found}; a SigLIP2 text model takes input_ids (int64) alone"
        )
    outputs = {o.name: o for o in session.get_outputs()}
    name = next((n for n in OUTPUT_NAMES if n in outputs), None)
    if name is None:
        raise StartupError(
            f"{where}: has outputs {', '.join(outputs)}; a SigLIP2 text model has pooler_output"
        )
    shape = outputs[name].shape
    if len(shape) != 2 or not isinstance(shape[1], int) or shape[1] <= 0:
        raise StartupError(f"{where}: {name} has shape {shape}, not (batch, dimension)")
    static = len(ids.shape) == 2 and isinstance(ids.shape[1], int) and ids.shape[1] > 0
    return TextModel(
        session,
        INPUT_TYPES[ids.type],
        name,
        shape[1],
        ids.shape[1] if static else SEQUENCE_LENGTH,
    )


@dataclass(frozen=True)
class Loaded:
    """A model and its tokenizer, ready to embed (on one thread at a time)."""

    model: TextModel
    tokenizer: Tokenizer

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        vectors = np.empty((len(texts), self.model.dimension), dtype=np.float32)
        for start in range(0, len(texts), BATCH_SIZE):
            batch = texts[start : start + BATCH_SIZE]
            ids = self.tokenizer.encode(batch).astype(self.model.input_type, copy=False)
            (pooled,) = self.model.session.run([self.model.output_name], {"input_ids": ids})
            vectors[start : start + len(batch)] = pooled
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.maximum(norms, np.float32(1e-12))

    def facts(self) -> dict[str, Any]:
        return {
            "dimension": self.model.dimension,
            "input": f"input_ids ({np.dtype(self.model.input_type).name})",
            "output": self.model.output_name,
            "sequence_length": self.model.sequence_length,
            "vocabulary": self.tokenizer.processor.get_piece_size(),
        }


def load(model_path: Path, tokenizer_path: Path, *, threads: int) -> Loaded:
    """Open and check both files; raise StartupError naming the variable of the bad one."""
    model = load_model(model_path, threads)
    loaded = Loaded(model, load_tokenizer(tokenizer_path, model.sequence_length))
    try:  # a tokenizer of another model may produce ids the model has no embedding for
        loaded.embed(["a trial text to check that the model and its tokenizer go together"])
    except Exception as e:
        raise StartupError(
            f"{MODEL_PATH}={str(model_path)!r} with {TOKENIZER_PATH}={str(tokenizer_path)!r}: "
            f"a trial run failed ({one_line(e)})"
        ) from e
    return loaded


class SiglipEmbedding(EmbeddingBackend):
    """The ``siglip`` backend: :class:`Loaded` behind one worker thread."""

    name = "siglip"
    model_settings = ("AGENTIK_EMBEDDING_MODEL_PATH", "AGENTIK_EMBEDDING_TOKENIZER_PATH")

    def __init__(self, model_path: Path, tokenizer_path: Path, *, threads: int = 2) -> None:
        self.model = model_path.name
        self.model_path = model_path
        self.tokenizer_path = tokenizer_path
        self.threads = threads
        self._loaded: Loaded | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    @property
    def dimension(self) -> int:
        if self._loaded is None:
            raise RuntimeError("the siglip backend reads its dimension from the model: start it")
        return self._loaded.model.dimension

    async def start(self) -> None:
        if self._loaded is not None:
            return
        executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="siglip")
        loop = asyncio.get_running_loop()
        try:
            self._loaded = await loop.run_in_executor(
                executor, lambda: load(self.model_path, self.tokenizer_path, threads=self.threads)
            )
        except BaseException:
            executor.shutdown(wait=False)
            raise
        self._executor = executor
        log.info("siglip: %s, dimension %d", self.model_path, self._loaded.model.dimension)

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        loaded, executor = self._loaded, self._executor
        if loaded is None or executor is None:
            raise EmbeddingError("the siglip embedding backend is not started")
        batch = list(texts)
        if not batch:
            return np.zeros((0, loaded.model.dimension), dtype=np.float32)
        try:
            return await asyncio.get_running_loop().run_in_executor(executor, loaded.embed, batch)
        except Exception as e:
            raise EmbeddingError(
                f"siglip: the model failed on {len(batch)} texts: {one_line(e)}"
            ) from e

    async def close(self) -> None:
        executor, self._executor, self._loaded = self._executor, None, None
        if executor is not None:  # waits for a run under way, off the loop
            await asyncio.to_thread(executor.shutdown, wait=True)
