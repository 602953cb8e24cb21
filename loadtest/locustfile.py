"""Locust traffic for pipeline-server: realistic requests, named failure categories, load shapes.

Run (the host comes from ``--host`` as usual)::

    locust -f loadtest/locustfile.py --host http://127.0.0.1:8000 --headless \\
        --shape step -u 64 -r 16 -t 60s \\
        --csv loadtest/results/step --html loadtest/results/step.html \\
        --slo-max-p95-ms 2000 --slo-max-shed-rate 0.05

Traffic (weights in brackets): raw text, short [4]; JSON with one long passage [1]; JSON with
one input [3]; JSON lists of 2-8 inputs [2]; the seed guide's curl payload sent as ``curl -d``
does [1]. Inputs come from ``loadtest/corpus.txt`` (public-domain texts, sources in its header).
JSON requests ask for truncation (``parameters.truncation``, which every task takes): passages
of several hundred tokens exceed the default model's 256, and a load test is not about 422s.

Users: ``InferenceUser`` [3] ignores Retry-After; ``PoliteUser`` [1] waits as long as a 503's
Retry-After says (pick one by its class name on the command line). Every non-200 answer is a
failure named by category (``loadtest.outcomes``). Shapes: ``--shape`` steady | step | burst,
driven by ``-u``, ``-r`` and ``-t``. When Locust quits, it prints a short summary and the SLO
gate's lines, and the gate sets the exit code from the ``--slo-*`` thresholds (by default: any
error or rejection fails). With ``--logfile``, Locust's own tables go to that file too
(``make locust``).
"""

from __future__ import annotations

import json
import logging
import random
import sys
import time
from pathlib import Path
from typing import Any

from locust import FastHttpUser, LoadTestShape, events, task

try:
    from loadtest import corpus, gate, outcomes, shapes
except ImportError:  # Locust puts only this file's folder on sys.path, not the repository root.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from loadtest import corpus, gate, outcomes, shapes

_SHORT = (corpus.LengthClass("short", 1.0, 4, 25),)
_LONG = (corpus.LengthClass("long", 1.0, 150, corpus.MAX_WORDS),)
_TEXT = {"Content-Type": "text/plain; charset=utf-8"}
_JSON = {"Content-Type": "application/json"}
_FORM = {"Content-Type": "application/x-www-form-urlencoded"}  # what `curl -d` sends


def _json(inputs: str | list[str]) -> str:
    return json.dumps({"inputs": inputs, "parameters": {"truncation": True}})


def _add_options(parser: Any, **_: Any) -> None:
    group = parser.add_argument_group("pipeline-server")
    add = group.add_argument
    add(
        "--shape",
        choices=shapes.SHAPES,
        default="steady",
        help="load shape over -t: steady at -u users; -u in --steps equal steps; "
        "bursts to -u from a quarter of it",
    )
    add("--steps", type=int, default=4, help="steps of the step shape")
    add("--burst-every-s", type=float, default=20.0, help="burst shape: a burst starts this often")
    add("--burst-length-s", type=float, default=5.0, help="burst shape: how long a burst lasts")
    add("--think-max-ms", type=float, default=100.0, help="a user's pause, 0..this (ms)")
    add("--deadline-s", type=float, default=0.0, help="X-Request-Timeout to send (0: none)")
    add("--max-retry-after-s", type=float, default=30.0, help="PoliteUser's longest wait")
    gate.add_threshold_options(group, prefix="slo-")


def _tables_to_logfile(environment: Any, **_: Any) -> None:
    """With ``--logfile``, Locust sends its log there but still prints its stats tables (about
    350 lines for a 60 s run) on the console: send them to the file as well."""
    options = environment.parsed_options
    logfile = getattr(options, "logfile", None) if options else None
    if not logfile:
        return
    tables = logging.getLogger("locust.stats_logger")
    handler = logging.FileHandler(logfile)
    handler.setFormatter(logging.Formatter("%(message)s"))
    tables.handlers = [
        h
        for h in tables.handlers
        if not (isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler))
    ]
    tables.addHandler(handler)


def _slo_gate(environment: Any, **_: Any) -> None:
    """Print the run's summary and the gate's verdict; the verdict is the exit code."""
    total = environment.stats.total
    failures = dict.fromkeys(outcomes.CATEGORIES, 0)
    for entry in environment.stats.errors.values():
        failures[outcomes.category_of(str(entry.error))] += entry.occurrences
    run = gate.RunSummary(
        total.num_requests,
        float(total.get_response_time_percentile(0.95) or 0),
        failures,
        float(total.get_response_time_percentile(0.5) or 0),
        float(total.total_rps),
    )
    print("\n".join(gate.describe(run)))
    limits = gate.thresholds_from(environment.parsed_options, prefix="slo-")
    environment.process_exit_code = 0 if gate.report(gate.evaluate(run, limits)) else 1


events.init_command_line_parser.add_listener(_add_options)  # type: ignore[no-untyped-call]
events.init.add_listener(_tables_to_logfile)  # type: ignore[no-untyped-call]
events.quitting.add_listener(_slo_gate)  # type: ignore[no-untyped-call]


class InferenceUser(FastHttpUser):
    """A client sending the mixed traffic; it does not honour Retry-After."""

    weight = 3

    def on_start(self) -> None:
        """Seed this user's own input stream and read the run's options once."""
        self.rng = random.Random()
        options = self.environment.parsed_options
        self.think_s = (options.think_max_ms if options else 100.0) / 1000
        deadline = options.deadline_s if options else 0.0
        self.extra = {"X-Request-Timeout": f"{deadline:g}"} if deadline > 0 else {}
        self.not_before = 0.0

    def wait_time(self) -> float:
        """Think time in seconds, stretched to honour a pending Retry-After."""
        return max(self.rng.uniform(0, self.think_s), self.not_before - time.monotonic())

    def post(self, name: str, body: str, headers: dict[str, str]) -> None:
        """POST / and classify the answer (``loadtest.outcomes.failure_name``)."""
        with self.client.post(
            "/",
            data=body,
            headers={**headers, **self.extra},
            name=name,
            catch_response=True,
        ) as resp:
            problem = outcomes.failure_name(resp.status_code or 0, resp.content or b"")
            if problem is None:
                resp.success()
            else:
                resp.failure(problem)
                if resp.status_code == 503:
                    self.on_shed(resp.headers.get("Retry-After"))

    def on_shed(self, retry_after: str | None) -> None:
        """What to do after a 503: nothing, for this impatient user."""

    @task(4)
    def raw_short(self) -> None:
        self.post("POST / raw short", corpus.draw(self.rng, _SHORT), _TEXT)

    @task(1)
    def json_long(self) -> None:
        self.post("POST / json long", _json(corpus.draw(self.rng, _LONG)), _JSON)

    @task(3)
    def json_single(self) -> None:
        self.post("POST / json", _json(corpus.draw(self.rng)), _JSON)

    @task(2)
    def json_list(self) -> None:
        inputs = [corpus.draw(self.rng) for _ in range(self.rng.randint(2, 8))]
        self.post("POST / json list", _json(inputs), _JSON)

    @task(1)
    def seed_curl(self) -> None:
        self.post("POST / seed curl", corpus.SEED_PAYLOAD, _FORM)


class PoliteUser(InferenceUser):
    """The same traffic, but after a 503 it waits as long as Retry-After says (capped)."""

    weight = 1

    def on_shed(self, retry_after: str | None) -> None:
        """Hold the next request back by Retry-After seconds (1 s when missing or unreadable)."""
        options = self.environment.parsed_options
        cap = options.max_retry_after_s if options else 30.0
        self.not_before = time.monotonic() + outcomes.retry_delay(retry_after, cap)


class Shape(LoadTestShape):
    """steady, step or burst over ``-t`` seconds with ``-u`` users at most (``--shape``)."""

    use_common_options = True

    def tick(self) -> tuple[int, float] | None:
        """Users and spawn rate for now (``loadtest.shapes``); None stops the run."""
        assert self.runner is not None
        opts: Any = self.runner.environment.parsed_options
        users, rate = int(opts.num_users or 1), float(opts.spawn_rate or 1)
        now = shapes.users_at(
            opts.shape,
            time.perf_counter() - self.start_time,
            float(opts.run_time or 60),
            users,
            opts.steps,
            opts.burst_every_s,
            opts.burst_length_s,
        )
        if now is None:
            return None
        # Bursts must arrive at once, whatever -r says; the other shapes ramp at -r.
        return now, max(rate, float(users)) if opts.shape == "burst" else rate
