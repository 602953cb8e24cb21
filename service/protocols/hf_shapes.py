"""The Inference API's request base (`options` accepted and ignored) and list helpers, shared by
its task codecs."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class Options(BaseModel):
    """The hosted API's options: accepted, and ignored (the model is always loaded)."""

    model_config = ConfigDict(extra="allow")
    wait_for_model: bool | None = None
    use_cache: bool | None = None


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    options: Options | None = None


def _is_list(request: _Request) -> bool:
    return isinstance(getattr(request, "inputs", None), list)


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def list_paths(request: _Request, name: str = "inputs", per_input: int = 1) -> list[str] | None:
    """`inputs[i]` for each unit of a list request (`per_input` units each); None otherwise."""
    value = getattr(request, name)
    if not isinstance(value, list):
        return None
    return [f"{name}[{i}]" for i in range(len(value)) for _ in range(per_input)]
