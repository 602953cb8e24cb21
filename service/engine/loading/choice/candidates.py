"""Which candidates BACKEND and DTYPE allow on this machine, and the one that is served.

`auto` never guesses: every candidate this machine runs natively is built, timed on warm-up
batches of 1 to 32 inputs and checked against torch float32 on fixed texts
(`service.engine.loading.choice.ranking`); the fastest that passes is served. The inputs and the
check come from the engine (`Trial`: its own padded batches, its own pooling). Candidates:
- torch float32: the reference, always;
- onnxruntime float32 (CPU): exported once, cached (`service.backends.export`);
- torch bfloat16 on a CPU with native bfloat16 (AVX512-BF16 or AMX: elsewhere torch emulates
  it, far slower), and torch float16 and bfloat16 on CUDA;
- int8 (calibrated static, made by onnxruntime's quantizer and run on OpenVINO:
  `service.backends.int8`) only when DTYPE=int8 asks for it (never chosen by `auto`).
An explicit BACKEND and DTYPE serve that one candidate (measured, for /info), or torch float32
with one log line saying why when it cannot be built (a model that does not export). With both
`auto`, the choice is cached and a restart on the same machine reuses it without measuring
(`service.engine.loading.choice.choice_cache`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from service.backends import Backend
from service.backends.int8 import CalibrationBatches
from service.backends.packed import torch_backend
from service.backends.routed import RoutedBackend
from service.backends.torch_backend import TorchBackend, converted
from service.engine.loading.choice import choice_cache, quality
from service.engine.loading.choice.ranking import (
    Candidate,
    Compare,
    Inputs,
    Measured,
    Route,
    fastest_passing,
    measure,
    route,
)
from service.settings import Settings

if TYPE_CHECKING:
    import torch
    from transformers import Pipeline, PreTrainedModel

log = structlog.get_logger("service.backends")

PIPELINE_NOTE = (
    "fill-mask and token-classification run on torch (the pipeline's own forward and "
    "postprocess); BACKEND=onnx and DTYPE=int8 do not apply to them"
)


@dataclass(frozen=True)
class Trial:
    """What candidates are checked and timed on: padded int64 inputs [B, L] by name, as the
    engine feeds them. `quality_inputs`: the fixed texts every candidate's output is compared
    on, by `compare(float32's output, the candidate's)`; `timing`: one batch per size timed
    (1 to 32 inputs). An ONNX export traces `quality_inputs`. `calibration`: the padded
    batches of the calibration texts DTYPE=int8 is calibrated on (None: no int8)."""

    quality_inputs: Inputs
    timing: Sequence[Inputs]
    compare: Compare
    calibration: CalibrationBatches | None = None


@dataclass(frozen=True)
class Choice:
    """The backend served, every candidate's measurement, and the seconds the choice took."""

    backend: Backend
    measured: tuple[Measured, ...]
    seconds: float
    note: str | None = None
    # Where small batches run on a second candidate (`RoutedBackend`): its backend and dtype
    # and the largest batch, in padded tokens (B x L), it computes.
    small_batches: dict[str, str | int] | None = None
    # Reused from the cache (`choice_cache`): the summary of the start that measured it.
    cached: Mapping[str, object] | None = None

    def summary(self) -> dict[str, object]:
        """/info's `backend` object and the `backend_chosen` log line's fields: the served
        backend, each candidate's measurements (`Measured.summary`) and `checks`, the checks
        that ran with their bounds (`service.engine.loading.choice.quality.bounds`). A reused
        choice: the measuring start's object, with this start's `choice_s`, `reused: true` and
        the measuring start's seconds as `measured_s`."""
        if self.cached is not None:
            return {
                **self.cached,
                "choice_s": round(self.seconds, 2),
                "reused": True,
                "measured_s": self.cached.get("choice_s"),
            }
        out: dict[str, object] = {
            "name": self.backend.name,
            "dtype": self.backend.dtype,
            "compute": self.backend.compute,
            "choice_s": round(self.seconds, 2),
            "candidates": [m.summary() for m in self.measured],
        }
        ran = dict.fromkeys(c for m in self.measured if m.quality for c in m.quality.checks())
        if ran:
            out["checks"] = quality.bounds(tuple(ran))
        padded_because = getattr(self.backend, "padded_because", None)
        if self.backend.compute == "padded" and padded_because:
            out["padded_because"] = padded_because
        quantization = getattr(self.backend, "quantization", None)
        if quantization:
            out["quantization"] = quantization
        if self.small_batches:
            out["small_batches"] = self.small_batches
        if self.note:
            out["note"] = self.note
        return out


def native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """The CPU computes bfloat16 itself (the `avx512_bf16` or `amx_bf16` flag)."""
    try:
        flags = cpuinfo.read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def choose_backend(
    settings: Settings, pipe: Pipeline, folder: Path | None, trial: Trial, what: str = ""
) -> Choice:
    """The backend for the loaded float32 `pipe` (BACKEND, DTYPE), chosen as this module says,
    from the candidates' outputs and timings on `trial`. `folder`: the model's files (None:
    unknown; no ONNX then); `what`: what the engine answers and how it pools, part of the
    cached choice's key. Logs `backend_chosen` (one line)."""
    started = time.perf_counter()
    reference = TorchBackend(pipe.model, pipe.device)
    candidates = allowed(settings, pipe, folder, reference, trial.quality_inputs, trial.calibration)
    explicit = settings.backend != "auto" and settings.dtype != "auto"
    reusable = settings.backend == settings.dtype == "auto"
    cache = _cache_path(folder, what) if reusable else None
    if cache is not None and (reused := _reused(cache, candidates, started)) is not None:
        return _logged(reused)
    only = candidates[0] if len(candidates) == 1 else None
    if only is not None and (only.backend, only.dtype) == ("torch", "float32"):
        return _logged(_float32_only(reference, only, trial))
    expected = reference.forward(trial.quality_inputs)
    results = [
        measure(c, expected, trial.quality_inputs, trial.timing, trial.compare) for c in candidates
    ]
    measured = tuple(m for m, _ in results)
    for m in measured:
        if m.error is not None:
            log.warning("backend_unavailable", backend=m.backend, dtype=m.dtype, reason=m.error)
        elif m.quality is not None and not m.quality.passes():
            failed = list(m.quality.failed())
            log.info("backend_failed_checks", backend=m.backend, dtype=m.dtype, failed=failed)
    if explicit or settings.dtype == "int8":
        served = results[0][1]
        if served is None:
            log.warning("backend_fallback", to="torch float32", reason=measured[0].error)
            served = reference
        elif not measured[0].passed:
            failed = list(measured[0].quality.failed()) if measured[0].quality else []
            log.warning(
                "backend_below_quality", backend=served.name, dtype=served.dtype, failed=failed
            )
    else:
        best = fastest_passing(measured)
        served = reference if best is None else results[best][1] or reference
        if best is not None and results[best][1] is not None:
            choice = _routed(route(measured, best), results, started)
            if cache is not None:
                _remember(cache, choice)
            return _logged(choice)
    return _logged(Choice(served, measured, time.perf_counter() - started))


def _cache_path(folder: Path | None, what: str) -> Path | None:
    """Where this model's choice on this machine is cached; None without a local folder."""
    if folder is None:
        return None
    import torch

    try:
        return choice_cache.path_for(folder, what, torch.get_num_threads())
    except OSError:
        return None


def _reused(cache: Path, candidates: list[Candidate], started: float) -> Choice | None:
    """The cached choice, its candidates built again (no measuring); None when there is none,
    or one of them is no longer a candidate or fails to build (then the start measures)."""
    doc = choice_cache.read(cache)
    if doc is None:
        return None
    by_name = {(c.backend, c.dtype): c for c in candidates}
    large, small = doc["large"], doc.get("small")
    try:
        served: Backend = by_name[(large["backend"], large["dtype"])].build()
        if small:
            built = by_name[(small["backend"], small["dtype"])].build()
            served = RoutedBackend(built, served, int(small["max_padded_tokens"]))
    except Exception as exc:  # gone from the candidates, or no longer builds: measure again
        why = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        log.warning("backend_choice_not_reused", path=str(cache), reason=why)
        return None
    seconds = time.perf_counter() - started
    return Choice(served, (), seconds, small_batches=small or None, cached=doc["summary"])


def _remember(cache: Path, choice: Choice) -> None:
    """Cache `choice` for the next start; a cache folder that is not writable only logs."""
    backend = choice.backend
    large = backend.large if isinstance(backend, RoutedBackend) else backend
    small = choice.small_batches
    try:
        choice_cache.write(
            cache, {"backend": large.name, "dtype": large.dtype}, small, choice.summary()
        )
    except OSError as exc:
        log.info("backend_choice_not_cached", path=str(cache), reason=str(exc))


def _routed(plan: Route, results: list[tuple[Measured, Backend | None]], started: float) -> Choice:
    """The choice for `plan`: one backend, or two (`RoutedBackend`) when small batches run
    faster on another passing candidate (`service.engine.loading.choice.ranking.route`)."""
    measured = tuple(m for m, _ in results)
    large = results[plan.large][1]
    assert large is not None
    small = results[plan.small][1] if plan.small is not None else None
    if small is None:
        return Choice(large, measured, time.perf_counter() - started)
    where: dict[str, str | int] = {
        "backend": small.name,
        "dtype": small.dtype,
        "max_padded_tokens": plan.max_tokens,
    }
    served = RoutedBackend(small, large, plan.max_tokens)
    return Choice(served, measured, time.perf_counter() - started, small_batches=where)


def allowed(
    settings: Settings,
    pipe: Pipeline,
    folder: Path | None,
    ref: TorchBackend,
    example: Inputs,
    calibration: CalibrationBatches | None = None,
) -> list[Candidate]:
    """What BACKEND/DTYPE allow on this device, in the order they are measured (`example`:
    the inputs an ONNX export traces; `calibration`: what int8 is calibrated on)."""
    import torch

    from service.backends import int8, onnx_backend

    backend, dtype = settings.backend, settings.dtype
    cuda = str(pipe.device).startswith("cuda")
    threads = torch.get_num_threads()
    out: list[Candidate] = []
    if dtype == "int8":

        def static_int8() -> Backend:
            if calibration is None:
                raise ValueError("no calibration texts for int8")
            return int8.backend(_graph(pipe, folder, example), threads, calibration)

        return [Candidate("openvino", "int8", static_int8)]
    if backend in ("auto", "torch") and dtype in ("auto", "float32"):
        out.append(Candidate("torch", "float32", lambda: _packed_or(ref, pipe.model, cuda)))
    if backend in ("auto", "onnx") and dtype in ("auto", "float32") and not cuda:
        out.append(
            Candidate(
                "onnx",
                "float32",
                lambda: onnx_backend.OnnxBackend(_graph(pipe, folder, example), threads),
            )
        )
    for reduced in ("bfloat16", "float16"):
        native = cuda or (reduced == "bfloat16" and native_bf16())
        if backend in ("auto", "torch") and (dtype == reduced or (dtype == "auto" and native)):
            out.append(Candidate("torch", reduced, _torch(pipe, reduced)))
    return out


def _torch(pipe: Pipeline, dtype: str) -> Callable[[], Backend]:
    cuda = str(pipe.device).startswith("cuda")
    return lambda: _packed_or(None, converted(pipe.model, dtype), cuda, pipe.device)


def _packed_or(
    padded: TorchBackend | None,
    model: PreTrainedModel,
    cuda: bool,
    device: torch.device | str = "cpu",
) -> TorchBackend:
    """`model` packed (`service.backends.packed`) on the CPU where it supports it; else
    `padded` (or a padded backend on `model`), saying why in /info (`padded_because`).
    On CUDA batches stay padded (packing is measured and tested on the CPU only)."""
    if cuda:
        chosen = padded or TorchBackend(model, device)
        chosen.padded_because = "packed batches run on the CPU only"
        return chosen
    chosen = torch_backend(model, device)
    if chosen.compute == "padded" and padded is not None:
        padded.padded_because = chosen.padded_because
        return padded
    return chosen


def _float32_only(reference: TorchBackend, candidate: Candidate, trial: Trial) -> Choice:
    """BACKEND=torch DTYPE=float32: the one candidate, unmeasured; when it is packed, its
    answers on the quality texts are checked against the padded reference first, and a
    packed forward that fails them (or raises) falls back to padded with one log line."""
    started = time.perf_counter()
    served = candidate.build()
    quality = None
    if served is not reference:
        inputs = trial.quality_inputs
        try:
            quality = trial.compare(reference.forward(inputs), served.forward(inputs))
            failed = None if quality.passes() else "below the quality checks"
        except Exception as exc:
            failed = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        if failed is not None:
            log.warning("packed_fallback", to="padded", reason=failed)
            reference.padded_because = f"the packed forward failed at start: {failed}"
            served, quality = reference, None
    measured = Measured("torch", "float32", quality=quality, compute=served.compute)
    return Choice(served, (measured,), time.perf_counter() - started)


def _graph(pipe: Pipeline, folder: Path | None, example: Inputs) -> Path:
    """The float32 graph's path (the folder's own, cached, or exported now: logged)."""
    from service.backends.export import cached_graph

    if folder is None:
        raise ValueError("the model's files are not in a local folder")
    started = time.perf_counter()
    path, exported = cached_graph(pipe.model, folder, example)
    if exported:
        log.info("onnx_exported", path=str(path), export_s=round(time.perf_counter() - started, 2))
    return path


def pipeline_choice(settings: Settings, pipe: Pipeline) -> Choice:
    """The pipeline engine runs the pipeline's torch model: float32, or DTYPE's torch dtype
    (`pipe.model` is converted then)."""
    started = time.perf_counter()
    ref = TorchBackend(pipe.model, pipe.device)
    if settings.backend == "onnx" or settings.dtype == "int8":
        log.warning("backend_fallback", to="torch", reason=PIPELINE_NOTE)
    backend = ref
    if settings.dtype in ("bfloat16", "float16"):
        pipe.model = converted(pipe.model, settings.dtype)
        backend = TorchBackend(pipe.model, pipe.device)
    measured = (Measured("torch", backend.dtype),)
    return _logged(Choice(backend, measured, time.perf_counter() - started, PIPELINE_NOTE))


def _logged(choice: Choice) -> Choice:
    log.info("backend_chosen", **choice.summary())
    return choice
