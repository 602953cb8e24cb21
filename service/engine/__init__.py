"""The inference engine, the inference thread's side: the job type (`jobs`), the engines' shared
types (`types`), what every family's folder reader shares (`folders`), start-up (`loading/`:
reading a folder, loading it, the backend it computes on in `loading/choice/`, warm-up and
int8/uint8 calibration), the model's forward (`forward/`: encoders and classifiers, prompts,
long inputs' windows, the pipeline tasks), pooling and heads (`pooling/`), the multi-vector and
causal-LM reranker engines (`multi_vector/`, `llm_rerank/`), and batching (`batching/`: the
queue, the batch policy, forming and running batches, the thread's loop)."""
