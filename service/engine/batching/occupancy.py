"""Requests waiting and requests running, each request counted once (an inference gateway's
routing signal).

The Gateway API Inference Extension's endpoint picker scrapes two gauges from every model
server and sends each request to the least loaded pod (its model-server protocol,
`docs/proposals/003-model-server-protocol` in kubernetes-sigs/gateway-api-inference-extension):
TotalQueuedRequests ("requests in the queue"; vLLM's `vllm:num_requests_waiting`) and
TotalRunningRequests ("requests actively being served"; `vllm:num_requests_running`). Ours are
`pipeline_server_requests_waiting` and `pipeline_server_requests_running`.

A request here is several inputs (one `Item` each). It counts once, whatever its inputs:
*running* while any of its inputs is in the batch being computed, else *waiting* while any of
its inputs is queued, else not at all. A request whose inputs are split across batches is
waiting between them. An input leaves when its future settles: answered, failed, expired,
or cancelled by the loop (client gone, deadline, a sibling input failed). That is the moment
the loop cancels, not when the inference thread next looks, so a request whose client left
stops counting at once, though `pipeline_server_queue_depth` (inputs, the admission bound)
keeps its inputs until the thread drops them. A shed request was never queued: never counted.

Concurrency: the loop admits (`admit`) and cancels; the inference thread starts inputs
(`start`) and settles them. One lock guards the counts; it is always taken last (no other lock
is taken while holding it), and `Future` runs done-callbacks outside its own lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import Future

from prometheus_client import Gauge


class Occupancy:
    """The requests waiting and running in one queue, mirrored into two gauges."""

    def __init__(self, waiting_gauge: Gauge, running_gauge: Gauge) -> None:
        self._lock = threading.Lock()
        self.waiting = 0
        self.running = 0
        self._gauges = (waiting_gauge, running_gauge)

    def admit(self, futures: Sequence[Future[object]]) -> RequestTally:
        """One request's inputs were queued (all of them, by `WorkQueue.offer`): it waits."""
        tally = RequestTally(self, len(futures))
        with self._lock:
            self.waiting += 1
            self._publish()
        for future in futures:  # after the count: a future settled now finds its request
            future.add_done_callback(tally.input_done)
        return tally

    def start(self, started: Iterable[tuple[RequestTally | None, Future[object]]]) -> None:
        """These inputs' futures were just marked running (the inference thread, before the
        batch's forward): their requests run."""
        with self._lock:
            for tally, future in started:
                if tally is not None:
                    tally.start(future)
            self._publish()

    def _moved(self, was: str | None, now: str | None) -> None:
        """A request changed stage; called with the lock held."""
        if was == now:
            return
        if was == "waiting":
            self.waiting -= 1
        elif was == "running":
            self.running -= 1
        if now == "waiting":
            self.waiting += 1
        elif now == "running":
            self.running += 1

    def _publish(self) -> None:
        self._gauges[0].set(self.waiting)
        self._gauges[1].set(self.running)


class RequestTally:
    """One request's inputs: how many are queued, which are in the running batch."""

    __slots__ = ("_occupancy", "_queued", "_running")

    def __init__(self, occupancy: Occupancy, inputs: int) -> None:
        self._occupancy = occupancy
        self._queued = inputs
        self._running: set[int] = set()  # id() of the futures in the running batch

    def expand(self, futures: Sequence[Future[object]]) -> None:
        """One of the request's inputs became these parts (a long input's windows): each is
        queued, and runs and settles on its own, until the input itself settles."""
        with self._occupancy._lock:
            self._queued += len(futures)
        for future in futures:
            future.add_done_callback(self.input_done)

    def stage(self) -> str | None:
        if self._running:
            return "running"
        return "waiting" if self._queued else None

    def start(self, future: Future[object]) -> None:
        """`future`'s input moved from the queue into the batch (occupancy lock held)."""
        was = self.stage()
        self._queued -= 1
        self._running.add(id(future))
        self._occupancy._moved(was, self.stage())

    def input_done(self, future: Future[object]) -> None:
        """A done-callback: the input was answered, failed or cancelled, in any thread."""
        occupancy = self._occupancy
        with occupancy._lock:
            was = self.stage()
            if id(future) in self._running:
                self._running.discard(id(future))
            else:
                self._queued -= 1
            now = self.stage()
            if was != now:
                occupancy._moved(was, now)
                occupancy._publish()
