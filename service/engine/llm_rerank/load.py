"""Loading a causal-LM reranker: its tokenizer set up as sentence-transformers sets it up (left
padding; `model_max_length` from `max_seq_length`, else capped at the model's positions), the
`*ForCausalLM` model, its `ModelInfo` (a one-label text classifier: the rerank routes serve it)
and the engine. On torch: float32, or bfloat16/float16 when DTYPE asks; BACKEND=onnx and
DTYPE=int8 are refused (one line). Inference thread only.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from service.engine.folders import SCORE_ACTIVATIONS
from service.engine.forward.prompts import configure_tokenizer
from service.engine.jobs import Op
from service.engine.llm_rerank.config import RerankerConfig
from service.engine.llm_rerank.engine import CausalRerankEngine
from service.engine.pooling.sentence import SentenceConfig
from service.engine.types import ModelInfo, Output
from service.settings import Settings


def causal_rerank_engine(
    settings: Settings, *, model_id: str, served_name: str, config: RerankerConfig, device: str
) -> CausalRerankEngine:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if settings.backend == "onnx" or settings.dtype == "int8":
        raise ValueError(
            "causal-LM rerankers are served on torch: BACKEND=onnx and DTYPE=int8 do not apply "
            "(set BACKEND=torch or auto, DTYPE=float32, bfloat16, float16 or auto)"
        )
    dtype = settings.dtype if settings.dtype in ("bfloat16", "float16") else "float32"
    common = {"revision": settings.revision, "trust_remote_code": settings.trust_remote_code}
    tok = AutoTokenizer.from_pretrained(config.folder, **common)
    model = AutoModelForCausalLM.from_pretrained(
        config.folder, dtype=getattr(torch, dtype), **common
    )
    model = model.to(device).eval()
    tok.padding_side = "left"  # the last position is every row's last real token
    positions = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    setup = SentenceConfig(
        modes=(),
        dimension=0,
        max_seq_length=config.max_seq_length,
        do_lower_case=config.do_lower_case,
    )
    limit = configure_tokenizer(tok, setup, positions)
    label = str(tok.convert_ids_to_tokens(config.true_token_id))
    info = ModelInfo(
        model_id=model_id,
        revision=settings.revision,
        task="text-classification",
        output=Output.CLASSIFIER,
        ops=frozenset({Op.LOGITS, Op.CLASSIFY, Op.TOKENIZE, Op.DECODE}),
        device=str(device),
        dtype=dtype,
        torch_threads=torch.get_num_threads(),
        max_input_tokens=limit,
        mask_token=None,
        vocab_size=len(tok),
        labels=(label,),
        served_name=served_name,
        modules=config.modules(),
        backend="torch",
        backend_summary=MappingProxyType({"name": "torch", "dtype": dtype, "compute": "padded"}),
        score_activation=SCORE_ACTIVATIONS.get(
            config.activation.rsplit(".", 1)[-1], config.activation
        ),
    )
    return CausalRerankEngine(model, tok, info, config, _device(model))


def _device(model: Any) -> Any:
    return next(model.parameters()).device
