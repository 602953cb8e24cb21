"""The mixed benchmark's ratios and Markdown tables (printed; docs/benchmarks.md quotes them)."""

from __future__ import annotations

import math
import os
import platform
import statistics
from collections.abc import Iterable
from importlib import metadata
from typing import Any


def machine() -> dict[str, Any]:
    """Where the figures come from: cores, CPU quota, Python and package versions."""
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="utf-8") as fh:
            quota = fh.read().strip()
    except OSError:
        quota = "unknown"
    versions = {}
    for dist in ("torch", "transformers", "tokenizers", "aiohttp", "uvicorn", "gunicorn"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "absent"
    # Other processes on the same cores skew every figure: the load average shows whether any ran.
    return {
        "loadavg_before": os.getloadavg(),
        "cpus": os.cpu_count(),
        "cgroup_cpu_max": quota,
        "python": platform.python_version(),
        "platform": platform.platform(),
        **versions,
    }


def p50_target_ms(single_call_ms: float) -> float:
    """The one-client goal: 1.1 x a direct single pipeline call + 2 ms."""
    return 1.1 * single_call_ms + 2


def _peak(closed: dict[Any, dict[str, Any]]) -> tuple[Any, float]:
    level = max(closed, key=lambda n: closed[n]["inputs_per_s"])
    return level, float(closed[level]["inputs_per_s"])


def ratios(result: dict[str, Any]) -> dict[str, float]:
    """The target figures, each as a ratio or a pair of milliseconds (NaN if missing)."""
    lim, srv = result["limit"], result["server"]
    closed = srv["closed"]
    top = max(closed)
    _, peak = _peak(closed)
    single = float(lim["single_call_ms"]["p50"])
    out = {
        "server_peak_inputs_per_s": peak,
        "server_peak_over_limit_a": peak / lim["limit_a"],
        "server_peak_over_limit_b": peak / lim["limit_b"],
        "server_top_level_over_limit_b": closed[top]["inputs_per_s"] / lim["limit_b"],
        "p50_one_client_ms": closed[min(closed)]["p50_ms"],
        "p50_one_client_target_ms": p50_target_ms(single),
        "single_call_p50_ms": single,
    }
    if pair := srv.get("paired"):  # measured in turn, seconds apart (bench.paired)
        for n, ratio in pair["median_ratio"].items():
            out[f"paired_server_over_limit_b_at_{n}_clients"] = float(ratio)
        for n, points in pair["levels"].items():  # what bounds each point (bench.batches_alone)
            split = [p for p in points if "alone_inputs_per_s" in p]
            if split:
                out[f"paired_batches_alone_over_limit_b_at_{n}_clients"] = statistics.median(
                    p["alone_inputs_per_s"] * 2 / (p["limit_b_before"] + p["limit_b_after"])
                    for p in split
                )
                out[f"paired_forward_slowdown_at_{n}_clients"] = statistics.median(
                    p["forward_slowdown"] for p in split
                )
        out["paired_p50_one_client_ms"] = float(pair["one_client_p50_ms"])
        out["paired_p50_one_client_target_ms"] = p50_target_ms(pair["single_call_p50_ms"])
        out["paired_single_call_p50_ms"] = float(pair["single_call_p50_ms"])
    if "baseline" in result:
        out["server_peak_over_baseline_peak"] = peak / _peak(result["baseline"]["closed"])[1]
    over = srv["overload"]
    runs = over["runs"]
    worst = runs[max(runs)]
    out.update(
        {
            "overload_top_multiple": float(max(runs)),
            "overload_top_goodput_over_capacity": worst["goodput_per_s"] / over["capacity_per_s"],
            "overload_top_shed_p99_ms": worst["shed_p99_ms"],
            "overload_floor_p99_ms": over["floor"]["p99_ms"],
        }
    )
    return out


def _ms(value: Any) -> str:
    missing = value is None or (isinstance(value, float) and math.isnan(value))
    return "-" if missing else f"{value:.1f}"


def _row(name: str, values: Iterable[float]) -> str:
    return f"| {name} | " + " | ".join(f"{v:.1f}" for v in values) + " |"


def _share(point: dict[str, Any]) -> str:
    """Share of the machine's CPU that other processes used during a point ("-" if unknown)."""
    return f"{point['other_cpu']:.0%}" if "other_cpu" in point else "-"


def _count(statuses: dict[Any, int], code: int) -> int:
    """Answers with ``code``; keys are ints in process and strings after a JSON round trip."""
    return sum(n for status, n in statuses.items() if int(status) == code)


def _closed_rows(name: str, closed: dict[Any, dict[str, Any]], per_s: str) -> list[str]:
    return [
        f"| {name} | {n} | {r[per_s]:.1f} | {_ms(r['p50_ms'])} | {_ms(r['p95_ms'])} "
        f"| {_ms(r['p99_ms'])} | {r['requests'] - _count(r['statuses'], 200)} "
        f"| {_share(r)} |"
        for n, r in closed.items()
    ]


def table(result: dict[str, Any]) -> str:
    """Markdown: the limit, closed-loop rows per system, paired rounds, overload, ratios."""
    lim, srv = result["limit"], result["server"]
    mach = result.get("machine", {})
    load = [f"{x:.1f}" for x in (*mach.get("loadavg_before", ()), *mach.get("loadavg_after", ()))]
    lines = [
        f"Machine: {mach.get('cpus', '?')} CPUs shared by client and server; load average "
        f"(1, 5, 15 min) before {', '.join(load[:3]) or '?'}, after {', '.join(load[3:]) or '?'}.",
        "",
        f"Limit ({lim['inputs']} inputs, {lim['tokens']['mean']:.0f} tokens mean, "
        f"{lim['tokens']['max']} max; torch threads {lim['torch_threads']}):",
        "",
        "| batch size | " + " | ".join(str(b) for b in lim["pipeline_batches"]) + " |",
        "| --- |" + " --- |" * len(lim["pipeline_batches"]),
        _row("(a) pipeline, inputs/s", lim["pipeline_batches"].values()),
        _row(
            "(b) tokenizer + model, length-sorted, inputs/s", lim["model_sorted_batches"].values()
        ),
        "",
        f"Other processes used {_share(lim)} of the CPU during the limit measurement. "
        f"Direct single pipeline call: p50 {lim['single_call_ms']['p50']:.1f} ms, "
        f"p99 {lim['single_call_ms']['p99']:.1f} ms.",
        "",
        "Closed loop (the client floor row counts /livez answers per second, not inputs):",
        "",
        "| system | clients | inputs/s | p50 ms | p95 ms | p99 ms | non-200 | other CPU |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *_closed_rows("client floor (/livez)", srv["floor"], "requests_per_s"),
        *_closed_rows("pipeline-server", srv["closed"], "inputs_per_s"),
        *(
            _closed_rows("seed baseline", result["baseline"]["closed"], "inputs_per_s")
            if "baseline" in result
            else []
        ),
        "",
        *_paired_rows(srv.get("paired")),
        *_overload_rows(srv["overload"]),
        "",
        *(f"- {k}: {v:.3f}" for k, v in result["ratios"].items()),
    ]
    return "\n".join(lines)


def _paired_rows(pair: dict[str, Any] | None) -> list[str]:
    """The paired rounds: each server point between two limit (b) points, and one client."""
    if not pair:
        return []
    rows = [
        f"| {p['round']} | {n} clients | {p['limit_b_before']:.1f} | {p['inputs_per_s']:.1f} | "
        f"{p['limit_b_after']:.1f} | {p['ratio']:.2f} | {_bounds(p)}"
        for n, points in pair["levels"].items()
        for p in points
    ]
    ones = [
        f"| {p['round']} | 1 client, p50 ms | direct call {p['single_p50_ms']:.1f} | "
        f"{p['p50_ms']:.1f} | | {p['p50_ms'] / p50_target_ms(p['single_p50_ms']):.2f} of target "
        "| | | |"
        for p in pair["one_client"]
    ]
    return [
        f"Paired rounds (limit (b) at batch size {pair['batch_size']}, one whole pass over the "
        "inputs, measured right before and after each server point). What bounds a point: its "
        "batches replayed alone by the server's own Engine right after it (inputs/s), how much "
        "longer their forward took under load, and the share of the point spent in batches:",
        "",
        "| round | server point | limit (b) before | server | limit (b) after | ratio "
        "| batches alone | forward under load | busy |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *ones,
        *rows,
        "",
    ]


def _bounds(point: dict[str, Any]) -> str:
    if "alone_inputs_per_s" not in point:
        return "| | |"
    return (
        f"{point['alone_inputs_per_s']:.1f} | {point['forward_slowdown']:.2f}x | "
        f"{point['busy']:.0%} |"
    )


def _overload_rows(over: dict[str, Any]) -> list[str]:
    head = [
        f"Overload, open loop (capacity {over['capacity_per_s']:.1f} requests/s, deadline "
        f"{over['deadline_s']:g} s; client floor at the top rate: /livez p50 "
        f"{_ms(over['floor']['p50_ms'])} / p99 {_ms(over['floor']['p99_ms'])} ms):",
        "",
        "| offered | goodput/s | shed | p99 accepted ms | shed p50 ms | shed p99 ms "
        "| other answers | other CPU |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    rows = []
    for mult, r in over["runs"].items():
        other = r["requests"] - _count(r["statuses"], 200) - _count(r["statuses"], 503)
        rows.append(
            f"| {mult:g}x | {r['goodput_per_s']:.1f} | {r['shed_rate']:.1%} | "
            f"{_ms(r['p99_ms'])} | {_ms(r['shed_p50_ms'])} | {_ms(r['shed_p99_ms'])} | "
            f"{other + r['dropped']} | {_share(r)} |"
        )
    return head + rows
