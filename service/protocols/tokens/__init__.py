"""Token tasks: the Inference API's fill-mask and token-classification, TEI's `/tokenize` and
`/decode`."""
