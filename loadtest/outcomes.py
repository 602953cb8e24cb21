"""How a load-test answer is classified: success, or a failure named by category.

- ``shed``: 503, the server refused work at admission (with Retry-After). Not a success, not a
  crash: a server at capacity is expected to shed.
- ``expired``: 504, the request's deadline passed before its result was ready.
- ``rejected``: any 4xx; with this repository's traffic that is a bug in the traffic or server.
- ``error``: any other 5xx, a connection error (status 0), or a 200 whose body is not a JSON list.

Locust keeps each failure message as the error of a row in ``*_failures.csv``; the message starts
with its category, then the status in brackets, e.g. ``shed (503)``.
"""

from __future__ import annotations

import re

CATEGORIES = ("shed", "expired", "rejected", "error")
_CATEGORY = re.compile(r"\b(shed|expired|rejected|error) \(")


def failure_name(status: int, body: bytes) -> str | None:
    """The failure message for an answer, or None for a success (200 with a JSON list body).

    ``status`` 0 stands for a connection error (no HTTP answer).
    """
    if status == 200:
        return None if body.startswith(b"[") else "error (200 without a JSON list)"
    if status == 503:
        return "shed (503)"
    if status == 504:
        return "expired (504)"
    if status == 0:
        return "error (connection)"
    return f"{'rejected' if 400 <= status < 500 else 'error'} ({status})"


def category_of(error: str) -> str:
    """The category named in a Locust error string; ``error`` when none is (e.g. a crash).

    Locust stores ``resp.failure("shed (503)")`` as ``CatchResponseError('shed (503)')``.
    """
    match = _CATEGORY.search(error)
    return match.group(1) if match else "error"


def retry_delay(retry_after: str | None, cap_s: float, default_s: float = 1.0) -> float:
    """Seconds to wait after a 503 with this Retry-After value, between 0 and ``cap_s``.

    Delta-seconds (integer or decimal) are honoured; a missing value or an HTTP-date (this server
    never sends one) means ``default_s``.
    """
    try:
        delay = float(retry_after) if retry_after else default_s
    except ValueError:
        delay = default_s
    return min(max(delay, 0.0), cap_s)
