"""Small batches on one intra-op thread (`service.backends.threads`), torch's and
onnxruntime's (a second session of one thread): the choice from start-up timings (a fake
clock), and the forward that follows it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from service.backends import threads
from service.backends.torch_backend import TorchBackend


class Clock:
    """A fake `time`: wall and CPU seconds advance only when a fake forward says."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def perf_counter(self) -> float:
        return self.wall

    def process_time(self) -> float:
        return self.cpu


class Fake(TorchBackend):
    """A backend whose forward costs, per padded token, what `costs` says for the thread
    count it runs on: (wall seconds, CPU seconds)."""

    def __init__(self, clock: Clock, costs: dict[int, tuple[float, float]]) -> None:
        self.clock, self.costs = clock, costs
        self.ran_on: list[tuple[int, int]] = []  # (padded tokens, threads)
        self.one_thread_up_to = 0

    def forward_all_threads(self, inputs: Mapping[str, Any]) -> Any:
        import torch

        n = int(inputs["input_ids"].numel())
        wall, cpu = self.costs[torch.get_num_threads()]
        self.clock.wall += wall * n
        self.clock.cpu += cpu * n
        self.ran_on.append((n, torch.get_num_threads()))
        return None


def batch(size: int, length: int) -> dict[str, Any]:
    import torch

    return {"input_ids": torch.zeros(size, length, dtype=torch.long)}


@pytest.fixture
def two_threads() -> Any:
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(saved)


def test_one_thread_serves_the_batches_it_runs_cheaper_and_about_as_fast(
    monkeypatch: pytest.MonkeyPatch, two_threads: None
) -> None:
    clock = Clock()
    monkeypatch.setattr(threads, "time", clock)
    # one thread: 40 us a token of wall and CPU; two: 25 us of wall, 50 of CPU. One thread
    # is 15 us a token slower: within 1 ms up to 66 tokens.
    backend = Fake(clock, {1: (40e-6, 40e-6), 2: (25e-6, 50e-6)})
    batches = [batch(1, 16), batch(1, 32), batch(1, 64), batch(2, 64), batch(4, 64)]
    got = threads.fit_one_thread(backend, batches)
    assert backend.one_thread_up_to == 64
    assert got["one_thread_up_to"] == 64 and len(got["batches"]) == 4  # stops at the first miss
    import torch

    assert torch.get_num_threads() == 2  # as it was

    backend.ran_on.clear()
    for inputs in (batch(1, 60), batch(1, 64), batch(2, 33), batch(8, 64)):
        backend.forward(inputs)
    assert backend.ran_on == [(60, 1), (64, 1), (66, 2), (512, 2)]
    assert torch.get_num_threads() == 2


def test_one_thread_that_costs_more_cpu_serves_nothing(
    monkeypatch: pytest.MonkeyPatch, two_threads: None
) -> None:
    clock = Clock()
    monkeypatch.setattr(threads, "time", clock)
    backend = Fake(clock, {1: (40e-6, 40e-6), 2: (20e-6, 39e-6)})
    threads.fit_one_thread(backend, [batch(1, 16), batch(1, 32)])
    assert backend.one_thread_up_to == 0
    backend.ran_on.clear()
    backend.forward(batch(1, 8))
    assert backend.ran_on == [(8, 2)]


def test_one_thread_alone_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        clock = Clock()
        monkeypatch.setattr(threads, "time", clock)
        backend = Fake(clock, {1: (40e-6, 40e-6)})
        assert threads.fit_one_thread(backend, [batch(1, 16)]) == {"threads": 1}
        assert backend.one_thread_up_to == 0 and backend.ran_on == []
    finally:
        torch.set_num_threads(saved)


class FakeSession:
    """An onnxruntime session of `threads` intra-op threads whose runs cost, per padded
    token, what `costs[threads]` says; records what each run got."""

    def __init__(self, clock: Clock, costs: dict[int, tuple[float, float]], threads: int) -> None:
        self.clock, self.costs, self.threads = clock, costs, threads
        self.ran: list[int] = []  # padded tokens of each run

    def get_inputs(self) -> list[Any]:
        from types import SimpleNamespace

        return [SimpleNamespace(name="input_ids")]

    def get_outputs(self) -> list[Any]:
        from types import SimpleNamespace

        return [SimpleNamespace(name="out")]

    def run(self, names: list[str], feed: dict[str, Any]) -> list[Any]:
        import numpy as np

        n = int(feed["input_ids"].size)
        wall, cpu = self.costs[self.threads]
        self.clock.wall += wall * n
        self.clock.cpu += cpu * n
        self.ran.append(n)
        return [np.zeros((1, 1), dtype=np.float32)]


def onnx_on_fake_sessions(
    monkeypatch: pytest.MonkeyPatch, costs: dict[int, tuple[float, float]]
) -> tuple[Any, list[FakeSession]]:
    from pathlib import Path

    from service.backends import onnx_backend

    clock = Clock()
    monkeypatch.setattr(threads, "time", clock)
    made: list[FakeSession] = []

    def session(path: Path, n: int) -> FakeSession:
        made.append(FakeSession(clock, costs, n))
        return made[-1]

    monkeypatch.setattr(onnx_backend, "_session", session)
    return onnx_backend.OnnxBackend(Path("graph.onnx"), 2), made


def test_onnx_small_batches_run_on_a_second_session_of_one_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend, made = onnx_on_fake_sessions(monkeypatch, {1: (40e-6, 40e-6), 2: (25e-6, 50e-6)})
    assert [s.threads for s in made] == [2]  # the one-thread session is made when first used
    got = threads.fit_one_thread(backend, [batch(1, 16), batch(1, 32), batch(1, 64), batch(2, 64)])
    assert backend.one_thread_up_to == 64 and got["one_thread_up_to"] == 64
    all_threads, one = made
    assert one.threads == 1 and backend.one_thread is one
    all_threads.ran.clear()
    one.ran.clear()
    for inputs in (batch(1, 60), batch(1, 64), batch(2, 33), batch(8, 64)):
        backend.forward(inputs)
    assert one.ran == [60, 64] and all_threads.ran == [66, 512]


def test_onnx_one_thread_session_that_does_not_pay_is_let_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend, made = onnx_on_fake_sessions(monkeypatch, {1: (40e-6, 40e-6), 2: (20e-6, 39e-6)})
    threads.fit_one_thread(backend, [batch(1, 16), batch(1, 32)])
    assert backend.one_thread_up_to == 0 and backend.one_thread is None
    all_threads = made[0]
    all_threads.ran.clear()
    backend.forward(batch(1, 8))
    assert all_threads.ran == [8]


def test_onnx_second_session_only_for_a_graph_small_enough(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from service.backends import onnx_backend

    monkeypatch.setattr(onnx_backend, "_session", lambda path, n: FakeSession(Clock(), {}, n))
    graph = tmp_path / "model.onnx"
    graph.write_bytes(b"graph")
    (tmp_path / "model.int8.onnx").write_bytes(b"another graph")  # not this one's: not counted
    with open(tmp_path / "model.int8.onnx", "r+b") as f:
        f.truncate(onnx_backend.ONE_THREAD_MAX_GRAPH_BYTES)  # sparse: no disk used
    backend = onnx_backend.OnnxBackend(graph, 2)
    assert backend.one_thread_affordable()
    with open(tmp_path / "model.onnx.data", "wb") as f:  # its external weights: counted
        f.truncate(onnx_backend.ONE_THREAD_MAX_GRAPH_BYTES)
    assert not backend.one_thread_affordable()
