"""The Prometheus objects (prometheus-client), named per Prometheus conventions.

One process serves one model (one gunicorn worker), so the default registry is enough.
"""

from __future__ import annotations

import functools
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

_P = "pipeline_server_"
# Latency buckets from 1 ms to 60 s: probes and sheds at the low end, long batches at the top.
_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

REQUESTS = Counter(_P + "requests_total", "HTTP requests answered.", ["route", "status"])
REQUEST_SECONDS = Histogram(
    _P + "request_duration_seconds",
    "Time from request start to response.",
    ["route"],
    buckets=_SECONDS,
)
INPUTS = Counter(_P + "inputs_total", "Inputs answered by the model.", ["outcome"])
QUEUE_DEPTH = Gauge(_P + "queue_depth", "Inputs waiting (not counting the running batch).")
BATCH_SIZE = Histogram(
    _P + "batch_size", "Inputs per pipeline call.", buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256)
)
_TOKEN_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536)
BATCH_TOKENS = Histogram(
    _P + "batch_padded_tokens",
    "The batch's padded shape in tokens (inputs x longest input), however it is computed.",
    buckets=_TOKEN_BUCKETS,
)
BATCH_COMPUTED_TOKENS = Histogram(
    _P + "batch_computed_tokens",
    "Tokens the model computed per call: the real tokens of a packed batch, inputs x longest "
    "input of a padded one.",
    buckets=_TOKEN_BUCKETS,
)
PADDING_EFFICIENCY = Histogram(
    _P + "padding_efficiency",
    "Real tokens / tokens computed of each batch (1.0 for a packed batch).",
    buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0),
)
QUEUE_WAIT = Histogram(
    _P + "queue_wait_seconds", "Time an input waited before its batch started.", buckets=_SECONDS
)
BATCH_FILL_WAIT = Histogram(
    _P + "batch_fill_wait_seconds",
    "Time spent waiting for a batch to fill (MAX_BATCH_WAIT_MS).",
    buckets=_SECONDS,
)
INFERENCE_SECONDS = Histogram(
    _P + "inference_seconds", "Time one batch spent in the pipeline.", buckets=_SECONDS
)
SHED = Counter(_P + "shed_total", "Requests answered 503 at admission.", ["reason"])
EXPIRED = Counter(
    _P + "expired_total",
    "Inputs whose deadline passed, by stage: receiving (the body, counted once), queued, running.",
    ["stage"],
)
LONG_INPUTS = Counter(
    _P + "long_inputs_total",
    "Inputs over the model's token limit, by what was done (LONG_INPUTS, or the request's own "
    "choice): truncated, chunked (embedded in windows), refused (422).",
    ["action"],
)
for _action in ("truncated", "chunked", "refused"):
    LONG_INPUTS.labels(_action)  # exported from the start, at 0
CANCELLED = Counter(_P + "cancelled_total", "Inputs dropped before compute.", ["reason"])
MODEL_LOAD_SECONDS = Gauge(_P + "model_load_seconds", "Seconds the model took to load and warm.")
READY = Gauge(_P + "ready", "1 when the model is loaded, warmed and not draining.")
TORCH_THREADS = Gauge(_P + "torch_threads", "torch intra-op threads.")
HTTP_REFUSED = Counter(
    _P + "http_refused_total",
    "Connections the HTTP edge answered itself and closed (service/http/edge.py), by reason.",
    ["reason"],
)


def count_shed(error: object) -> None:
    """Count an answered 503 under its shed reason (`errors.Unavailable.shed`), if it is one."""
    reason = getattr(error, "shed", None)
    if reason is not None:
        SHED.labels(reason).inc()


@functools.cache
def request_metrics(route: str, status: int) -> tuple[Any, Any]:
    """The (requests_total, request_duration_seconds) children of one route and status, looked
    up once: `labels()` costs a lock and a dict lookup on every request otherwise."""
    return REQUESTS.labels(route, str(status)), REQUEST_SECONDS.labels(route)


# The Gateway API Inference Extension's model-server gauges (service/engine/batching/occupancy.py):
# a request
# counts once, whatever its inputs.
REQUESTS_WAITING = Gauge(
    _P + "requests_waiting",
    "Requests with inputs queued and none in the running batch "
    "(the Gateway API Inference Extension's TotalQueuedRequests).",
)
REQUESTS_RUNNING = Gauge(
    _P + "requests_running",
    "Requests with inputs in the batch being computed "
    "(the Gateway API Inference Extension's TotalRunningRequests).",
)

# The shed budget (service.admission): what sheds cost, and what it held back.
SHED_CPU_SECONDS = Counter(
    _P + "shed_cpu_seconds_total",
    "Event-loop CPU seconds spent answering sheds at the HTTP edge (the shed budget's charge).",
)
SHED_HELD = Counter(
    _P + "shed_held_total",
    "Requests held by the shed budget, by how their hold ended: admitted (passed on to the app), "
    "shed (at the edge), gone (the client left).",
    ["outcome"],
)
READS_PAUSED = Gauge(
    _P + "reads_paused",
    "Connections not read now because the shed budget is spent (one held request each).",
)
for _outcome in ("admitted", "shed", "gone"):
    SHED_HELD.labels(_outcome)  # exported from the start, at 0
