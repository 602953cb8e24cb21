"""A py-spy profile of the server at 32 clients on short text-classification inputs.

``python -m loadtest.experiments.bench --only profile`` (about 1 minute). The MiniLM
classifier (``loadtest.models``) answers small label lists, so the loop's share is mostly HTTP
and the request path, not encoding; ``--profile-model embedded`` profiles the default server
on the embedded model instead (384 floats an answer). While wrk runs, py-spy records the worker
(``--nonblocking``, 100 Hz, raw) and this prints:

- the loop (MainThread): the top 15 functions by self samples (the innermost Python frame:
  C code such as orjson or the socket calls counts in the Python function that called it),
  and by inclusive samples, as shares of the loop's samples (a sample is taken only while the
  OS runs the thread, so the loop's samples / (rate x seconds) is the core share it used);
- the inference thread outside torch's module call (the model's forward): the top 10 likewise,
  and the share of its samples inside the forward.

The raw records are kept as ``results/profile-{python,native}-raw.txt`` (``flamegraph.pl``
draws them). ``--profile-native`` adds a record with C frames (uvloop's writes, orjson,
tokenizers), for which py-spy pauses the server at every sample (slower, so a separate point).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from loadtest import corpus, models, servers, wrk
from loadtest.experiments import pyspy
from loadtest.workloads import common

NAME = "profile"
RATE = 100


def add_arguments(p: argparse._ArgumentGroup) -> None:
    p.add_argument("--profile-seconds", type=int, help="seconds recorded (default 20, quick 8)")
    p.add_argument("--profile-clients", type=int, default=32, help="wrk connections")
    p.add_argument(
        "--profile-model",
        choices=("classifier", "embedded"),
        default="classifier",
        help="the MiniLM classifier (small answers) or the embedded model (384 floats an answer)",
    )
    p.add_argument("--profile-rate", type=int, default=RATE, help="py-spy samples per second")
    p.add_argument(
        "--profile-native",
        action="store_true",
        help="a second record with C frames (py-spy --native: pauses the server per sample)",
    )


def finish_arguments(args: argparse.Namespace, results: Path) -> None:
    args.profile_seconds = args.profile_seconds or (8 if args.quick else 20)


def run(args: argparse.Namespace) -> dict[str, Any]:
    wrk.executable()
    classifier = args.profile_model == "classifier"
    model = {"MODEL_ID": str(models.minilm_classifier())} if classifier else {}
    env = common.server_env(args, **model)
    bodies = [common.json_body(t) for t in corpus.short_inputs(500)]
    out: dict[str, Any] = {"seconds": args.profile_seconds, "model": args.profile_model}
    with servers.pipeline_server(env, args.results / f"{NAME}.log") as srv:
        names = common.thread_names(srv)
        wrk.run(srv.base + "/", bodies, 8, 2)  # warm up
        out["python"] = record(srv, bodies, names, args, native=False)
        if args.profile_native:
            out["native"] = record(srv, bodies, names, args, native=True)
    return out


def record(
    srv: servers.Served,
    bodies: list[bytes],
    names: dict[int, str],
    args: argparse.Namespace,
    native: bool,
) -> dict[str, Any]:
    """One wrk point with py-spy recording over it; the tops (module docstring)."""
    seconds = args.profile_seconds
    rate = args.profile_rate
    rec = pyspy.Recording(srv.worker_pid, seconds, rate=rate, native=native)
    point = common.wrk_point(srv, bodies, args.profile_clients, seconds + 1, names, args)
    stacks = rec.stacks()
    raw = args.results / f"profile-{'native' if native else 'python'}-raw.txt"
    raw.write_text(
        "".join(f"thread ({s.tid}): {s.thread};{';'.join(s.frames)} {s.count}\n" for s in stacks),
        encoding="utf-8",
    )
    # A --native record samples every thread whatever it does: keep what ran (not idle, not
    # waiting for the GIL), and count the GIL waits apart.
    active = [s for s in stacks if not pyspy.idle(s) and not pyspy.gil_wait(s)]
    samples = pyspy.per_thread(active)
    waits = pyspy.per_thread(s for s in stacks if pyspy.gil_wait(s))
    # Shares of the time: samples / (rate x seconds) without --native, where py-spy keeps up
    # and drops idle samples; with it, py-spy falls behind (it pauses the process to sample),
    # so each thread's share is of its own samples.
    everything = pyspy.per_thread(stacks)

    def share(name: str, counts: dict[str, int]) -> float:
        return counts.get(name, 0) / max(1, everything.get(name, 0) if native else rate * seconds)

    loop_self, loop_n = pyspy.top(active, "MainThread", 15)
    loop_incl, _ = pyspy.top(active, "MainThread", 15, inclusive=True)
    inf_self, inf_n = pyspy.top(active, "inference", 10, skip=pyspy.outside_forward)
    inf_incl, _ = pyspy.top(active, "inference", 10, inclusive=True, skip=pyspy.outside_forward)
    return {
        "point": point,
        "rate": rate,
        "native": native,
        "raw": str(raw),
        "samples": dict(samples),
        "loop_core_share": share("MainThread", samples),
        "inference_core_share": share("inference", samples),
        "inference_outside_forward_share": inf_n / max(1, samples.get("inference", 0)),
        "gil_wait_share": {name: share(name, waits) for name in waits},
        "loop_self": loop_self,
        "loop_inclusive": loop_incl,
        "inference_self": inf_self,
        "inference_inclusive": inf_incl,
        "loop_samples": loop_n,
        "inference_outside_samples": inf_n,
    }


def _rows(title: str, entries: list[tuple[str, float]]) -> list[str]:
    return [
        f"| {title} | share |",
        "| --- | --- |",
        *(f"| `{name}` | {share:.1%} |" for name, share in entries),
        "",
    ]


def table(result: dict[str, Any]) -> str:
    lines: list[str] = []
    for kind in ("python", "native"):
        if kind in result:
            lines += _record_table(result[kind], result["seconds"], result.get("model"))
    return "\n".join(lines)


def _record_table(r: dict[str, Any], seconds: int, model: str | None) -> list[str]:
    p = r["point"]
    how = "--native, blocking" if r["native"] else "Python frames, --nonblocking"
    return [
        f"Profile ({how}): {p['connections']} wrk connections, short inputs, "
        f"{'embeddings' if model == 'embedded' else 'text-classification'}, "
        f"{p['ok_per_s']:.1f} answers/s; py-spy {r.get('rate', RATE)} Hz for "
        f"{seconds} s. "
        f"The loop ran {r['loop_core_share']:.0%} of a core ({r['loop_samples']} samples; "
        f"{p['loop_ms_per_request']:.2f} ms of CPU per request from /proc); the inference "
        f"thread {r['inference_core_share']:.0%}, {r['inference_outside_forward_share']:.0%} of "
        "its samples outside the model's forward."
        + (
            " Waiting for the GIL (share of the time): "
            + ", ".join(f"{k} {v:.1%}" for k, v in r["gil_wait_share"].items())
            if r["native"]
            else ""
        )
        + " Raw: "
        + r["raw"],
        "",
        *_rows("loop: self (innermost frame)", r["loop_self"]),
        *_rows("loop: inclusive", r["loop_inclusive"]),
        *_rows("inference outside forward: self", r["inference_self"]),
        *_rows("inference outside forward: inclusive", r["inference_inclusive"]),
    ]
