"""The inference engine, the inference thread's side: the job type (`jobs`), the engines' shared
types (`types`), loading a folder (`loading`, `model_files`, `st_config`), the backend it
computes on (`backend_choice`), warm-up and calibration (`warmup`), the model's forward
(`forward/`), pooling and heads (`pooling/`), and batching (`batching/`: the queue, the batch
policy, forming and running batches, the thread's loop)."""
