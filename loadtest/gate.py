"""The SLO gate: fail a load-test run whose error rate, p95 latency or shed rate is too high.

Failures are counted by category (``loadtest.outcomes``: shed, expired, rejected, error). Rates
are fractions of all requests. p95 is Locust's aggregated 95th percentile over every answer (sheds
included, so watch the shed rate beside it), in milliseconds.

Two ways in: the locustfile applies :func:`evaluate` when Locust quits (``--slo-*`` options), and
``python -m loadtest.gate PREFIX --max-...`` checks the CSV files a headless run wrote with
``--csv PREFIX``. Both print the run in three lines (:func:`describe`) and one line per
threshold, and exit 1 on a violation.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TextIO

from loadtest.outcomes import CATEGORIES, category_of


@dataclass(frozen=True, slots=True)
class RunSummary:
    """What the gate needs from a run: request count, p95 (ms), failures by category; for
    the printed summary also p50 (ms) and requests per second, when known."""

    requests: int
    p95_ms: float
    failures: dict[str, int] = field(default_factory=dict)
    p50_ms: float | None = None
    requests_per_s: float | None = None

    def rate(self, category: str) -> float:
        """Failures of ``category`` per request (0.0 for a run without requests)."""
        return self.failures.get(category, 0) / self.requests if self.requests else 0.0


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Upper bounds; ``None`` leaves that figure unchecked. Rates are fractions, p95 in ms."""

    max_error_rate: float | None = 0.0
    max_rejected_rate: float | None = 0.0
    max_shed_rate: float | None = None
    max_expired_rate: float | None = None
    max_p95_ms: float | None = None
    min_requests: int = 1


def evaluate(run: RunSummary, limits: Thresholds) -> list[tuple[bool, str]]:
    """One ``(ok, line)`` per checked threshold, in a fixed order."""
    checks: list[tuple[bool, str]] = [
        (
            run.requests >= limits.min_requests,
            f"requests {run.requests} (minimum {limits.min_requests})",
        ),
    ]
    for cat in CATEGORIES:
        bound = getattr(limits, f"max_{cat}_rate")
        if bound is not None:
            rate = run.rate(cat)
            checks.append(
                (
                    rate <= bound,
                    f"{cat} rate {rate:.4f} (maximum {bound:.4f}, "
                    f"{run.failures.get(cat, 0)} of {run.requests})",
                )
            )
    if limits.max_p95_ms is not None:
        checks.append(
            (
                run.p95_ms <= limits.max_p95_ms,
                f"p95 {run.p95_ms:.1f} ms (maximum {limits.max_p95_ms:g} ms)",
            )
        )
    return checks


def describe(run: RunSummary) -> list[str]:
    """The run in three lines: requests and their rate, failures by category, latency."""
    rate = f", {run.requests_per_s:.1f} req/s" if run.requests_per_s is not None else ""
    failed = sum(run.failures.values())
    by_category = ", ".join(f"{cat} {run.failures.get(cat, 0)}" for cat in CATEGORIES)
    p50 = f"p50 {run.p50_ms:.0f} ms, " if run.p50_ms is not None else ""
    return [
        f"requests: {run.requests}{rate}",
        f"failures: {failed} ({by_category})",
        f"latency: {p50}p95 {run.p95_ms:.0f} ms (every answer, sheds included)",
    ]


def report(checks: Iterable[tuple[bool, str]], out: TextIO | None = None) -> bool:
    """Print ``PASS``/``FAIL`` lines and an overall verdict; True when every check passed."""
    out = out or sys.stdout
    ok = True
    for passed, line in checks:
        ok &= passed
        print(f"SLO {'PASS' if passed else 'FAIL'}: {line}", file=out)
    print(f"SLO gate: {'passed' if ok else 'FAILED'}", file=out)
    return ok


def read_csv(prefix: str | Path) -> RunSummary:
    """Summarise ``PREFIX_stats.csv`` and ``PREFIX_failures.csv`` written by ``locust --csv``."""
    prefix = str(prefix)
    with open(f"{prefix}_stats.csv", newline="", encoding="utf-8") as fh:
        rows = [r for r in csv.DictReader(fh) if r["Name"] == "Aggregated"]
    if not rows:
        raise ValueError(f"{prefix}_stats.csv has no Aggregated row")
    failures = dict.fromkeys(CATEGORIES, 0)
    with open(f"{prefix}_failures.csv", newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            failures[category_of(row["Error"])] += int(row["Occurrences"])
    row = rows[0]
    rate = _number(row.get("Requests/s"))
    return RunSummary(
        int(row["Request Count"]),
        _number(row["95%"]) or 0.0,
        failures,
        _number(row.get("50%")),
        rate,
    )


def _number(text: str | None) -> float | None:
    """A CSV cell as a number; None when the column is missing or empty ("N/A")."""
    if text is None or text in ("", "N/A"):
        return None
    return float(text)


def add_threshold_options(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """Add the ``--{prefix}max-*`` options; the locustfile uses ``prefix='slo-'``."""
    defaults = Thresholds()
    for cat in CATEGORIES:
        parser.add_argument(
            f"--{prefix}max-{cat}-rate",
            type=float,
            default=getattr(defaults, f"max_{cat}_rate"),
            help=f"fail when the {cat} rate (fraction of requests) is above this",
        )
    parser.add_argument(
        f"--{prefix}max-p95-ms",
        type=float,
        default=None,
        help="fail when the aggregated p95 latency (ms) is above this",
    )
    parser.add_argument(
        f"--{prefix}min-requests", type=int, default=1, help="fail when fewer requests were made"
    )


def thresholds_from(options: object, prefix: str = "") -> Thresholds:
    """The :class:`Thresholds` held by parsed options named as in :func:`add_threshold_options`."""
    key = prefix.replace("-", "_")
    return Thresholds(**{f.name: getattr(options, key + f.name) for f in fields(Thresholds)})


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m loadtest.gate PREFIX [--max-... N]``; returns the exit code."""
    parser = argparse.ArgumentParser(description="Check a Locust CSV run against SLO thresholds.")
    parser.add_argument("prefix", help="the --csv prefix of the run, e.g. loadtest/results/steady")
    add_threshold_options(parser)
    args = parser.parse_args(argv)
    run = read_csv(args.prefix)
    print("\n".join(describe(run)))
    return 0 if report(evaluate(run, thresholds_from(args))) else 1


if __name__ == "__main__":
    sys.exit(main())
