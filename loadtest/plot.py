"""The benchmark's PNG: throughput and p95 latency against concurrency, one line per system."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display here; must precede pyplot
import matplotlib.pyplot as plt


def _series(closed: dict[Any, dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    levels = sorted(closed, key=int)
    return [int(n) for n in levels], [float(closed[n][key]) for n in levels]


def plot(result: dict[str, Any], path: Path) -> None:
    """Draw two panels (inputs/s; p95 ms, log scale) with the limits as dashed lines."""
    srv, lim = result["server"], result["limit"]
    systems = [("pipeline-server", srv["closed"], "tab:blue")]
    if "baseline" in result:
        systems.append(("seed baseline", result["baseline"]["closed"], "tab:orange"))
    fig, (thr, lat) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, closed, color in systems:
        thr.plot(*_series(closed, "inputs_per_s"), marker="o", color=color, label=name)
        lat.plot(*_series(closed, "p95_ms"), marker="o", color=color, label=name)
    lat.plot(
        *_series(srv["floor"], "p95_ms"), marker=".", color="gray", label="client floor (/livez)"
    )
    thr.axhline(
        lim["limit_a"],
        ls="--",
        color="tab:green",
        label=f"limit (a) pipeline, batch {lim['limit_a_batch_size']}",
    )
    thr.axhline(
        lim["limit_b"],
        ls=":",
        color="tab:red",
        label=f"limit (b) model, sorted, batch {lim['limit_b_batch_size']}",
    )
    levels = _series(srv["closed"], "p95_ms")[0]
    for ax, label in ((thr, "inputs/s"), (lat, "p95 latency, ms (log)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(n) for n in levels])
        ax.set_xlabel("concurrent closed-loop clients")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    lat.set_yscale("log")
    thr.set_ylim(bottom=0)
    m = result.get("machine", {})
    model = Path(lim["model"])
    fig.suptitle(
        f"pipeline-server, {model.parent.name if model.name == 'model' else model.name}: "
        f"{lim['inputs']} "
        f"mixed inputs, {m.get('cpus', '?')} CPUs shared by client and server",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
