"""Load shapes as plain arithmetic, so that they can be tested without starting Locust.

All three run for ``run_time_s`` seconds with at most ``users`` users:

- ``steady``: ``users`` from the start.
- ``step``: ``steps`` equal steps up to ``users`` (set ``users`` above capacity to reach overload).
- ``burst``: a quarter of ``users``, jumping to ``users`` for the last ``burst_length_s`` of
  every ``burst_every_s`` seconds.
"""

from __future__ import annotations

SHAPES = ("steady", "step", "burst")


def users_at(
    shape: str,
    elapsed_s: float,
    run_time_s: float,
    users: int,
    steps: int = 4,
    burst_every_s: float = 20.0,
    burst_length_s: float = 5.0,
) -> int | None:
    """How many users should run ``elapsed_s`` seconds in; None once the run is over."""
    if elapsed_s >= run_time_s:
        return None
    if shape == "step":
        steps = max(1, steps)
        step = min(steps, int(elapsed_s // (run_time_s / steps)) + 1)
        return max(1, users * step // steps)
    if shape == "burst":
        in_burst = elapsed_s % burst_every_s >= burst_every_s - burst_length_s
        return users if in_burst else max(1, users // 4)
    if shape == "steady":
        return users
    raise ValueError(f"unknown shape {shape!r}; expected one of {', '.join(SHAPES)}")
