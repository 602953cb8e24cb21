"""Serving cost: the server's CPU per answered input against its backend's own, in process.

``python -m loadtest.bench --only cost`` (about 8 minutes; ``--quick`` about 3). On the short
corpus (2,000 inputs, about 42 tokens), one JSON input a request on ``POST /``, for the default
server and ``BACKEND=torch DTYPE=float32`` side by side in one run. Each round of each case:

1. the reference: the same backend in process (``loadtest.limit``: tokenizer + model + mean
   pooling, length-sorted batches of 32, the server's threads), its CPU-seconds per input and
   inputs/s, while the server idles;
2. wrk at 32 and 128 clients: the server's whole process tree's CPU-seconds (gunicorn's master
   and its worker, all threads, from /proc) per answered input, its inputs/s, and the event
   loop's CPU per request (the worker's loop thread alone);
3. the reference again. Each point is divided by the mean of the references around it (a
   machine's speed drifts within minutes; the server idles at about no CPU meanwhile).

Then one client at 10 requests/s (open loop, one 14-token input, one connection): the server's
CPU per request and its p50, against the same input on onnxruntime float32 in process (batch
of one, the server's own path, threads not spinning, called at the same pace): its CPU and p50
per call. The client's own floor (the same client and pace on ``GET /livez``) is measured
beside it, and the p50 is judged after taking it off. Medians of the rounds. Goals: CPU per
answered input / the reference's <= 1.15 at 32 clients and <= 1.1 at 128; inputs/s >= 0.85 of
the reference's; the loop <= 0.15 ms per request; one client's CPU <= 1.5x the call's, and its
p50 less the client's floor within 2 ms of the call's.

Last, the kernels (`kernels`): the default server again with oneDNN's creation lines on
(``ONEDNN_VERBOSE=profile_create``, its stdout line-buffered), warmed by the same wrk for 5 s,
then 32 clients for a point's seconds: oneDNN kernels made per batch in steady state (its
log's creation lines over its ``batch`` lines in that window; goal 0). And in process
(``loadtest.experiments.kernels``, 1,024 inputs): the CPU of an arrival-order batch of 32 run
for the first time against the same batch run again at once (goal: within 5%), with exact
shapes beside it, and transformers' padded forward on length-sorted batches.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]  # no stubs unless types-psutil

from loadtest import client, corpus, kernels, proc, servers, wrk
from loadtest import limit as limit_mod
from loadtest.workloads import common

NAME = "cost"
GOALS = {32: 1.15, 128: 1.1}
THROUGHPUT_GOAL = 0.85
LOOP_GOAL_MS = 0.15
ONE_CPU_GOAL = 1.5
ONE_P50_GOAL_MS = 2.0
ONE_RATE = 10.0
# The one-client input: 14 tokens with the embedded model's special tokens.
ONE_TEXT = "The quick brown fox jumps over the lazy dog near the river."
REFERENCE_BATCH = 32
FIRST_RUN_GOAL = 1.05  # a batch's CPU the first time it is seen over the same batch again
# glibc's stdbuf helper: preloaded, it makes the server's C stdout (oneDNN's lines)
# line-buffered, so they reach the log as they happen.
STDBUF = Path("/usr/libexec/coreutils/libstdbuf.so")


@dataclass(frozen=True, slots=True)
class Case:
    """A server's settings (on top of ``--env``) and its name in the tables."""

    name: str
    env: dict[str, str] = field(default_factory=dict)


CASES = {
    "default": Case("default"),
    "torch-float32": Case("torch-float32", {"BACKEND": "torch", "DTYPE": "float32"}),
}


def add_arguments(p: argparse._ArgumentGroup) -> None:
    p.add_argument("--cost-cases", default=",".join(CASES), help=f"of {', '.join(CASES)}")
    p.add_argument("--cost-levels", default="32,128", help="wrk connections")
    p.add_argument("--cost-rounds", type=int, help="rounds per case (default 3, quick 1)")
    p.add_argument("--cost-seconds", type=float, help="seconds per point (default 8, quick 4)")
    p.add_argument("--cost-one-seconds", type=float, help="one client (default 20, quick 8)")
    p.add_argument(
        "--cost-kernels",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="count kernel creations per batch, in the server and in process",
    )


def finish_arguments(args: argparse.Namespace, results: Path) -> None:
    q = args.quick
    args.cost_cases = args.cost_cases.split(",")
    args.cost_levels = common.ints(args.cost_levels)
    args.cost_rounds = args.cost_rounds or (1 if q else 3)
    args.cost_seconds = args.cost_seconds or (4.0 if q else 8.0)
    args.cost_one_seconds = args.cost_one_seconds or (8.0 if q else 20.0)


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) of process ``pid`` and its descendants."""
    total = 0.0
    root = psutil.Process(pid)
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:  # exited between listing and reading
            continue
        total += t.user + t.system
    return float(total)


def reference(worker: limit_mod.LimitWorker, n: int) -> dict[str, float]:
    """One whole pass of the in-process reference: inputs/s and CPU ms per input."""
    got = worker.ask(op="b", batch_size=REFERENCE_BATCH, pooling="mean")
    rate = float(got["inputs_per_s"])
    return {"inputs_per_s": rate, "cpu_ms_per_input": 1000 * float(got["cpu_s"]) / n}


def server_point(
    srv: servers.Served, bodies: list[bytes], n: int, seconds: float, names: dict[int, str]
) -> dict[str, Any]:
    """wrk with ``n`` connections: throughput, latency, the tree's CPU per answered input and
    the loop's per request."""
    window = proc.CpuWindow(srv.worker_pid, names)
    before = tree_cpu_s(srv.master_pid)
    window.start()
    res = wrk.run(srv.base + "/", bodies, n, seconds)
    split = window.stop()
    tree_s = tree_cpu_s(srv.master_pid) - before
    return {
        **res.summary(),
        **split.summary(res.requests, res.ok),
        "tree_cpu_ms_per_input": 1000 * tree_s / max(1, res.ok),
    }


def one_client(srv: servers.Served, seconds: float) -> dict[str, Any]:
    """One connection, open loop at ``ONE_RATE``/s on ``ONE_TEXT``: p50 and the tree's CPU
    per answered request (what a quiet pod is billed for, idle time included); then the
    client's floor: the same client and pace on ``GET /livez`` (the HTTP round trip and the
    client's own cost, about no server work), for a third of the time."""
    req = client.Request("POST", "/", common.json_body(ONE_TEXT), (("Content-Type", common.JSON),))
    floor = client.run(client.open_loop(srv.base, [client.LIVEZ], ONE_RATE, seconds / 3, 1))
    before = tree_cpu_s(srv.master_pid)
    got = client.run(client.open_loop(srv.base, [req], ONE_RATE, seconds, max_in_flight=1))
    tree_s = tree_cpu_s(srv.master_pid) - before
    summary = got.summary()
    ok = int(summary["statuses"].get(200, 0))  # type: ignore[union-attr]
    return {
        "p50_ms": summary["p50_ms"],
        "p99_ms": summary["p99_ms"],
        "floor_p50_ms": floor.summary()["p50_ms"],
        "answered": ok,
        "requests": summary["requests"],
        "tree_cpu_ms_per_request": 1000 * tree_s / max(1, ok),
    }


def one_reference(worker: limit_mod.LimitWorker, n: int) -> dict[str, float]:
    """``ONE_TEXT`` ``n`` times in process at the client's pace (``ONE_RATE``/s, the threads
    idle between calls as the server's are): p50 ms and CPU ms per call; and the p50 of as
    many calls back to back (warm threads and caches: the call's best case), for comparison."""
    got = worker.ask(op="engine_calls", text=ONE_TEXT, n=n, gap_s=1 / ONE_RATE)
    calls = got["ms"][1:]  # the first after the worker's own idle spell
    warm = worker.ask(op="engine_calls", text=ONE_TEXT, n=n)["ms"][1:]
    return {
        "p50_ms": statistics.median(calls),
        "cpu_ms_per_call": 1000 * float(got["cpu_s"]) / n,
        "back_to_back_p50_ms": statistics.median(warm),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    wrk.executable()  # fail now, with the install line, if wrk is missing
    texts = corpus.short_inputs(2000)
    out: dict[str, Any] = {"inputs": len(texts), "cases": {}}
    log = args.results / f"{NAME}-onnx-float32-limit-worker.log"
    onnx_env = common.server_env(args, BACKEND="onnx", DTYPE="float32")
    with log.open("wb") as sink:
        onnx = limit_mod.LimitWorker(
            len(texts), servers.REPO_ROOT, sink, input_set="short", env=onnx_env
        )
        try:
            for name in args.cost_cases:
                print(f"{NAME}: {name}", flush=True)
                out["cases"][name] = run_case(CASES[name], texts, onnx, args)
        finally:
            onnx.close()
    if args.cost_kernels:
        print(f"{NAME}: kernels", flush=True)
        out["kernels"] = kernels_point(args, [common.json_body(t) for t in texts])
    out["summary"] = summarize(out["cases"])
    return out


def kernels_point(args: argparse.Namespace, bodies: list[bytes]) -> dict[str, Any]:
    """Kernels made per batch by the default server in steady state (after 5 s of load), and
    in process the first run of each batch against the same batch again."""
    out: dict[str, Any] = {}
    env = common.server_env(args, **kernels.ENV)
    if STDBUF.exists():
        env.update({"LD_PRELOAD": str(STDBUF), "_STDBUF_O": "L"})
        path = args.results / f"{NAME}-kernels.log"
        with servers.pipeline_server(env, path) as srv:
            wrk.run(srv.base + "/", bodies, 32, 5)
            time.sleep(0.5)  # the last batch's lines written
            made_before, offset = kernels.count_in_log(path)
            wrk.run(srv.base + "/", bodies, 32, args.cost_seconds)
            time.sleep(0.5)
            made, _ = kernels.count_in_log(path, offset)
            tail = path.read_bytes()[offset:].decode(errors="replace")
            batches = sum(1 for line in tail.splitlines() if '"event":"batch"' in line)
        out["server"] = {
            "made_before_load": made_before,
            "made": made,
            "batches": batches,
            "per_batch": made / max(1, batches),
        }
        print(
            f"  server: {made} kernels made in {batches} batches at 32 clients after warm-up "
            f"({out['server']['per_batch']:.2f} a batch; {made_before} at start and warm-up)",
            flush=True,
        )
    else:
        out["server"] = {"skipped": f"{STDBUF} not found"}
    target = args.results / f"{NAME}-kernels-in-process.json"
    full = {**os.environ, **common.server_env(args), "PYTHONPATH": str(servers.REPO_ROOT)}
    command = [sys.executable, "-m", "loadtest.experiments.kernels", "--n", "1024"]
    log = args.results / f"{NAME}-kernels-in-process.log"
    with log.open("wb") as sink:
        subprocess.run(
            [*command, "--json", str(target)], env=full, stdout=sink, stderr=sink, check=True
        )
    out["in_process"] = json.loads(target.read_text())
    for row in out["in_process"]["ways"]:
        print(f"  in process: {row}", flush=True)
    return out


def run_case(
    case: Case, texts: list[str], onnx: limit_mod.LimitWorker, args: argparse.Namespace
) -> dict[str, Any]:
    """Rounds of reference, levels, reference; then one client against onnxruntime's call."""
    env = common.server_env(args, **case.env)
    log = args.results / f"{NAME}-{case.name}-limit-worker.log"
    bodies = [common.json_body(t) for t in texts]
    n = len(texts)
    with log.open("wb") as sink:
        worker = limit_mod.LimitWorker(n, servers.REPO_ROOT, sink, input_set="short", env=env)
        try:
            with servers.pipeline_server(env, args.results / f"{NAME}-{case.name}.log") as srv:
                res: dict[str, Any] = {"backend": worker.ask(op="backend"), "rounds": []}
                names = common.thread_names(srv)
                wrk.run(srv.base + "/", bodies, 8, 2)  # warm up
                ref = reference(worker, n)
                for r in range(args.cost_rounds):
                    points = {}
                    for level in args.cost_levels:
                        got = server_point(srv, bodies, level, args.cost_seconds, names)
                        after = reference(worker, n)
                        points[level] = _against(got, ref, after)
                        ref = after
                        _print_point(r, level, points[level])
                    res["rounds"].append(points)
                res["one_client"] = _one_rounds(srv, onnx, args)
        finally:
            worker.close()
    return res


def _against(
    point: dict[str, Any], before: dict[str, float], after: dict[str, float]
) -> dict[str, Any]:
    """A server point over the mean of the references measured just before and after it."""
    ref_cpu = (before["cpu_ms_per_input"] + after["cpu_ms_per_input"]) / 2
    ref_rate = (before["inputs_per_s"] + after["inputs_per_s"]) / 2
    return {
        **point,
        "reference_cpu_ms_per_input": ref_cpu,
        "reference_inputs_per_s": ref_rate,
        "reference_drift": after["inputs_per_s"] / before["inputs_per_s"],
        "cpu_ratio": point["tree_cpu_ms_per_input"] / ref_cpu,
        "throughput_ratio": point["ok_per_s"] / ref_rate,
    }


def _one_rounds(
    srv: servers.Served, onnx: limit_mod.LimitWorker, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """One client against onnxruntime float32's call in process, in turn, each round."""
    calls = max(20, int(ONE_RATE * args.cost_one_seconds / 2))
    out = []
    for _ in range(args.cost_rounds):
        before = one_reference(onnx, calls)
        served = one_client(srv, args.cost_one_seconds)
        after = one_reference(onnx, calls)
        ref_cpu = (before["cpu_ms_per_call"] + after["cpu_ms_per_call"]) / 2
        ref_p50 = (before["p50_ms"] + after["p50_ms"]) / 2
        point = {
            **served,
            "reference_cpu_ms_per_call": ref_cpu,
            "reference_p50_ms": ref_p50,
            "reference_back_to_back_p50_ms": (
                before["back_to_back_p50_ms"] + after["back_to_back_p50_ms"]
            )
            / 2,
            "cpu_ratio": served["tree_cpu_ms_per_request"] / ref_cpu,
            "p50_over_ms": served["p50_ms"] - served["floor_p50_ms"] - ref_p50,
        }
        print(
            f"  one client at {ONE_RATE:g}/s: p50 {point['p50_ms']:.1f} ms (client floor "
            f"{point['floor_p50_ms']:.1f}, in process {ref_p50:.1f}, back to back "
            f"{point['reference_back_to_back_p50_ms']:.1f}), CPU "
            f"{point['tree_cpu_ms_per_request']:.2f} ms/request (in process {ref_cpu:.2f}): "
            f"{point['cpu_ratio']:.2f}x",
            flush=True,
        )
        out.append(point)
    return out


def _print_point(r: int, level: int, p: dict[str, Any]) -> None:
    print(
        f"  round {r} {level:>3} clients: {p['ok_per_s']:.1f}/s ({p['throughput_ratio']:.2f} of "
        f"in process), CPU {p['tree_cpu_ms_per_input']:.2f} ms/input against "
        f"{p['reference_cpu_ms_per_input']:.2f} ({p['cpu_ratio']:.2f}x), loop "
        f"{p['loop_ms_per_request']:.3f} ms/request",
        flush=True,
    )


def summarize(cases: dict[str, Any]) -> dict[str, Any]:
    """Medians over rounds per case and level, and the default server over torch float32's."""
    out: dict[str, Any] = {}
    for name, res in cases.items():
        s: dict[str, float] = {}
        levels = res["rounds"][0].keys() if res["rounds"] else []
        for level in levels:
            pts = [rnd[level] for rnd in res["rounds"]]
            for key in ("cpu_ratio", "throughput_ratio", "loop_ms_per_request", "ok_per_s"):
                s[f"{key}_at_{level}"] = common.median(p[key] for p in pts)
            s[f"reference_inputs_per_s_at_{level}"] = common.median(
                p["reference_inputs_per_s"] for p in pts
            )
        ones = res.get("one_client", [])
        for key in ("cpu_ratio", "p50_over_ms", "p50_ms", "reference_p50_ms"):
            s[f"one_{key}"] = common.median(p[key] for p in ones)
        out[name] = s
    if {"default", "torch-float32"} <= cases.keys():
        d, t = out["default"], out["torch-float32"]
        for key in d:
            if key.startswith(("ok_per_s_at_", "reference_inputs_per_s_at_")):
                out.setdefault("default_over_torch_float32", {})[key] = d[key] / t[key]
    return out


def _ratio_cell(value: float, goal: float, at_most: bool = True) -> str:
    met = value <= goal if at_most else value >= goal
    return f"{value:.2f} ({'meets' if met else 'misses'} {'<=' if at_most else '>='} {goal:g})"


def table(result: dict[str, Any]) -> str:
    lines = [
        f"Serving cost: short corpus ({result['inputs']} inputs), one JSON input a request; "
        "CPU ms per answered input (server's process tree) against the same backend in process "
        f"(length-sorted batches of {REFERENCE_BATCH}, the mean of the references before and "
        "after each point).",
        "",
        "| case | clients | round | inputs/s | of in process | CPU ms/input | in process "
        "| CPU ratio | loop ms/req | p50 ms | p99 ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, res in result["cases"].items():
        for r, points in enumerate(res["rounds"]):
            for level, p in points.items():
                lines.append(
                    f"| {name} | {level} | {r} | {p['ok_per_s']:.1f} | "
                    f"{p['throughput_ratio']:.2f} | {p['tree_cpu_ms_per_input']:.2f} | "
                    f"{p['reference_cpu_ms_per_input']:.2f} | {p['cpu_ratio']:.2f} | "
                    f"{p['loop_ms_per_request']:.3f} | {common.ms(p['p50_ms'])} | "
                    f"{common.ms(p['p99_ms'])} |"
                )
    lines += [
        "",
        f"One client at {ONE_RATE:g} requests/s (one {ONE_TEXT!r} a request) against "
        "onnxruntime float32 in process (batch of one, the server's path):",
        "",
        "| case | round | p50 ms | client floor p50 | in process p50 | p50 - floor - in process "
        "| in process back to back p50 | CPU ms/request | in process CPU | ratio |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, res in result["cases"].items():
        for r, p in enumerate(res.get("one_client", [])):
            lines.append(
                f"| {name} | {r} | {p['p50_ms']:.1f} | {p['floor_p50_ms']:.1f} | "
                f"{p['reference_p50_ms']:.1f} | {p['p50_over_ms']:.1f} | "
                f"{common.ms(p.get('reference_back_to_back_p50_ms'))} | "
                f"{p['tree_cpu_ms_per_request']:.2f} | {p['reference_cpu_ms_per_call']:.2f} | "
                f"{p['cpu_ratio']:.2f} |"
            )
    lines += kernel_lines(result.get("kernels"))
    lines += ["", *summary_lines(result["summary"])]
    return "\n".join(lines)


def kernel_lines(got: dict[str, Any] | None) -> list[str]:
    """The kernels part of the table: made per batch in the server, first run against again."""
    if not got:
        return []
    server = got.get("server", {})
    lines = ["", "Kernels (oneDNN primitives made; the default server, 32 clients, after 5 s):", ""]
    if "skipped" in server:
        lines.append(f"- server: skipped ({server['skipped']})")
    else:
        lines.append(
            f"- server: {server['made']} made in {server['batches']} batches: "
            f"**{server['per_batch']:.2f} a batch** (goal 0)"
        )
    proc_result = got.get("in_process", {})
    lines += [
        "",
        f"In process, arrival-order batches of 32 ({proc_result.get('inputs')} short inputs), "
        f"side by side; warm-up {proc_result.get('warm')}; buckets {proc_result.get('buckets')}:",
        "",
        "| way | CPU ms/input | made/batch | again at once | made | first / again |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in proc_result.get("ways", []):
        ratio = r.get("first_over_second")
        judged = (
            "-"
            if ratio is None
            else f"{ratio:.3f} ({'meets' if ratio <= FIRST_RUN_GOAL else 'misses'} "
            f"<= {FIRST_RUN_GOAL:g})"
        )
        lines.append(
            f"| {r['way']} | {r['cpu_ms_per_input']} | {r['creations_per_batch']} | "
            f"{r.get('second_cpu_ms_per_input', '-')} | "
            f"{r.get('second_creations_per_batch', '-')} | {judged} |"
        )
    return lines


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The goals, each with its median and whether it is met."""
    lines: list[str] = []
    for name, s in summary.items():
        if name == "default_over_torch_float32":
            continue
        for level, goal in GOALS.items():
            if f"cpu_ratio_at_{level}" not in s:
                continue
            lines.append(
                f"- {name}, {level} clients: CPU ratio "
                f"{_ratio_cell(s[f'cpu_ratio_at_{level}'], goal)}, of in-process throughput "
                f"{_ratio_cell(s[f'throughput_ratio_at_{level}'], THROUGHPUT_GOAL, False)}, "
                f"loop ms/request {_ratio_cell(s[f'loop_ms_per_request_at_{level}'], LOOP_GOAL_MS)}"
            )
        if "one_cpu_ratio" in s:
            lines.append(
                f"- {name}, one client: CPU over onnxruntime float32's call in process "
                f"{_ratio_cell(s['one_cpu_ratio'], ONE_CPU_GOAL)}; p50 {s['one_p50_ms']:.1f} ms, "
                f"over the client's floor and the call's "
                f"{_ratio_cell(s['one_p50_over_ms'], ONE_P50_GOAL_MS)} ms"
            )
    ratios = summary.get("default_over_torch_float32", {})
    for key, value in ratios.items():
        what = "server" if key.startswith("ok_per_s") else "in process"
        lines.append(
            f"- default / torch float32, {what} ({key.rsplit('_', 1)[1]} clients): {value:.2f}x"
        )
    return lines
