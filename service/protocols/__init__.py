"""Wire protocols, grouped by what is served: `embedding/`, `classification/`, `rerank/`, `tokens/`;
in each, one thin codec per dialect (`hf`: the Inference API on `POST /`, `tei`, `openai`) that
parses its requests into one `service.engine.jobs.Job` and encodes the answers. `serving` is the
one path they all go through; `inference_api` dispatches `POST /` to the loaded task's codec;
`hf_shapes` and `tei_shapes` hold what one dialect's codecs share.
"""
