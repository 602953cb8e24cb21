"""Wire protocols: each parses its requests into one `service.engine.jobs.Job` and encodes answers.

`hf` (the Hugging Face Inference API on `POST /`), `tei` (text-embeddings-inference's routes),
`openai` (`/v1/embeddings`, `/v1/models`); `serving` is the one path they all go through.
"""
