"""Reading a causal-LM `CrossEncoder` folder: how `CrossEncoder.predict` turns a (query,
document) pair into a score, so the engine can do the same. No torch.

sentence-transformers 6 (`cross_encoder/model.py`, `cross_encoder/modules/logit_score.py`)
builds such a model as Transformer (`transformer_task: text-generation`, left padding) ->
`LogitScore(true_token_id, false_token_id)`: the score is the logit of the "yes" token less
the "no" token's at the last position (`false_token_id: null`: the "yes" logit alone), then
the model's activation (`activation_fn`, Sigmoid by default). A pair is the tokenizer's own
pair encoding; when the Transformer declares the `message` modality (saved so when the folder
ships a chat template), each pair is rendered through the chat template as a `query`-role
message and a `document`-role message (`format` flat or structured). What a folder can carry:

- `config_sentence_transformers.json`: `model_type: CrossEncoder`, `activation_fn` (a torch
  class path; another path is replaced by the default, Sigmoid, as the class does without
  `trust_remote_code`), `prompts` and `default_prompt_name` (the default prompt goes before
  the query, or as a system message), `keep_in_fp32_modules` (a dtype detail): served.
- `modules.json`: exactly Transformer -> LogitScore; anything else refused.
- `sentence_bert_config.json`: `max_seq_length`, `do_lower_case`, the `text` and `message`
  modalities: served; `processing_kwargs`, another task or modality: refused.
- LogitScore `config.json`: `true_token_id`, `false_token_id` on `causal_logits`: served.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.engine.folders import TRANSFORMER_KEYS, UnsupportedModel, read_json

SIGMOID = "torch.nn.modules.activation.Sigmoid"
_LAYOUT = "Transformer (text-generation) -> LogitScore"


@dataclass(frozen=True, kw_only=True)
class RerankerConfig:
    """What the engine needs of the folder: the scored token ids, how a pair is rendered, the
    tokenizer setup, the default prompt and the activation."""

    folder: str
    true_token_id: int
    false_token_id: int | None
    chat: str | None = None  # None: text pairs; "flat" or "structured": chat messages
    max_seq_length: int | None = None
    do_lower_case: bool = False
    prompt: str = ""  # the default prompt ("": none)
    activation: str = SIGMOID

    def modules(self) -> tuple[str, ...]:
        """The module chain for /info."""
        rendered = f", chat template ({self.chat})" if self.chat else ""
        score = "yes" if self.false_token_id is None else "yes - no"
        activation = self.activation.rsplit(".", 1)[-1]
        return (f"Transformer(text-generation{rendered})", f"LogitScore({score})", activation)


def is_causal_reranker(folder: Path) -> bool:
    """A sentence-transformers CrossEncoder folder whose modules include a LogitScore."""
    modules = folder / "modules.json"
    if not modules.is_file():
        return False
    model = read_json(folder / "config_sentence_transformers.json")
    types = [str(m.get("type", "")) for m in read_json(modules) or []]
    return model.get("model_type") == "CrossEncoder" and any(
        t.endswith(".LogitScore") for t in types
    )


def read_reranker_config(folder: Path) -> RerankerConfig:
    """The folder's reranker configuration; raises `UnsupportedModel` naming the first option
    it carries that is not served (see the module docstring)."""
    model = read_json(folder / "config_sentence_transformers.json")
    entries = read_json(folder / "modules.json")
    kinds = [str(e.get("type", "")).rsplit(".", 1)[-1] for e in entries]
    if kinds != ["Transformer", "LogitScore"] or entries[0].get("path", "") != "":
        raise UnsupportedModel(
            f"modules.json lists {' -> '.join(kinds)}: only {_LAYOUT} (the Transformer at the "
            "folder's root) is supported for a causal-LM reranker"
        )
    transformer = _transformer(folder / "sentence_bert_config.json")
    score = read_json(folder / str(entries[1].get("path", "")) / "config.json")
    if score.get("module_input_name", "causal_logits") != "causal_logits":
        raise UnsupportedModel(f"LogitScore reads {score['module_input_name']!r}: not served")
    true_id, false_id = score.get("true_token_id"), score.get("false_token_id")
    if not isinstance(true_id, int) or not isinstance(false_id, int | None):
        raise UnsupportedModel("LogitScore's true_token_id must be a token id")
    activation = model.get("activation_fn") or SIGMOID
    prompts = model.get("prompts") or {}
    default = model.get("default_prompt_name")
    message = (transformer.get("modality_config") or {}).get("message")
    return RerankerConfig(
        folder=str(folder),
        true_token_id=true_id,
        false_token_id=false_id,
        chat=None if message is None else str(message.get("format", "auto")),
        max_seq_length=transformer.get("max_seq_length"),
        do_lower_case=bool(transformer.get("do_lower_case", False)),
        prompt=str(prompts.get(default) or "") if default else "",
        activation=activation if str(activation).startswith("torch.") else SIGMOID,
    )


def _transformer(config_file: Path) -> dict[str, Any]:
    config: dict[str, Any] = read_json(config_file)
    unknown = sorted(set(config) - TRANSFORMER_KEYS)
    task = config.get("transformer_task")
    modalities = sorted(config.get("modality_config") or {"text": None})
    message = (config.get("modality_config") or {}).get("message") or {}
    if (
        unknown
        or task != "text-generation"
        or not set(modalities) <= {"text", "message"}
        or message.get("format", "flat") not in ("flat", "structured")
    ):
        raise UnsupportedModel(
            f"Transformer module (task {task}, modalities {modalities}, keys {unknown or 'known'}) "
            "is not supported for a causal-LM reranker: text-generation on text or chat "
            "messages (flat or structured) only"
        )
    if config.get("processing_kwargs"):
        raise UnsupportedModel(
            f"Transformer module's processing_kwargs {config['processing_kwargs']} are not "
            "supported: the server renders pairs as sentence-transformers does without them"
        )
    return config
