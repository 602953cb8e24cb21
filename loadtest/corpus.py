"""Inputs for the load tests and the benchmark, drawn from ``loadtest/corpus.txt``.

The corpus holds public-domain U.S. texts (see the header of ``corpus.txt`` for the sources). An
input is a run of consecutive sentences from it, so lengths range from a five-word sentence to a
passage of a few hundred tokens: on CPU, padding cost decides throughput, so a benchmark on
uniform inputs would flatter any batcher.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

CORPUS_PATH = Path(__file__).with_name("corpus.txt")

#: The payload of the seed guide's curl example, sent as-is by the Locust users.
SEED_PAYLOAD = "Paris is the [MASK] of France."

#: Longest input in words. all-MiniLM-L6-v2 allows 512 tokens; 300 words of this corpus stay
#: under about 420 tokens (checked in tests/loadtest/test_corpus.py).
MAX_WORDS = 300

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


@dataclass(frozen=True, slots=True)
class LengthClass:
    """A share of the input mix and its target length range in words (inclusive)."""

    name: str
    weight: float
    min_words: int
    max_words: int


#: The mix used by the benchmark and the Locust users: mostly short, a tail of long passages.
DEFAULT_MIX: tuple[LengthClass, ...] = (
    LengthClass("short", 0.5, 4, 25),
    LengthClass("medium", 0.3, 40, 110),
    LengthClass("long", 0.2, 150, MAX_WORDS),
)


@cache
def sentences(path: Path = CORPUS_PATH) -> tuple[str, ...]:
    """Every sentence of the corpus file in reading order (comment lines skipped)."""
    out: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.extend(part.strip() for part in _SENTENCE_END.split(line) if part.strip())
    return tuple(out)


def passage(rng: random.Random, min_words: int, max_words: int = MAX_WORDS) -> str:
    """Consecutive sentences from a random start, at least ``min_words`` words when possible.

    Never more than ``max_words`` words: the start is drawn among sentences that fit
    (``ValueError`` if none does). Sentences wrap around from the end of the corpus to its start.
    """
    sents = sentences()
    starts = [i for i, sent in enumerate(sents) if len(sent.split()) <= max_words]
    if not starts:
        raise ValueError(f"no sentence of the corpus has at most {max_words} words")
    start = rng.choice(starts)
    words: list[str] = []
    for offset in range(len(sents)):
        nxt = sents[(start + offset) % len(sents)].split()
        if words and len(words) + len(nxt) > max_words:
            break
        words.extend(nxt)
        if len(words) >= min_words:
            break
    return " ".join(words)


def draw(rng: random.Random, mix: tuple[LengthClass, ...] = DEFAULT_MIX) -> str:
    """One input whose length class is drawn from ``mix`` by weight."""
    cls = rng.choices(mix, weights=[c.weight for c in mix])[0]
    return passage(rng, rng.randint(cls.min_words, cls.max_words), cls.max_words)


def mixed_inputs(n: int, seed: int = 0) -> list[str]:
    """``n`` inputs of mixed length, the same list for the same ``n`` and ``seed``.

    The benchmark's limit measurement (a separate process) and its load client both call this,
    so every system is measured on identical inputs.
    """
    rng = random.Random(seed)
    return [draw(rng) for _ in range(n)]
