"""Batching: the queue from the event loop (`queue`), which inputs run together (`policy`), the
cost model behind it (`cost`), the inference thread's loop (`batcher`), and the occupancy gauges."""
