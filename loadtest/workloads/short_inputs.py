"""Short inputs (8-100 tokens, about 42 mean): where per-request costs outside the model weigh.

``python -m loadtest.bench --only short_inputs`` (about 12 minutes; ``--quick`` about 3). Each
case (``CASES``: pooled embeddings on the default backend and on torch float32, token rows,
labels of a seeded classifier) runs on its own server and limit process: limit (b) swept over
batch sizes (``loadtest.limit.LimitWorker``); the server with wrk at each level, one JSON input
a request, with the worker's per-thread CPU; then rounds of one client against direct single
calls, and each paired level between two limit (b) points, split into what bounds it
(``loadtest.split.batches_alone``). Targets: throughput / limit (b) >= 0.78 at 32 clients and
>= 0.88 at 128; server / its own batches alone >= 0.95.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest import client, corpus, models, servers, split, wrk
from loadtest import limit as limit_mod
from loadtest.report import p50_target_ms
from loadtest.workloads import common

NAME = "short_inputs"
TARGETS = {32: 0.78, 128: 0.88}
ALONE_TARGET = 0.95


@dataclass(frozen=True, slots=True)
class Case:
    """One model and its answers: the model folder, what the server answers, and limit (b)'s
    pooling (``"mean"`` for pooled embeddings, None for token rows or labels)."""

    name: str
    model: Callable[[], str]
    answer: str
    pooling: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # the server's, on top of --env


CASES = {
    # The default model answers pooled sentence embeddings (mean, normalized): limit (b) pools too.
    "embeddings": Case("embeddings", limit_mod.default_model, "pooled embeddings", pooling="mean"),
    # The same on torch float32, side by side in one run: each case's limit (b) runs on its
    # own server's backend (loadtest.limit).
    "embeddings-torch-float32": Case(
        "embeddings-torch-float32",
        limit_mod.default_model,
        "pooled embeddings, BACKEND=torch DTYPE=float32",
        pooling="mean",
        env={"BACKEND": "torch", "DTYPE": "float32"},
    ),
    "token-rows": Case(
        "token-rows", limit_mod.default_model, "token rows (POOLING=none)", env={"POOLING": "none"}
    ),
    "classification": Case(
        "classification", lambda: str(models.minilm_classifier()), "labels (text-classification)"
    ),
}


def add_arguments(p: argparse._ArgumentGroup) -> None:
    p.add_argument(
        "--short-cases",
        default="embeddings,embeddings-torch-float32,classification",
        help=f"cases to run ({', '.join(CASES)})",
    )
    p.add_argument("--short-inputs", type=int, help="short inputs (default 2000, quick 500)")
    p.add_argument("--short-levels", help="wrk connections (default 1,8,32,128)")
    p.add_argument("--short-paired-levels", default="32,128", help="paired levels")
    p.add_argument("--short-seconds", type=float, help="seconds per point (default 6, quick 3)")
    p.add_argument("--short-paired-seconds", type=float, help="per paired point (default 8/3)")
    p.add_argument("--short-rounds", type=int, help="paired rounds (default 3, quick 1)")
    p.add_argument("--short-batch-sizes", help="limit (b) sweep (default 8,16,32,64,128)")
    p.add_argument("--short-one-client", type=int, help="inputs timed in turn (default 250/110)")


def finish_arguments(args: argparse.Namespace, results: Path) -> None:
    q = args.quick
    args.short_cases = args.short_cases.split(",")
    args.short_inputs = args.short_inputs or (500 if q else 2000)
    args.short_levels = common.ints(args.short_levels or "1,8,32,128")
    args.short_paired_levels = common.ints(args.short_paired_levels)
    args.short_seconds = args.short_seconds or (3.0 if q else 6.0)
    args.short_paired_seconds = args.short_paired_seconds or (3.0 if q else 8.0)
    args.short_rounds = args.short_rounds or (1 if q else 3)
    args.short_batch_sizes = common.ints(
        args.short_batch_sizes or ("16,32,64" if q else "8,16,32,64,128")
    )
    args.short_one_client = args.short_one_client or (110 if q else 250)


def run(args: argparse.Namespace) -> dict[str, Any]:
    wrk.executable()  # fail now, with the install line, if wrk is missing
    texts = corpus.short_inputs(args.short_inputs)
    tok = corpus._default_tokenizer()
    lengths = [len(ids) for ids in tok(texts)["input_ids"]]
    out: dict[str, Any] = {
        "inputs": {
            "n": len(texts),
            "tokens_mean": statistics.fmean(lengths),
            "tokens_min": min(lengths),
            "tokens_max": max(lengths),
        },
        "cases": {},
    }
    for name in args.short_cases:
        print(f"{NAME}: {name}", flush=True)
        out["cases"][name] = run_case(CASES[name], texts, args)
        partial = args.results / f"{NAME}-{name}.json"  # kept if a later case fails
        partial.write_text(json.dumps(out["cases"][name], indent=2, default=str) + "\n")
    return out


def run_case(case: Case, texts: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """The limit sweep, then the server's levels and paired rounds (module docstring)."""
    model = case.model()
    env = common.server_env(args, MODEL_ID=model, **case.env)
    log = args.results / f"{NAME}-{case.name}-limit-worker.log"
    with log.open("wb") as worker_log:
        worker = limit_mod.LimitWorker(
            len(texts), servers.REPO_ROOT, worker_log, input_set="short", env=env
        )
        try:
            res: dict[str, Any] = {"model": model, "answer": case.answer}
            res["limit"] = sweep(worker, case, args)
            with servers.pipeline_server(env, args.results / f"{NAME}-{case.name}.log") as srv:
                res["task"] = common.model_info(srv).get("task")
                res.update(client.run(serve_points(srv, case, texts, worker, res["limit"], args)))
        finally:
            worker.close()
    res["summary"] = summarize(res)
    return res


def sweep(worker: limit_mod.LimitWorker, case: Case, args: argparse.Namespace) -> dict[str, Any]:
    """Limit (b) at each batch size (one whole pass each)."""
    sizes = args.short_batch_sizes
    points = {bs: common.limit_b(worker, bs, args, pooling=case.pooling) for bs in sizes}
    by_size = {bs: rate for bs, (rate, _) in points.items()}
    best = max(by_size, key=by_size.__getitem__)
    print(
        "  limit (b): "
        + ", ".join(f"{bs}: {v:.0f}/s" for bs, v in by_size.items())
        + f" (best batch size {best})",
        flush=True,
    )
    out: dict[str, Any] = {
        "by_batch_size": by_size,
        "other_cpu_by_batch_size": {bs: other for bs, (_, other) in points.items()},
        "best_batch_size": best,
        "best": by_size[best],
    }
    return out


async def serve_points(
    srv: servers.Served,
    case: Case,
    texts: list[str],
    worker: limit_mod.LimitWorker,
    limit: dict[str, Any],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Closed levels, then the paired rounds, against the running server. Only the one-client
    rounds need the event loop; the rest blocks it, with nothing else running."""
    names = common.thread_names(srv)
    bodies = [common.json_body(t) for t in texts]

    def point(n: int, seconds: float) -> dict[str, Any]:
        return common.wrk_point(srv, bodies, n, seconds, names, args)

    wrk.run(srv.base + "/", bodies, 8, 2)  # warm up
    closed = {}
    for n in args.short_levels:
        closed[n] = p = point(n, args.short_seconds)
        print(
            f"  {n:>3} clients: {p['ok_per_s']:7.1f}/s p50 {p['p50_ms']:6.1f} ms; loop "
            f"{p['loop_ms_per_request']:.2f} ms/req, inference {p['inference_ms_per_input']:.2f}"
            f" + pool {p['other_ms_per_input']:.2f} ms/input (other processes "
            f"{p['other_cpu']:.0%})",
            flush=True,
        )
    reqs = [client.Request("POST", "/", body, (("Content-Type", common.JSON),)) for body in bodies]
    best = int(limit["best_batch_size"])

    async def paired_point(n: int) -> dict[str, Any]:
        got = point(n, args.short_paired_seconds)  # wrk: blocks the loop, nothing else runs
        return {**got, "inputs_per_s": got["ok_per_s"]}  # one input a request

    paired, one_client = await split.paired_rounds(
        args.short_rounds,
        args.short_paired_levels,
        lambda: common.limit_b(worker, best, args, pooling=case.pooling),
        lambda: split.one_client_in_turn(srv.base, reqs, worker, args.short_one_client),
        paired_point,
        srv.log,
        worker,
    )
    return {"closed": closed, "paired": paired, "one_client": one_client}


def summarize(res: dict[str, Any]) -> dict[str, float]:
    """The targets' figures: medians over rounds."""
    out: dict[str, float] = {}
    for n, points in res["paired"].items():
        out[f"ratio_at_{n}"] = common.median(p["ratio"] for p in points)
        out[f"over_alone_at_{n}"] = common.median(p["over_alone"] for p in points)
        out[f"forward_slowdown_at_{n}"] = common.median(
            p["forward_slowdown"] for p in points if "forward_slowdown" in p
        )
    ones = res["one_client"]
    out["one_client_p50_ms"] = common.median(p["p50_ms"] for p in ones)
    out["single_call_p50_ms"] = common.median(p["single_p50_ms"] for p in ones)
    out["one_client_target_ms"] = p50_target_ms(out["single_call_p50_ms"])
    return out


def table(result: dict[str, Any]) -> str:
    inp = result["inputs"]
    lines = [
        f"Short inputs: {inp['n']} inputs, {inp['tokens_mean']:.1f} tokens mean "
        f"({inp['tokens_min']}-{inp['tokens_max']}), one per request, wrk closed loop.",
        "",
    ]
    for name, res in result["cases"].items():
        lines += _case_table(name, res)
    return "\n".join(lines)


def _case_table(name: str, res: dict[str, Any]) -> list[str]:
    lim = res["limit"]
    sizes = lim["by_batch_size"]
    lines = [
        f"### {name}: {res.get('task')}, answers {res['answer']}",
        "",
        "| limit (b) batch size | " + " | ".join(str(b) for b in sizes) + " |",
        "| --- |" + " --- |" * len(sizes),
        "| inputs/s | " + " | ".join(f"{v:.1f}" for v in sizes.values()) + " |",
        "| other processes' CPU | "
        + " | ".join(f"{v:.0%}" for v in lim.get("other_cpu_by_batch_size", {}).values())
        + " |",
        "",
    ]
    lines += [
        f"| clients | inputs/s | p50 ms | p95 ms | p99 ms | non-200 | {common.CPU_HEAD} |",
        "|" + " --- |" * 10,
    ]
    for n, p in res["closed"].items():
        lines.append(
            f"| {n} | {p['ok_per_s']:.1f} | {common.ms(p['p50_ms'])} | {common.ms(p['p95_ms'])} "
            f"| {common.ms(p['p99_ms'])} | {p['requests'] - _ok(p)} | {common.cpu_cells(p)} |"
        )
    lines += [
        "",
        "| round | clients | limit (b) before | server | limit (b) after | ratio | batches alone "
        "| server / alone | forward under load | busy | model waits for a core | loop ms/req "
        "| other CPU (server, limit) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for n, points in res["paired"].items():
        for p in points:
            lines.append(
                f"| {p['round']} | {n} | {p['limit_b_before']:.1f} | {p['ok_per_s']:.1f} | "
                f"{p['limit_b_after']:.1f} | {p['ratio']:.2f} | "
                f"{common.ms(p.get('alone_inputs_per_s'))} | {p['over_alone']:.2f} | "
                f"{p.get('forward_slowdown', float('nan')):.2f}x | {p.get('busy', 0):.0%} | "
                f"{_model_waiting(p)} | {p['loop_ms_per_request']:.2f} | {p['other_cpu']:.0%}, "
                f"{p.get('limit_other_cpu', float('nan')):.0%} |"
            )
    s = res["summary"]
    lines += [""]
    for n, target in TARGETS.items():
        if f"ratio_at_{n}" in s:
            lines.append(
                f"- {n} clients: throughput / limit (b) {s[f'ratio_at_{n}']:.2f} (target "
                f">= {target}); server / its batches alone {s[f'over_alone_at_{n}']:.2f} "
                f"(target >= {ALONE_TARGET})"
            )
    lines += [
        f"- one client p50 {s['one_client_p50_ms']:.1f} ms against a direct call's "
        f"{s['single_call_p50_ms']:.1f} ms (goal 1.1x + 2 ms: {s['one_client_target_ms']:.1f})",
        "",
    ]
    return lines


def _model_waiting(point: dict[str, Any]) -> str:
    """Cores' worth of time the inference thread and torch's pool were runnable but waited for
    a CPU (taken by the loop, the client or each other), as a share of one core."""
    keys = ("inference_waiting_cores", "other_waiting_cores")
    if not any(k in point for k in keys):
        return "-"
    return f"{sum(point.get(k, 0.0) for k in keys):.1%}"


def _ok(point: dict[str, Any]) -> int:
    statuses = point.get("statuses") or {}
    if statuses:
        return int(sum(v for k, v in statuses.items() if int(k) == 200))
    return int(point["requests"] - point["errors"]["status"])
