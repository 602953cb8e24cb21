"""Dense heads: the `Dense` modules a sentence-transformers folder lists after its Pooling.

sentence-transformers' Dense (`sentence_transformers.base.modules.dense.Dense`, 5.x
`sentence_transformers.models.Dense`) is `activation(linear(x))`, plus `x` (or a bias-free
`residual(x)` when the widths differ) with `use_residual`. Its folder holds `config.json`
(`in_features`, `out_features`, `bias`, `activation_function`: a torch class path such as
`torch.nn.modules.activation.Tanh`, `torch.nn.modules.linear.Identity`) and the weights
(`model.safetensors`, else `pytorch_model.bin`; keys `linear.weight`, `linear.bias`,
`residual.weight`). LaBSE has one (768 -> 768, Tanh); EmbeddingGemma two (768 -> 3072 ->
768, Identity).

Reading a config (`read_dense`) needs no torch; `load_dense` and `apply_dense` run in the
inference thread. Heads always run in float32: EmbeddingGemma's activations overflow float16.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: Activation class paths a folder may name without TRUST_REMOTE_CODE (sentence-transformers
#: loads any `torch.` class that is an `nn.Module`; we do the same, checked at start).
_TORCH_PREFIX = "torch."


class UnsupportedHead(ValueError):
    """A Dense module this server cannot apply (names the folder and what is wrong)."""


@dataclass(frozen=True, kw_only=True)
class DenseSpec:
    """One Dense module as its folder declares it (no weights yet)."""

    path: str  # the module's folder, relative to the model folder
    in_features: int
    out_features: int
    bias: bool = True
    activation: str = "torch.nn.modules.activation.Tanh"  # ST's default
    use_residual: bool = False


def read_dense(folder: Path, path: str, level: str = "sentence_embedding") -> DenseSpec:
    """The Dense module in `folder / path`; raises `UnsupportedHead` for a config it cannot
    apply: missing widths, another input than `level` (the pooled embedding; a multi-vector
    model's: `token_embeddings`, also where the config names none), an activation outside
    torch."""
    config_file = folder / path / "config.json"
    if not config_file.is_file():
        raise UnsupportedHead(f"Dense module ({path}) has no config.json")
    config = json.loads(config_file.read_text(encoding="utf-8"))
    where = f"Dense module ({path})"
    for key in ("module_input_name", "module_output_name"):
        if config.get(key, level) not in (level, None):
            raise UnsupportedHead(f"{where} reads or writes {config[key]!r}: only {level}")
    widths = config.get("in_features"), config.get("out_features")
    if not all(isinstance(w, int) and w > 0 for w in widths):
        raise UnsupportedHead(f"{where} has no in_features/out_features")
    activation = str(config.get("activation_function") or "torch.nn.modules.linear.Identity")
    if not activation.startswith(_TORCH_PREFIX):
        raise UnsupportedHead(
            f"{where} names activation {activation!r}: only torch.nn activations are supported "
            "(sentence-transformers itself falls back to Tanh for it without trust_remote_code)"
        )
    return DenseSpec(
        path=path,
        in_features=int(widths[0]),
        out_features=int(widths[1]),
        bias=bool(config.get("bias", True)),
        activation=activation,
        use_residual=bool(config.get("use_residual", False)),
    )


@dataclass(frozen=True, eq=False)
class DenseHead:
    """A loaded Dense module: float32 weights and its activation (a torch module)."""

    spec: DenseSpec
    weight: torch.Tensor  # [out, in]
    bias: torch.Tensor | None  # [out]
    residual: torch.Tensor | None  # [out, in] when use_residual and the widths differ
    activation: torch.nn.Module


def load_dense(folder: Path, spec: DenseSpec, device: torch.device | str = "cpu") -> DenseHead:
    """Weights and activation of `spec` on `device` (inference thread). Raises `UnsupportedHead` for
    missing weights, shapes other than the config's, or an activation that is not a torch
    `nn.Module` class."""

    weights = _weights(folder / spec.path)
    where = f"Dense module ({spec.path})"
    weight = weights.get("linear.weight")
    if weight is None or tuple(weight.shape) != (spec.out_features, spec.in_features):
        raise UnsupportedHead(f"{where}: linear.weight is missing or not [out, in]")
    bias = weights.get("linear.bias") if spec.bias else None
    if spec.bias and (bias is None or tuple(bias.shape) != (spec.out_features,)):
        raise UnsupportedHead(f"{where}: linear.bias is missing or not [out]")
    residual = None
    if spec.use_residual and spec.in_features != spec.out_features:
        residual = weights.get("residual.weight")
        if residual is None:
            raise UnsupportedHead(f"{where}: use_residual without residual.weight")
        residual = residual.float().to(device)
    return DenseHead(
        spec=spec,
        weight=weight.float().to(device),
        bias=None if bias is None else bias.float().to(device),
        residual=residual,
        activation=_activation(spec.activation, where).to(device),
    )


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    import torch

    safetensors = folder / "model.safetensors"
    if safetensors.is_file():
        from safetensors.torch import load_file

        return dict(load_file(str(safetensors)))
    legacy = folder / "pytorch_model.bin"
    if legacy.is_file():
        return dict(torch.load(legacy, map_location="cpu", weights_only=True))
    raise UnsupportedHead(f"Dense module ({folder.name}) has no model.safetensors")


def _activation(path: str, where: str) -> torch.nn.Module:
    import importlib
    import inspect

    import torch

    module_name, _, name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        raise UnsupportedHead(f"{where}: activation {path!r} is not found in torch") from None
    if not (inspect.isclass(cls) and issubclass(cls, torch.nn.Module)):
        raise UnsupportedHead(f"{where}: activation {path!r} is not a torch.nn.Module class")
    return cls()


def apply_dense(x: torch.Tensor, heads: tuple[DenseHead, ...]) -> torch.Tensor:
    """Each head in order on the pooled batch [B, in] -> [B, out], in float32 (as
    sentence-transformers' Dense.forward: `activation(linear(x))` (+ residual))."""
    import torch.nn.functional as F

    x = x.float()
    for head in heads:
        # `.to` is free when the head already sits where x is; it is not when a backend hands
        # back CPU tensors from a model on another device.
        weight, bias = head.weight.to(x.device), _on(head.bias, x.device)
        out = head.activation.to(x.device)(F.linear(x, weight, bias))
        if head.spec.use_residual:
            residual = _on(head.residual, x.device)
            out = out + (x if residual is None else F.linear(x, residual))
        x = out
    return x


def _on(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return None if t is None else t.to(device)
