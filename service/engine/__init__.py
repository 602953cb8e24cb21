"""The inference engine, the inference thread's side: the job type (`jobs`), loading a folder
(`loading`, `st_config`), the model's forward (`forward/`), pooling and heads (`pooling/`), and
batching (`batching/`: the queue, the batch policy, the batch loop)."""
