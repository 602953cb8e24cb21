"""The model's forward: the encoder engine (our own tokenize -> padded batch -> backend) and the
pipeline engine (fill-mask, token-classification through the pipeline's own steps)."""
