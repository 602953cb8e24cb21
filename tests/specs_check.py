"""Validate answers against the Hugging Face Inference API task specs copied in `tests/specs/`.

Where a spec and the client users run disagree, the client wins (docs/api.md, "Where a spec
and the client disagree"), and the check follows the client:
- text-classification answers one list of `{label, score}` per input (a single input: a list
  holding one list, which `InferenceClient.text_classification` reads as `response[0]`); each
  inner list is checked against the spec's output;
- fill-mask's spec requires `tokenStr`, a slip for its own property `token_str` (what every
  answer and the client have); the check requires `token_str`.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft6Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT6

SPECS = Path(__file__).with_name("specs") / "hf-tasks"


@cache
def _registry() -> Registry:  # type: ignore[type-arg]
    resources = []
    for path in SPECS.rglob("*.json"):
        doc = json.loads(path.read_text())
        resources.append((doc["$id"], Resource.from_contents(doc, default_specification=DRAFT6)))
    return Registry().with_resources(resources)


@cache
def output_validator(task: str) -> Draft6Validator:
    schema = json.loads((SPECS / task / "output.json").read_text())
    if task == "fill-mask":  # the spec's slip: its property is token_str
        schema = copy.deepcopy(schema)
        required = schema["items"]["required"]
        schema["items"]["required"] = ["token_str" if r == "tokenStr" else r for r in required]
    return Draft6Validator(schema, registry=_registry())


def check_answer(task: str, answer: Any, *, is_list: bool = False) -> None:
    """Raise `jsonschema.ValidationError` unless `answer` (the JSON of `POST /`) follows the
    task's output spec, read as above; `is_list`: the request sent a list of inputs."""
    validator = output_validator(task)
    per_input = task in ("fill-mask", "token-classification", "zero-shot-classification")
    if task == "text-classification":
        for labels in answer:
            validator.validate(labels)
    elif per_input and is_list:
        for one in answer:
            validator.validate(one)
    else:
        validator.validate(answer)
