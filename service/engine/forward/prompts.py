"""The text sentence-transformers tokenizes (prompt + text) and its tokenizer set-up, as its
Transformer module does (`SentenceConfig`: `service.engine.pooling.sentence`)."""

from __future__ import annotations

from typing import Any

from service.engine.pooling.sentence import SentenceConfig
from service.errors import InvalidInput


def resolve_prompt(config: SentenceConfig, prompt_name: str | None = None) -> str:
    """The prompt `encode(prompt_name=...)` prepends: the named one, else the default prompt
    name's, else none (""). Raises `InvalidInput` for a name the model does not have."""
    if prompt_name is None:
        return config.prompts.get(config.default_prompt_name or "", "")
    if prompt_name not in config.prompts:
        raise InvalidInput(
            f"unknown prompt_name {prompt_name!r}; this model has {sorted(config.prompts)}"
        )
    return config.prompts[prompt_name]


def st_text(text: str, config: SentenceConfig, prompt: str | None) -> str:
    """The string ST tokenizes: `prompt + text` (prompt None: the model's default prompt).

    No strip and no lower-casing here: ST 6 does neither in Python (ST <= 5 stripped);
    `do_lower_case` is a tokenizer normalizer (`configure_tokenizer`)."""
    return (resolve_prompt(config) if prompt is None else prompt) + text


def configure_tokenizer(tokenizer: Any, config: SentenceConfig, max_positions: int | None) -> int:
    """Set the tokenizer up as ST's Transformer module does; return its max length in tokens.

    `model_max_length` becomes max_seq_length, else min(its own, max_positions) (the model
    config's `max_position_embeddings`); `do_lower_case` puts a `Lowercase` normalizer before
    the tokenizer's own unless one is there. Mutates `tokenizer`."""
    from tokenizers.normalizers import Lowercase, Sequence

    if config.max_seq_length is not None:
        tokenizer.model_max_length = config.max_seq_length
    elif max_positions is not None and max_positions != -1:
        tokenizer.model_max_length = min(tokenizer.model_max_length, max_positions)
    if config.do_lower_case:
        backend = tokenizer.backend_tokenizer
        current = backend.normalizer
        steps: list[Any] = [] if current is None else [current]
        if isinstance(current, Sequence):
            steps = list(current)  # type: ignore[call-overload]  # iterable; the stubs omit it
        if not any(isinstance(step, Lowercase) for step in steps):
            backend.normalizer = Sequence([Lowercase(), *steps])
    return int(tokenizer.model_max_length)


def prompt_length(tokenizer: Any, prompt: str) -> int:
    """Tokens of `prompt` at the start of `prompt + text`, as ST counts them for
    include_prompt=False: the prompt tokenized alone (same truncation), minus a trailing special
    token ([SEP], EOS). A leading [CLS]/BOS counts as prompt. 0 for no prompt (ST skips it)."""
    if not prompt:
        return 0
    ids = tokenizer(prompt, truncation="longest_first")["input_ids"]
    return len(ids) - int(bool(ids) and ids[-1] in tokenizer.all_special_ids)
