"""Hash embeddings under agentik's vector memory: chosen by AGENTIK_EMBEDDING_BACKEND."""

import numpy

import agentik_embedding_hash
from agentik.api import run_turn

PLUGIN = [("agentik_embedding_hash", agentik_embedding_hash)]


async def test_texts_sharing_words_are_close():
    backend = agentik_embedding_hash.HashEmbedding(128)
    a, b, c = await backend.embed(["my dog Bruno", "Bruno the dog", "capital of Norway"])

    def cosine(x, y):
        return float(numpy.dot(x, y) / numpy.linalg.norm(x) / numpy.linalg.norm(y))

    assert round(cosine(a, b), 3) == 0.667  # two words of three in common
    assert abs(cosine(a, c)) < 0.1  # none


async def test_the_vector_memory_uses_it(agentik_agent, tmp_path):
    agent = await agentik_agent(
        plugins=PLUGIN,
        builtins=["agentik_memory", "agentik_memory_vector"],
        env={
            "AGENTIK_MEMORY_BACKEND": "vector",
            "AGENTIK_EMBEDDING_BACKEND": "hash",
            "HASH_EMBEDDING_DIMENSION": "64",
            "AGENTIK_DB_PATH": str(tmp_path / "agent.db"),
            "AGENTIK_MEMORY_REVIEW": "0",
        },
    )
    assert agent.embedding.name == "hash" and agent.embedding.dimension == 64
    await agent.memory.save("user", "The user's dog is named Bruno.", "USER")
    await agent.memory.save("world", "Oslo is the capital of Norway.", "USER")
    best = await agent.memory.search("what is my dog called", 1)
    assert [n.text for n in best] == ["The user's dog is named Bruno."]
    turn = await run_turn(agent, "tell me about my dog Bruno")
    assert turn.history[-1].kind == "assistant"
