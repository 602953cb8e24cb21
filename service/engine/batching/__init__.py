"""Batching: the queue from the event loop (`queue`), which inputs run together (`policy`) and the
cost model behind it (`cost`), forming the next batch from the inputs waiting (`forming`),
running it (`running`), the inference thread's loop (`batcher`), and the occupancy gauges."""
