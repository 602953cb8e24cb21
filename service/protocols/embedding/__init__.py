"""Embeddings: the Inference API's feature-extraction and sentence-similarity, TEI's embed
routes, OpenAI's embeddings, Cohere's v2 embed."""
