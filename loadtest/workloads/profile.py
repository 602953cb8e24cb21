"""A py-spy profile of the server at 32 clients on short text-classification inputs.

``python -m loadtest.bench --only profile`` (about 1 minute). The MiniLM classifier
(``loadtest.models``) answers small label lists, so the loop's share is mostly HTTP and the
request path, not encoding. While wrk runs, py-spy records the worker (``--nonblocking``, 100
Hz, raw) and this prints:

- the loop (MainThread): the top 15 functions by self samples (the innermost Python frame:
  C code such as orjson or the socket calls counts in the Python function that called it),
  and by inclusive samples, as shares of the loop's samples (a sample is taken only while the
  OS runs the thread, so the loop's samples / (rate x seconds) is the core share it used);
- the inference thread outside torch's module call (the model's forward): the top 10 likewise,
  and the share of its samples inside the forward.

The raw record is kept as ``results/profile-raw.txt`` (``flamegraph.pl`` draws it).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from loadtest import corpus, models, pyspy, servers, wrk
from loadtest.workloads import common

NAME = "profile"
RATE = 100


def add_arguments(p: argparse._ArgumentGroup) -> None:
    p.add_argument("--profile-seconds", type=int, help="seconds recorded (default 20, quick 8)")
    p.add_argument("--profile-clients", type=int, default=32, help="wrk connections")


def finish_arguments(args: argparse.Namespace, results: Path) -> None:
    args.profile_seconds = args.profile_seconds or (8 if args.quick else 20)


def run(args: argparse.Namespace) -> dict[str, Any]:
    wrk.executable()
    env = common.server_env(args, MODEL_ID=str(models.minilm_classifier()))
    bodies = [common.json_body(t) for t in corpus.short_inputs(500)]
    seconds = args.profile_seconds
    with servers.pipeline_server(env, args.results / f"{NAME}.log") as srv:
        names = common.thread_names(srv)
        wrk.run(srv.base + "/", bodies, 8, 2)  # warm up
        rec = pyspy.Recording(srv.worker_pid, seconds, rate=RATE)
        point = common.wrk_point(srv, bodies, args.profile_clients, seconds + 1, names, args)
        stacks = rec.stacks()
    raw = args.results / "profile-raw.txt"
    raw.write_text(
        "".join(f"thread ({s.tid}): {s.thread};{';'.join(s.frames)} {s.count}\n" for s in stacks),
        encoding="utf-8",
    )
    samples = pyspy.per_thread(stacks)
    loop_self, loop_n = pyspy.top(stacks, "MainThread", 15)
    loop_incl, _ = pyspy.top(stacks, "MainThread", 15, inclusive=True)
    inf_self, inf_n = pyspy.top(stacks, "inference", 10, skip=pyspy.in_model_forward)
    inf_incl, _ = pyspy.top(stacks, "inference", 10, inclusive=True, skip=pyspy.in_model_forward)
    return {
        "point": point,
        "seconds": seconds,
        "samples": dict(samples),
        "loop_core_share": samples.get("MainThread", 0) / (RATE * seconds),
        "inference_core_share": samples.get("inference", 0) / (RATE * seconds),
        "inference_outside_forward_share": inf_n / max(1, samples.get("inference", 0)),
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
    p = result["point"]
    return "\n".join(
        [
            f"Profile: {result['args'].get('profile_clients')} wrk connections, short inputs, "
            f"text-classification, {p['ok_per_s']:.1f} answers/s; py-spy {RATE} Hz for "
            f"{result['seconds']} s. The loop ran {result['loop_core_share']:.0%} of a core "
            f"({result['loop_samples']} samples, {p['loop_ms_per_request']:.2f} ms of CPU per "
            f"request from /proc); the inference thread {result['inference_core_share']:.0%}, "
            f"{result['inference_outside_forward_share']:.0%} of its samples outside the "
            "model's forward.",
            "",
            *_rows("loop: self (innermost Python frame)", result["loop_self"]),
            *_rows("loop: inclusive", result["loop_inclusive"]),
            *_rows("inference outside forward: self", result["inference_self"]),
            *_rows("inference outside forward: inclusive", result["inference_inclusive"]),
        ]
    )
