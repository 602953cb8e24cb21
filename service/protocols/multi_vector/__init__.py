"""Multi-vector (late-interaction) embeddings: `/embed_multi`."""
