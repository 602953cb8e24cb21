"""Fixtures shared by the engine's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from service.engine.batching.queue import Item


@pytest.fixture
def queued() -> Iterator[list[Item]]:
    """The items a test queues; their futures are settled at the end (occupancy gauges)."""
    made: list[Item] = []
    yield made
    for item in made:
        if not item.future.done():
            item.future.set_result(None)
