"""pipeline-server: one Hugging Face `transformers` pipeline behind HTTP, with dynamic batching."""

__version__ = "0.1.0"
