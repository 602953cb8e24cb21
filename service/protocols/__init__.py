"""Wire protocols, grouped by what is served: `embedding/`, `classification/`, `rerank/`,
`tokens/`, `multi_vector/`; in each, one thin codec per dialect (`hf`: the Inference API on
`POST /`, `tei`, `openai`, `cohere`, `jina`) that parses its requests into one
`service.engine.jobs.Job` and encodes the answers; what a task's dialects share is its `common`.
`serving` is the one path they all go through; `inference_api` dispatches `POST /` to the loaded
task's codec; `hf_shapes`, `tei_shapes` and `cohere_shapes` hold what one dialect's codecs share.
"""
