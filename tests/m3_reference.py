"""Run in FlagEmbedding's own environment (`m3_models.flag_encode`): reads a JSON list of
texts on stdin, prints `BGEM3FlagModel(argv[1], colbert_dim=argv[2]).encode(texts,
return_dense=True, return_sparse=True, return_colbert_vecs=True)` in float32 on the CPU as
one JSON line."""

import json
import sys

from FlagEmbedding import BGEM3FlagModel

texts = json.loads(sys.stdin.read())
model = BGEM3FlagModel(sys.argv[1], use_fp16=False, devices="cpu", colbert_dim=int(sys.argv[2]))
out = model.encode(
    texts, batch_size=4, return_dense=True, return_sparse=True, return_colbert_vecs=True
)
print(
    json.dumps(
        {
            "dense": out["dense_vecs"].tolist(),
            "lexical_weights": [
                {str(k): float(v) for k, v in w.items()} for w in out["lexical_weights"]
            ],
            "colbert_vecs": [v.tolist() for v in out["colbert_vecs"]],
        }
    )
)
