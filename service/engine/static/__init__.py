"""Static embedding models: sentence-transformers' `StaticEmbedding` (a tokenizer and one
learned row per token id, a text's vector the mean of its tokens' rows), optionally followed by
Normalize; read (`config`), computed (`engine`) and served (`load`). No transformer runs."""
