"""`auto`'s choice with a fake clock and fake candidates: the fastest that keeps the answers.

No model: fake backends return the reference output (or a distorted one) and advance a fake
clock by their cost per call, so the timings are exact and the test cannot be flaky.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from service.backends.routed import RoutedBackend
from service.backends.torch_backend import TorchBackend
from service.engine.loading.choice.backend_choice import embedding_quality
from service.engine.loading.choice.candidates import allowed, native_bf16
from service.engine.loading.choice.quality import Quality, classifier_quality
from service.engine.loading.choice.ranking import (
    Candidate,
    Measured,
    Route,
    fastest_passing,
    measure,
    route,
)
from service.settings import Settings

torch.manual_seed(0)
REFERENCE = torch.randn(4, 6, 8)  # token rows [B, L, H] of torch float32
MASK = torch.ones(4, 6, dtype=torch.long)
QUALITY_INPUTS = {"input_ids": torch.zeros(4, 6, dtype=torch.long), "attention_mask": MASK}
TIMING = [{"input_ids": torch.zeros(n, 6, dtype=torch.long)} for n in (1, 8, 32)]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeBackend:
    """Costs `per_input` fake seconds per input; answers `REFERENCE` plus `noise`."""

    def __init__(self, clock: FakeClock, per_input: float, noise: float, dtype: str) -> None:
        self.name, self.dtype, self.compute = "fake", dtype, "padded"
        self.clock, self.per_input, self.noise = clock, per_input, noise

    def forward(self, inputs: Mapping[str, Any]) -> Any:
        self.clock.now += self.per_input * inputs["input_ids"].shape[0]
        generator = torch.Generator().manual_seed(1)
        return REFERENCE + self.noise * torch.randn(REFERENCE.shape, generator=generator)


def compare(ref: Any, out: Any) -> Quality:
    return embedding_quality(ref, out, MASK, ("mean",))


def run(specs: list[tuple[str, float, float]], clock: FakeClock) -> list[Measured]:
    """Measure a candidate per (dtype, seconds per input, noise)."""
    out = []
    for dtype, per_input, noise in specs:

        def build(p: float = per_input, n: float = noise, d: str = dtype) -> FakeBackend:
            return FakeBackend(clock, p, n, d)

        candidate = Candidate("fake", dtype, build)
        out.append(measure(candidate, REFERENCE, QUALITY_INPUTS, TIMING, compare, clock)[0])
    return out


def test_speed_is_inputs_per_second_of_the_fake_clock() -> None:
    (m,) = run([("float32", 0.01, 0.0)], FakeClock())
    assert m.inputs_per_s == {n: pytest.approx(100.0) for n in (1, 8, 32)}
    assert m.quality is not None and m.quality.min_cosine == pytest.approx(1.0)


def test_a_faster_candidate_that_fails_the_check_is_never_chosen() -> None:
    measured = run(
        [("float32", 0.010, 0.0), ("bfloat16", 0.004, 0.005), ("int8", 0.001, 0.5)],
        FakeClock(),
    )
    assert [m.passed for m in measured] == [True, True, False]
    assert measured[2].speed() > measured[1].speed() > measured[0].speed()
    assert fastest_passing(measured) == 1
    assert measured[2].quality is not None and measured[2].quality.min_cosine is not None
    assert measured[2].quality.min_cosine < 0.9995


def test_a_candidate_that_fails_to_build_is_reported_and_not_chosen() -> None:
    clock = FakeClock()

    def broken() -> FakeBackend:
        raise RuntimeError("Exporting the operator 'aten::foo' to ONNX is not supported\nmore")

    (ok,) = run([("float32", 0.01, 0.0)], clock)
    failed, backend = measure(
        Candidate("onnx", "float32", broken), REFERENCE, QUALITY_INPUTS, TIMING, compare, clock
    )
    assert backend is None and not failed.passed
    assert failed.error == "Exporting the operator 'aten::foo' to ONNX is not supported"
    assert fastest_passing([ok, failed]) == 0
    assert failed.summary()["error"] == failed.error


def test_auto_never_measures_int8_and_dtype_int8_measures_it_alone() -> None:
    """int8 is opt-in: BACKEND=auto DTYPE=auto never builds it, DTYPE=int8 builds only it."""
    pipe = SimpleNamespace(device="cpu", model=SimpleNamespace(dtype=torch.float32))
    reference = TorchBackend(pipe.model, "cpu")

    def names(backend: Any, dtype: Any) -> list[tuple[str, str]]:
        chosen = Settings(backend=backend, dtype=dtype)
        return [(c.backend, c.dtype) for c in allowed(chosen, pipe, None, reference, {})]

    expected = [("torch", "float32"), ("onnx", "float32")]
    assert names("auto", "auto") == expected + ([("torch", "bfloat16")] if native_bf16() else [])
    assert names("auto", "int8") == [("openvino", "int8")]
    assert names("torch", "float32") == [("torch", "float32")]


def test_non_finite_outputs_fail() -> None:
    out = REFERENCE.clone()
    out[1, 2, 3] = float("inf")  # a float16 overflow
    assert not embedding_quality(REFERENCE, out, MASK, ("mean",)).passes()
    assert not classifier_quality(REFERENCE[:, 2], out[:, 2]).passes()


def test_classifier_check_allows_near_ties_to_flip_but_not_clear_labels() -> None:
    # float32: row 0 a near tie (0.5005 vs 0.4995), row 1 clear
    ref = torch.tensor([[0.001, -0.001], [2.0, -2.0]]).log_softmax(-1)
    flipped_tie = torch.tensor([[-0.0005, 0.0005], [2.0, -2.0]])
    assert classifier_quality(ref, flipped_tie).passes()
    flipped_clear = torch.tensor([[0.001, -0.001], [-2.0, 2.0]])
    quality = classifier_quality(ref, flipped_clear)
    assert quality.top_label_kept is False and not quality.passes()
    nudged = ref + torch.tensor([[0.0, 0.0], [0.0, 0.01]])  # probabilities move ~1.8e-4
    assert classifier_quality(ref, nudged).passes()
    assert not classifier_quality(ref, ref + torch.tensor([[0.0, 0.0], [0.0, 0.1]])).passes()


def test_pooled_cosine_reads_the_models_pooling_mode() -> None:
    out = REFERENCE.clone()
    out[:, 0] = -out[:, 0]  # only the first (CLS) row changes
    assert embedding_quality(REFERENCE, out, MASK, ("cls",)).min_cosine == pytest.approx(-1.0)
    assert embedding_quality(REFERENCE, out, MASK, ("lasttoken",)).min_cosine == pytest.approx(1)


class CostBackend:
    """Costs `fixed + per_token * (B x L)` fake seconds a call; answers `REFERENCE` plus
    `noise`; counts its calls."""

    def __init__(self, clock: FakeClock, fixed: float, per_token: float, noise: float) -> None:
        self.name, self.dtype, self.compute = "fake", f"{fixed}+{per_token}", "padded"
        self.clock, self.fixed, self.per_token, self.noise = clock, fixed, per_token, noise
        self.calls = 0

    def forward(self, inputs: Mapping[str, Any]) -> Any:
        self.calls += 1
        self.clock.now += self.fixed + self.per_token * inputs["input_ids"].numel()
        return FakeBackend(self.clock, 0.0, self.noise, self.dtype).forward(inputs)


def costed(specs: list[tuple[float, float, float]]) -> list[Measured]:
    """Measure a `CostBackend` per (fixed s, s per padded token, noise) on `TIMING`."""
    clock = FakeClock()
    return [
        measure(
            Candidate("fake", f"{f}+{k}", lambda f=f, k=k, n=n: CostBackend(clock, f, k, n)),
            REFERENCE,
            QUALITY_INPUTS,
            TIMING,
            compare,
            clock,
        )[0]
        for f, k, n in specs
    ]


def test_the_fitted_cost_line_is_the_candidates_own() -> None:
    (m,) = costed([(0.008, 0.0003, 0.0)])
    assert m.padded_tokens == {1: 6, 8: 48, 32: 192}  # B x L of each timing batch
    fixed, per_token = m.cost()
    assert fixed == pytest.approx(0.008) and per_token == pytest.approx(0.0003)
    assert m.seconds(100) == pytest.approx(0.038)


def test_small_batches_go_to_the_candidate_with_the_lower_fixed_cost() -> None:
    """One like onnxruntime float32 (less per call, more per token) and one like torch
    bfloat16 (more per call, less per token): the second serves large batches, the first
    batches up to where their cost lines cross, (0.012 - 0.008) / (0.0003 - 0.0001) = 20."""
    measured = costed([(0.008, 0.0003, 0.0), (0.012, 0.0001, 0.0)])
    large = fastest_passing(measured)
    assert large == 1
    assert route(measured, large) == Route(large=1, small=0, max_tokens=20)


def test_no_second_backend_when_it_saves_too_little_or_fails_the_check() -> None:
    # 8% cheaper at the smallest batch: within timing noise, one backend serves all
    close = costed([(0.0113, 0.00012, 0.0), (0.012, 0.0001, 0.0)])
    assert route(close, 1) == Route(large=1)
    # much cheaper per call, but its answers fail the check: never served
    wrong = costed([(0.001, 0.0003, 0.5), (0.012, 0.0001, 0.0)])
    assert not wrong[0].passed
    assert route(wrong, 1) == Route(large=1)
    # cheaper per call and per token: it is the fastest, and alone
    both = costed([(0.001, 0.00005, 0.0), (0.012, 0.0001, 0.0)])
    assert fastest_passing(both) == 0 and route(both, 0) == Route(large=0)


def test_a_routed_backend_sends_each_batch_by_its_padded_tokens() -> None:
    clock = FakeClock()
    small, large = CostBackend(clock, 0.0, 0.0, 0.0), CostBackend(clock, 0.0, 0.0, 0.0)
    routed = RoutedBackend(small, large, max_tokens=20)
    assert (routed.name, routed.dtype) == (large.name, large.dtype)
    routed.forward({"input_ids": torch.zeros(1, 20, dtype=torch.long)})  # 20 tokens
    routed.forward({"input_ids": torch.zeros(3, 6, dtype=torch.long)})  # 18
    routed.forward({"input_ids": torch.zeros(1, 21, dtype=torch.long)})  # 21
    routed.forward({"input_ids": torch.zeros(4, 6, dtype=torch.long)})  # 24
    assert (small.calls, large.calls) == (2, 2)
