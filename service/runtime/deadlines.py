"""How long a request may take: REQUEST_TIMEOUT_S, less where the client asks with
`X-Request-Timeout`, more for a bulk request (one timeout per queue's worth of its inputs)."""

from __future__ import annotations

import math
import re

from service.settings import Settings

_SECONDS = re.compile(r"[0-9]{1,9}(\.[0-9]{1,9})?")  # a plain decimal: no inf, nan, 1e309, 1_0


def request_timeout(settings: Settings, asked: str | bytes | None) -> float | None:
    """Seconds a request may take: REQUEST_TIMEOUT_S, or the `X-Request-Timeout` it sent when
    smaller (a larger one is capped); None for a value that is not a plain positive decimal."""
    if asked is None:
        return settings.request_timeout_s
    text = asked.decode("latin-1") if isinstance(asked, bytes) else asked
    if not _SECONDS.fullmatch(text.strip()) or not float(text) > 0:
        return None
    return min(settings.request_timeout_s, float(text))


def bulk_timeout(settings: Settings, inputs: int, asked: str | None) -> float:
    """Seconds a bulk request (more than MAX_QUEUE_SIZE inputs) may take: REQUEST_TIMEOUT_S for
    each MAX_QUEUE_SIZE of its inputs, as if each queue's worth were a request of its own (2,048
    inputs: 8 x 30 s by default); an `X-Request-Timeout` (already checked) caps it still."""
    timeout = math.ceil(inputs / settings.max_queue_size) * settings.request_timeout_s
    return timeout if asked is None else min(timeout, float(asked))
