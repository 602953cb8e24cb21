"""Reranking a query's documents: TEI's `/rerank`."""
