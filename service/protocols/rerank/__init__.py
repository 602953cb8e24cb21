"""Reranking a query's documents: TEI's `/rerank`, Cohere's `/v2/rerank`, and the Jina/vLLM
`/v1/rerank`."""
