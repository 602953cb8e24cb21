"""Studies: measurements whose answers are written down in docs/, kept to measure them again.

Nothing outside this package imports it. Workload-shaped studies run through the bench's
options and runner (``python -m loadtest.experiments.bench --only NAME``):

| name | module | what it measures |
| --- | --- | --- |
| ``cpu`` | ``cpu_split`` | CPU per request on the loop and per input in the model; GIL shares |
| ``profile`` | ``profile`` | py-spy: where the loop's and the inference thread's CPU goes |
| ``burst`` | ``burst`` | 160 requests at once on a busy server: shed and /livez latency |
| ``memory`` | ``memory`` | the worker's RSS through a long storm and a long open-loop overload |
| ``zero_shot`` | ``zero_shot`` | zero-shot classification: latency and throughput per label |
| ``pooled`` | ``pooled`` | pooled embeddings (the default) beside token rows on mixed inputs |

The others are scripts of their own (``python -m loadtest.experiments.<module> --help``):
``backends`` (each backend's speed and quality in process), ``packing`` (each backend's
batches of 32 in arrival order padded and packed beside length-sorted padded), ``soak`` (each
backend's RSS over changing batch shapes), ``probe_latency`` (sheds and /livez on a saturated
server beside the client's floor), ``replicas`` (three replicas behind HAProxy: rolling update,
slow replica, storm; ``make replicas``), ``shapes`` (each padded backend's first run of a
batch shape against the same batch again: docs/backends.md, shapes the kernels have seen),
``int8_quality`` (how much of float's similarity ranking int8 and uint8 embeddings keep on the
corpus: docs/api.md, int8 and uint8).
"""
