"""Multi-vector (late-interaction, ColBERT-style) models: a sentence-transformers
`MultiVectorEncoder` folder read (`config`), computed (`engine`) and scored (`scoring`)."""
