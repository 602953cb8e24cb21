"""The inference engine: the job type, the queue, admission and selection, the batcher,
the encoders, pooling and heads, loading (the inference thread's side)."""
