"""Inputs for the load tests and the benchmark, drawn from ``loadtest/corpus.txt``.

The corpus holds public-domain U.S. texts (see the header of ``corpus.txt`` for the sources). An
input is a run of consecutive sentences from it. Two sets:

- :func:`mixed_inputs`: from a five-word sentence to a passage of a few hundred tokens: on CPU,
  padding cost decides throughput, so a benchmark on uniform inputs would flatter any batcher;
- :func:`short_inputs`: 8-100 tokens, about 42 mean (search queries, chat messages, titles),
  where per-request costs outside the model weigh most.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

CORPUS_PATH = Path(__file__).with_name("corpus.txt")

#: The payload of the seed guide's curl example, sent as-is by the Locust users.
SEED_PAYLOAD = "Paris is the [MASK] of France."

#: Longest input in words. all-MiniLM-L6-v2 allows 512 tokens; 300 words of this corpus stay
#: under about 420 tokens (checked in tests/loadtest/test_loadtest_units.py).
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


#: Short inputs (:func:`short_inputs`): token bounds, with the special tokens, and the mode of
#: the triangular draw of each input's target length. The draw's mean is (8 + 100 + 55) / 3 =
#: 54; inputs end at the last whole sentence under their target, so they come out shorter:
#: 42 tokens mean with the embedded model (checked in tests/loadtest).
SHORT_MIN_TOKENS, SHORT_MAX_TOKENS, SHORT_MODE_TOKENS = 8, 100, 55


def short_inputs(n: int = 2000, seed: int = 0, tokenizer: Any = None) -> list[str]:
    """``n`` English inputs of 8-100 tokens (about 42 mean), the same list for the same
    ``n`` and ``seed``: the length of search queries, chat messages and product titles.

    Each input draws a target length, then takes the corpus's sentences from a random one on
    while they fit under the target (so it ends at a sentence end); when even the first does
    not fit, it is cut at the last word that fits. Lengths count the tokenizer's special tokens
    (what the server pads to). ``tokenizer``: the embedded model's when None.
    """
    tok = tokenizer if tokenizer is not None else _default_tokenizer()
    sents = sentences()
    rng = random.Random(seed)

    def count(text: str) -> int:
        return len(tok(text)["input_ids"])

    out: list[str] = []
    while len(out) < n:
        target = round(rng.triangular(SHORT_MIN_TOKENS, SHORT_MAX_TOKENS, SHORT_MODE_TOKENS))
        start = rng.randrange(len(sents))
        text = ""
        for offset in range(len(sents)):
            longer = f"{text} {sents[(start + offset) % len(sents)]}".strip()
            if count(longer) > target:
                break
            text = longer
        if not text:
            text = _cut_to(sents[start].split(), target, count)
        if SHORT_MIN_TOKENS <= count(text) <= SHORT_MAX_TOKENS:
            out.append(text)
    return out


def _cut_to(words: list[str], max_tokens: int, count: Callable[[str], int]) -> str:
    """The longest prefix of ``words`` of at most ``max_tokens`` tokens (binary search)."""
    low, high = 0, len(words)
    while low < high:
        mid = (low + high + 1) // 2
        if count(" ".join(words[:mid])) <= max_tokens:
            low = mid
        else:
            high = mid - 1
    return " ".join(words[:low])


INPUT_SETS = ("mixed", "short")


def inputs(name: str, n: int, seed: int = 0) -> list[str]:
    """The input set ``name`` (one of :data:`INPUT_SETS`): ``n`` inputs drawn with ``seed``."""
    if name == "mixed":
        return mixed_inputs(n, seed)
    if name == "short":
        return short_inputs(n, seed)
    raise ValueError(f"unknown input set {name!r}; use one of {INPUT_SETS}")


@cache
def _default_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from service.engine.loading.load import default_model_dir

    return AutoTokenizer.from_pretrained(default_model_dir())
