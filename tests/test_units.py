"""Units without a model: settings, body parsing, parameters, the CPU quota, the estimate."""

from __future__ import annotations

from pathlib import Path

import pytest

from service import settings as settings_module
from service.engine.batching.cost import ServiceTimeEstimate
from service.engine.jobs import Job, Op
from service.engine.loading.cpu_threads import cpu_quota, default_torch_threads, set_openmp_wait
from service.engine.params import PipelineParams
from service.engine.types import ModelInfo, Output
from service.errors import (
    BadRequest,
    InvalidInput,
    PayloadTooLarge,
    ServiceError,
    UnsupportedMediaType,
)
from service.protocols import inference_api
from service.settings import (
    Settings,
    SettingsError,
    hand_down,
    library_defaults,
    load_settings,
    process_settings,
    setting_names,
)

JSON = "application/json"


# -- settings ------------------------------------------------------------------------------
def test_settings_defaults_match_the_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in Settings.model_fields:
        monkeypatch.delenv(name.upper(), raising=False)
    s = load_settings()
    assert (s.max_batch_size, s.max_batch_wait_ms, s.max_queue_size) == (64, 0, 256)
    assert s.max_batch_tokens == 8192
    assert (s.max_client_batch_size, s.max_body_bytes, s.request_timeout_s) == (2048, 4 << 20, 30)
    assert s.openai_token_ids == "refuse"
    assert (s.liveness_stall_s, s.drain_timeout_s, s.host, s.port) == (120, 25, "127.0.0.1", 8000)
    assert s.truncate is False and s.trust_remote_code is False and s.api_key is None


@pytest.mark.parametrize(
    "env, message",
    [
        ({"MAX_BATCH_SIZE": "0"}, "invalid setting MAX_BATCH_SIZE: Input should be greater"),
        ({"DEVICE": "tpu"}, "invalid setting DEVICE: Input should be 'cpu', 'cuda' or 'auto'"),
        ({"REQUEST_TIMEOUT_S": "soon"}, "invalid setting REQUEST_TIMEOUT_S: Input should be"),
        ({"OPENAI_TOKEN_IDS": "tiktoken"}, "invalid setting OPENAI_TOKEN_IDS: Input should be"),
        ({"LONG_INPUTS": "chunk", "TRUNCATE": "true"}, "invalid setting LONG_INPUTS: "),
        ({"LONG_INPUTS": "split"}, "invalid setting LONG_INPUTS: Input should be 'refuse'"),
        ({"TRUNCATE": "maybe"}, "invalid setting TRUNCATE: Input should be a valid boolean"),
    ],
)
def test_bad_setting_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_empty_variable_means_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAX_BATCH_TOKENS", "")
    monkeypatch.setenv("API_KEY", "")
    s = load_settings()
    assert s.max_batch_tokens == 8192 and s.api_key is None  # the defaults


def test_zero_batch_tokens_is_no_token_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAX_BATCH_TOKENS", "0")
    assert load_settings().max_batch_tokens is None  # 0: no token budget
    monkeypatch.setenv("MAX_BATCH_TOKENS", "-1")
    with pytest.raises(SettingsError, match="MAX_BATCH_TOKENS"):
        load_settings()


def test_log_level_and_format_take_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("LOG_FORMAT", "Console")
    s = load_settings()
    assert (s.log_level, s.log_format) == ("debug", "console")


def test_settings_are_frozen() -> None:
    with pytest.raises(Exception, match="frozen"):
        Settings().max_batch_size = 4  # type: ignore[misc]


# -- body parsing (POST /, the Hugging Face protocol) -------------------------------------
def _info(task: str = "fill-mask") -> ModelInfo:
    pipeline = task in ("fill-mask", "token-classification")
    ops = {Op.PIPELINE} if pipeline else {Op.CLASSIFY, Op.LOGITS}
    return ModelInfo(
        model_id="m",
        revision=None,
        task=task,
        output=Output.PIPELINE if pipeline else Output.CLASSIFIER,
        ops=frozenset(ops),
        device="cpu",
        dtype="float32",
        torch_threads=1,
        max_input_tokens=512,
        mask_token="[MASK]" if task == "fill-mask" else None,
        vocab_size=100,
        labels=("A", "B"),
    )


def _parse(body: bytes, ctype: str | None, max_inputs: int = 64, task: str = "fill-mask") -> Job:
    return inference_api.parse(body, ctype, _info(task), Settings(max_client_batch_size=max_inputs))


@pytest.mark.parametrize(
    "ctype",
    [
        None,
        "text/plain",
        "application/x-www-form-urlencoded",
        "application/octet-stream",
        "text/plain; charset=UTF-8",
    ],
)
def test_raw_body_is_one_input(ctype: str | None) -> None:
    job = _parse(b"Paris is the [MASK] of France.", ctype)
    assert [u.text for u in job.units] == ["Paris is the [MASK] of France."]
    assert job.finish(["answer"]) == "answer"  # a single input answers its own answer


@pytest.mark.parametrize("ctype", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_json_request_sent_as_text_is_read_as_json(ctype: str | None) -> None:
    """`curl -d '{"inputs": ...}'` sends a form type: an object with `inputs` is the request;
    other text, JSON-looking or not, stays the one raw input."""
    job = _parse(b'  {"inputs": ["b [MASK]"], "parameters": {"top_k": 2}}', ctype)
    assert [(u.text, u.params.arguments) for u in job.units] == [("b [MASK]", (("top_k", 2),))]
    for text in ('{"text": "a [MASK]"}', '["a [MASK]"]', '{"inputs": "a [MASK]"', "{a [MASK]}"):
        assert [u.text for u in _parse(text.encode(), ctype).units] == [text]


def test_json_list_keeps_order_and_parameters() -> None:
    job = _parse(
        b'{"inputs": ["b [MASK]", "a [MASK]"], "parameters": {"top_k": 2}}', "application/json"
    )
    assert [u.text for u in job.units] == ["b [MASK]", "a [MASK]"]
    assert all(u.params.arguments == (("top_k", 2),) for u in job.units)
    assert job.finish(["x", "y"]) == ["x", "y"]


def test_text_pairs_and_the_text_classification_shape() -> None:
    body = b'{"inputs": [{"text": "a", "text_pair": "b"}, "c"], "parameters": {"top_k": 1}}'
    job = _parse(body, "application/json", task="text-classification")
    assert [(u.op, u.text, u.pair) for u in job.units] == [
        (Op.CLASSIFY, "a", "b"),
        (Op.CLASSIFY, "c", None),
    ]
    single = _parse(b'{"inputs": "c"}', "application/json", task="text-classification")
    assert single.finish([["labels"]]) == [["labels"]]  # a list of lists: the client reads [0]


@pytest.mark.parametrize(
    "body, ctype, error, words",
    [
        (b"x", "image/png", UnsupportedMediaType, "image/png"),
        (b"x", "text/plain; charset=latin-1", UnsupportedMediaType, "latin-1"),
        (b'{"inputs": "x"}', "text/json", UnsupportedMediaType, "text/json"),
        (b"\xff", None, BadRequest, "not valid UTF-8"),
        (b'{"inputs": ["a", "b", "c"]}', "application/json", PayloadTooLarge, "at most 2"),
        (b'{"inputs": "x", "extra": {}}', "application/json", InvalidInput, "extra"),
        (b'{"inputs": ["a", "  "]}', "application/json", InvalidInput, "inputs[1] is empty"),
    ],
)
def test_bad_bodies(body: bytes, ctype: str, error: type[ServiceError], words: str) -> None:
    with pytest.raises(error) as info:
        _parse(body, ctype, 2)
    assert words in info.value.message


def test_options_are_accepted_and_ignored() -> None:
    body = b'{"inputs": "x [MASK]", "options": {"wait_for_model": true, "use_cache": false}}'
    assert [u.text for u in _parse(body, "application/json").units] == ["x [MASK]"]


# -- parameters ----------------------------------------------------------------------------
def test_parameters_allow_list_per_task() -> None:
    job = _parse(b'{"inputs": "x [MASK]", "parameters": {"top_k": 3, "targets": ["a"]}}', JSON)
    assert job.units[0].params == PipelineParams.of({"top_k": 3, "targets": ["a"]}, truncate=False)
    with pytest.raises(InvalidInput, match=r"batch_size.*accepted: targets, top_k, truncation"):
        _parse(b'{"inputs": "x [MASK]", "parameters": {"batch_size": 8}}', JSON)
    with pytest.raises(InvalidInput, match=r"parameters\.aggregation_strategy"):
        body = b'{"inputs": "x", "parameters": {"aggregation_strategy": "mean"}}'
        _parse(body, JSON, task="token-classification")
    with pytest.raises(InvalidInput, match=r"parameters\.function_to_apply"):
        body = b'{"inputs": "x", "parameters": {"function_to_apply": "relu"}}'
        _parse(body, JSON, task="text-classification")


def test_pipeline_params_group_equal_argument_sets() -> None:
    a = PipelineParams.of({"top_k": 3, "targets": ["x", "y"]}, truncate=False)
    assert a == PipelineParams.of({"targets": ["x", "y"], "top_k": 3}, truncate=False)
    assert a != PipelineParams.of({"top_k": 3}, truncate=False)
    assert a != PipelineParams.of({"top_k": 3, "targets": ["x", "y"]}, truncate=True)
    assert hash(a) == hash(PipelineParams.of({"targets": ["x", "y"], "top_k": 3}, truncate=False))


# -- CPU quota -----------------------------------------------------------------------------
def test_cpu_quota_v2(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cpu_quota(tmp_path) == 1.5
    assert default_torch_threads(tmp_path) == min(2, len(__import__("os").sched_getaffinity(0)))
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cpu_quota(tmp_path) is None


def test_cpu_quota_v1(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_quota(tmp_path) == 1.0
    assert default_torch_threads(tmp_path) == 1
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpu_quota(tmp_path) is None


# -- the service-time estimate -------------------------------------------------------------
def test_estimate_follows_batches_and_predicts_wait() -> None:
    est = ServiceTimeEstimate(sec_per_token=1.0, overhead_tokens=100, max_batch_size=8)
    for _ in range(100):
        est.observe(0.2, 8, 8 * 50)  # 0.2 s for 8 inputs of 50 padded tokens: 1e-4 s/token
    assert est.sec_per_token == pytest.approx(0.2 / 500, rel=1e-3)
    assert est.tokens_per_input == pytest.approx(50, rel=1e-3)
    assert not est.running() and est.predicted_wait(0) == 0
    # 10 inputs: 2 batches of overhead and 500 padded tokens
    assert est.predicted_wait(10) == pytest.approx(4e-4 * (2 * 100 + 10 * 50), rel=1e-3)
    est.batch_started(400)
    assert est.running() and est.predicted_wait(0) == pytest.approx(0.2, rel=0.05)


def test_openmp_threads_spin_briefly_unless_the_environment_chose() -> None:
    """torch's OpenMP threads spin 2,000 times after a region (libgomp's GOMP_SPINCOUNT) rather
    than its default 3 ms, unless the operator chose a spin count or a wait policy."""
    env: dict[str, str] = {}
    set_openmp_wait(env)
    assert env == {"GOMP_SPINCOUNT": "2000"}
    for mine in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "0"}):
        chosen = dict(mine)
        set_openmp_wait(chosen)
        assert chosen == mine


def test_a_process_reads_its_settings_once_and_hands_them_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first `process_settings` reads the environment; later calls (a forked worker's
    `create_app`, the edge) get the same object, whatever the environment says since; only the
    server's own fields are handed down."""
    monkeypatch.setattr(settings_module._Process, "settings", None)
    monkeypatch.setenv("MAX_BATCH_SIZE", "7")
    first = process_settings()
    monkeypatch.setenv("MAX_BATCH_SIZE", "9")
    assert process_settings() is first and first.max_batch_size == 7
    handed = hand_down(load_failure_file="/tmp/why")
    assert process_settings() is handed
    assert (handed.load_failure_file, handed.max_batch_size) == ("/tmp/why", 7)
    with pytest.raises(ValueError, match="max_batch_size"):
        hand_down(max_batch_size="3")
    assert "--load-failure-file" not in setting_names()


def test_library_defaults_leave_an_operators_values() -> None:
    env = {"TOKENIZERS_PARALLELISM": "true"}
    library_defaults({"TOKENIZERS_PARALLELISM": "false", "A": "1"}, environ=env)
    assert env == {"TOKENIZERS_PARALLELISM": "true", "A": "1"}
    env = {"OMP_WAIT_POLICY": "ACTIVE"}
    library_defaults({"GOMP_SPINCOUNT": "2000"}, unless=("OMP_WAIT_POLICY",), environ=env)
    assert env == {"OMP_WAIT_POLICY": "ACTIVE"}
