"""Validate answers against the `components.schemas` of an OpenAPI document (jsonschema).

TEI's document is OpenAPI 3.0 (`nullable: true` beside a `type`), which JSON Schema does not
know: `tei_schema` rewrites it as `type: [T, "null"]`. Our own /openapi.json is 3.1, whose
schemas are JSON Schema 2020-12 as they are.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

TEI_SPEC = Path(__file__).parent / "specs" / "tei" / "openapi.json"
_URI = "urn:openapi"


def _nullable(node: Any) -> Any:
    if isinstance(node, list):
        return [_nullable(x) for x in node]
    if not isinstance(node, dict):
        return node
    node = {k: _nullable(v) for k, v in node.items()}
    if node.pop("nullable", False) and isinstance(node.get("type"), str):
        node["type"] = [node["type"], "null"]
    return node


@cache
def tei_document() -> dict[str, Any]:
    return dict(_nullable(json.loads(TEI_SPEC.read_text())))


def validator(document: dict[str, Any], name: str) -> Draft202012Validator:
    """A validator for `#/components/schemas/<name>` of `document`, its `$ref`s resolved."""
    resource = Resource.from_contents(document, default_specification=DRAFT202012)
    registry: Registry[Any] = Registry().with_resource(_URI, resource)
    return Draft202012Validator({"$ref": f"{_URI}#/components/schemas/{name}"}, registry=registry)


def check_tei(name: str, answer: Any) -> None:
    """Raise `jsonschema.ValidationError` unless `answer` is a valid TEI `<name>`."""
    validator(tei_document(), name).validate(answer)
