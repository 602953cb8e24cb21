"""The inference engine, the inference thread's side: the job type (`jobs`), the engines' shared
types (`types`), loading a folder (`loading`, `model_files`, `st_config`), the backend it
computes on (`backend_choice`), warm-up (`warmup`) and int8/uint8 calibration (`quantization`),
the model's forward (`forward/`: encoders and classifiers, long inputs' windows, the pipeline
tasks), pooling and heads (`pooling/`), the multi-vector and causal-LM reranker engines
(`multi_vector/`, `llm_rerank/`), and batching (`batching/`: the queue, the batch policy,
forming and running batches, the thread's loop)."""
