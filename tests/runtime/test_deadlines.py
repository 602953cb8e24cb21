"""How long a request may take (service.runtime.deadlines), table-driven."""

from __future__ import annotations

import pytest

from service.runtime.deadlines import bulk_timeout, request_timeout
from service.settings import Settings

S = Settings(request_timeout_s=30, max_queue_size=256)


@pytest.mark.parametrize(
    ("asked", "seconds"),
    [
        (None, 30.0),
        ("5", 5.0),
        (b"0.25", 0.25),
        ("45", 30.0),  # a larger one is capped
        ("0", None),
        ("-1", None),
        ("inf", None),
        ("1e3", None),
        ("1_0", None),
        ("", None),
    ],
)
def test_request_timeout(asked: str | bytes | None, seconds: float | None) -> None:
    assert request_timeout(S, asked) == seconds


@pytest.mark.parametrize(
    ("inputs", "asked", "seconds"),
    [(257, None, 60.0), (2048, None, 240.0), (2049, None, 270.0), (2048, "12.5", 12.5)],
)
def test_bulk_timeout_is_one_timeout_per_queue_of_inputs(
    inputs: int, asked: str | None, seconds: float
) -> None:
    assert bulk_timeout(S, inputs, asked) == seconds
