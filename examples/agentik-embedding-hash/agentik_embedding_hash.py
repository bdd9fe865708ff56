"""agentik-embedding-hash: embeddings without a model, for the vector memory
(``AGENTIK_MEMORY_BACKEND=vector AGENTIK_EMBEDDING_BACKEND=hash``).

Each word is hashed to one of ``HASH_EMBEDDING_DIMENSION`` slots (with a sign, so collisions
cancel out more often than they add up): texts that share words get close vectors. No
network, no download, deterministic; a real model understands meaning, this only words.
"""

import hashlib
import re

from agentik.api import EmbeddingBackend, Setting, hookimpl, parse_positive_int

WORD = re.compile(r"\w+")


class HashEmbedding(EmbeddingBackend):
    name = "hash"
    model_settings = ("HASH_EMBEDDING_DIMENSION",)

    def __init__(self, dimension):
        self._dimension = dimension
        self.model = f"hash-{dimension}"

    @property
    def dimension(self):
        return self._dimension

    async def embed(self, texts):
        import numpy  # only once the backend is used: the plugin imports in milliseconds

        out = numpy.zeros((len(texts), self._dimension), dtype=numpy.float32)
        for row, text in enumerate(texts):
            for word in WORD.findall(text.casefold()):
                digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
                slot = int.from_bytes(digest[:4], "little") % self._dimension
                out[row, slot] += 1.0 if digest[4] & 1 else -1.0
        return out  # cheap: no thread needed for a few texts


@hookimpl
def register_settings(register):
    register(Setting("HASH_EMBEDDING_DIMENSION", 256, parse_positive_int, "Length of the vectors."))


@hookimpl
def register_embedding_backends(register):
    register(
        "hash",
        lambda settings: HashEmbedding(settings["HASH_EMBEDDING_DIMENSION"]),
        requires=("numpy",),
        extra="vector",
    )
