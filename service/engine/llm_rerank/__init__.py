"""Rerankers built on a decoder LLM: a `*ForCausalLM` folder saved as a sentence-transformers
`CrossEncoder` (Transformer text-generation -> LogitScore), read (`config`), computed
(`engine`) and served (`load`)."""
