"""Run in Chroma's own venv (`tests/reference_venv.py`), never imported by the suite: reads one
JSON request on stdin, writes one JSON answer on stdout.

`{"url": "http://127.0.0.1:PORT/v1/embeddings", "texts": [...], "options": {...}}`: Chroma's
`JinaEmbeddingFunction(**options)` with its API URL pointed at `url` (the client keeps it in
`_api_url`, set in its constructor), called on `texts` as a collection embeds documents, and
`embed_query` on them as a query: `{"documents": [[...]], "queries": [[...]]}`.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    from chromadb.utils.embedding_functions.jina_embedding_function import (
        JinaEmbeddingFunction,
    )

    request = json.load(sys.stdin)
    os.environ["CHROMA_JINA_API_KEY"] = "test-key"
    function = JinaEmbeddingFunction(**request["options"])
    function._api_url = request["url"]
    documents = function(request["texts"])
    queries = function.embed_query(request["texts"])
    out = {"documents": [v.tolist() for v in documents], "queries": [v.tolist() for v in queries]}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
