"""Field cases C01-C05, C07-C09, C11 of CASES.md, in-process, each followed by the control.

FM cases use the tiny generated BERT masked-LM; ANY cases run on it and on the embedded model.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import SEED_TEXT, app_client
from starlette.testclient import TestClient

from service.engine.loading.load import default_model_dir

JSON = {"content-type": "application/json"}
LONG = "This is an example " * 300  # about 1,200 tokens


def assert_clean_error(r: Any, status: int, *words: str) -> dict[str, Any]:
    """The error body has the contract's fields, names what went wrong, and leaks nothing."""
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error", "error_type", "request_id"}
    assert body["request_id"] == r.headers["x-request-id"]
    for word in words:
        assert word in body["error"], body["error"]
    assert "Traceback" not in r.text and "/site-packages/" not in r.text and ".py" not in r.text
    return dict(body)


def assert_control(client: TestClient, fill_mask: bool) -> None:
    """The control request still answers, the server is ready, the queue is empty."""
    text = SEED_TEXT if fill_mask else "A fixed control sentence."
    r = client.post("/", content=text)
    assert r.status_code == 200, r.text
    assert client.get("/readyz").status_code == 200
    assert client.app.state.runtime.inference.queue_depth == 0  # type: ignore[attr-defined]


@pytest.fixture(scope="module", params=["fill-mask", "embedded"])
def any_client(request: pytest.FixtureRequest, tiny_models: dict[str, Path]) -> Any:
    model = tiny_models["fill-mask"] if request.param == "fill-mask" else None
    with app_client(model) as client:
        client.fill_mask = request.param == "fill-mask"  # type: ignore[attr-defined]
        # The fill-mask model's position limit; the embedded model's max_seq_length.
        client.limit = 512 if client.fill_mask else 256  # type: ignore[attr-defined]
        yield client


def test_c01_over_length_is_422_naming_the_limit(any_client: TestClient) -> None:
    text = LONG + ("[MASK]" if any_client.fill_mask else "")  # type: ignore[attr-defined]
    limit = f"{any_client.limit} tokens"  # type: ignore[attr-defined]
    r = any_client.post("/", content=text)
    assert_clean_error(r, 422, limit, "truncation")
    r = any_client.post("/", json={"inputs": text})
    assert_clean_error(r, 422, limit)
    assert_control(any_client, any_client.fill_mask)  # type: ignore[attr-defined]


def test_c01_a_list_of_over_length_inputs_is_422_and_the_server_lives_on(
    any_client: TestClient,
) -> None:
    """The first failing input ends the request, which cancels its other inputs while the
    thread may still be tokenizing them (that once killed the inference thread)."""
    text = LONG + ("[MASK]" if any_client.fill_mask else "")  # type: ignore[attr-defined]
    for _ in range(3):
        r = any_client.post("/", json={"inputs": [text] * 4})
        assert_clean_error(r, 422, "inputs[0]", f"{any_client.limit} tokens")  # type: ignore[attr-defined]
        assert any_client.get("/livez").status_code == 200
    assert_control(any_client, any_client.fill_mask)  # type: ignore[attr-defined]


def test_c01_truncation_answers_200(any_client: TestClient) -> None:
    text = "[MASK] " + LONG if any_client.fill_mask else LONG  # type: ignore[attr-defined]
    r = any_client.post("/", json={"inputs": text, "parameters": {"truncation": True}})
    assert r.status_code == 200, r.text
    if not any_client.fill_mask:  # type: ignore[attr-defined]
        from sentence_transformers import SentenceTransformer

        # sentence-transformers cuts at max_seq_length (256) silently; truncation asks for that
        st = SentenceTransformer(default_model_dir(), device="cpu")
        assert abs(np.asarray(r.json()[0]) - st.encode([text])[0]).max() < 1e-4


@pytest.mark.parametrize(
    "body, content_type",
    [
        (b"", None),
        (b"   \n\t", "text/plain"),
        (b'{"inputs": ""}', "application/json"),
        (b'{"inputs": []}', "application/json"),
        (b'{"inputs": [""]}', "application/json"),
        (b"{}", "application/json"),
    ],
)
def test_c02_empty_input(any_client: TestClient, body: bytes, content_type: str | None) -> None:
    headers = {"content-type": content_type} if content_type else {}
    r = any_client.post("/", content=body, headers=headers)
    assert_clean_error(r, 422, "empty")
    assert_control(any_client, any_client.fill_mask)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "text", ["Paris is the capital of France.", "Paris is the <mask> of France."]
)
def test_c03_no_mask_names_the_models_mask_token(fill_mask_client: TestClient, text: str) -> None:
    r = fill_mask_client.post("/", content=text)
    assert_clean_error(r, 422, "[MASK]")
    assert_control(fill_mask_client, True)


def test_c03_pipeline_exception_in_the_thread_is_422(fill_mask_client: TestClient) -> None:
    # The mask passes the loop's cheap text check, but truncation cuts it off: the pipeline's
    # own PipelineException (not a ValueError) is raised in the inference thread -> 422.
    body = {"inputs": LONG + " [MASK]", "parameters": {"truncation": True}}
    r = fill_mask_client.post("/", json=body)
    assert_clean_error(r, 422, "[MASK]")
    assert_control(fill_mask_client, True)


def test_c04_two_masks_answer_one_list_per_mask(fill_mask_client: TestClient) -> None:
    from transformers import pipeline

    r = fill_mask_client.post(
        "/", json={"inputs": "Paris is the [MASK] of [MASK].", "parameters": {"top_k": 2}}
    )
    assert r.status_code == 200, r.text
    got = r.json()
    info = fill_mask_client.app.state.runtime.inference.info  # type: ignore[attr-defined]
    direct = pipeline("fill-mask", model=info.model_id)("Paris is the [MASK] of [MASK].", top_k=2)
    assert len(got) == 2 and all(len(per_mask) == 2 for per_mask in got)
    for mine, theirs in zip(got, direct, strict=True):
        assert [m["score"] for m in mine] == pytest.approx([t["score"] for t in theirs], abs=1e-4)
    assert_control(fill_mask_client, True)


@pytest.mark.parametrize(
    "body, content_type",
    [
        (b"Paris is the [MASK] of \xff\xfe France.", "text/plain"),
        (b"Paris is the [MASK] of \xc3", "text/plain"),
        (b'{"inputs": "Paris is the [MASK] \x80 of France."}', "application/json"),
    ],
)
def test_c05_invalid_utf8_is_400(any_client: TestClient, body: bytes, content_type: str) -> None:
    r = any_client.post("/", content=body, headers={"content-type": content_type})
    assert_clean_error(r, 400, "not valid UTF-8")
    assert_control(any_client, any_client.fill_mask)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "text", ["Emoji 🚀🎉 and [MASK].", "NUL \x00 here [MASK].", "Right-to-left שלום עולם [MASK]."]
)
def test_c05_valid_unicode_is_200(any_client: TestClient, text: str) -> None:
    r = any_client.post(
        "/", content=text.encode("utf-8"), headers={"content-type": "text/plain; charset=utf-8"}
    )
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "body, status, words",
    [
        ({"inputs": 42}, 422, ("inputs must be a string", "a number")),
        ({"inputs": None}, 422, ("inputs must be a string", "null")),
        ({"inputs": {"text": "x"}}, 422, ("inputs must be a string", "an object")),
        ({"inputs": ["ok [MASK]", 7]}, 422, ("inputs[1]", "a number")),
        (
            {"inputs": "x [MASK]", "parameters": "top_k=3"},
            422,
            ("parameters must be a JSON object",),
        ),
        ([], 422, ("JSON object",)),
    ],
)
def test_c07_wrong_json_types_name_the_path(
    any_client: TestClient, body: Any, status: int, words: tuple[str, ...]
) -> None:
    r = any_client.post("/", content=json.dumps(body), headers=JSON)
    assert_clean_error(r, status, *words)
    assert_control(any_client, any_client.fill_mask)  # type: ignore[attr-defined]


@pytest.mark.parametrize("body", [b'{"inputs": "Paris is', b"Paris is the [MASK] of France."])
def test_c07_malformed_json_is_400(any_client: TestClient, body: bytes) -> None:
    r = any_client.post("/", content=body, headers=JSON)
    assert_clean_error(r, 400, "malformed JSON")


def test_c08_unknown_parameter_lists_accepted(fill_mask_client: TestClient) -> None:
    r = fill_mask_client.post("/", json={"inputs": SEED_TEXT, "parameters": {"topk": 3}})
    assert_clean_error(r, 422, "topk", "accepted: targets, top_k, truncation")
    assert_control(fill_mask_client, True)


def test_c08_parameter_of_another_task(tiny_models: dict[str, Path]) -> None:
    with app_client(tiny_models["token-classification"]) as client:
        r = client.post("/", json={"inputs": "John lives in Paris.", "parameters": {"top_k": 3}})
        assert_clean_error(r, 422, "top_k", "aggregation_strategy", "ignore_labels")
        assert_control(client, False)


@pytest.mark.parametrize("top_k", [0, -1, "5", 2.5])
def test_c09_bad_top_k_is_422(fill_mask_client: TestClient, top_k: Any) -> None:
    r = fill_mask_client.post("/", json={"inputs": SEED_TEXT, "parameters": {"top_k": top_k}})
    assert_clean_error(r, 422, "parameters.top_k")
    assert_control(fill_mask_client, True)


def test_c09_huge_top_k_is_clamped_to_the_vocabulary(fill_mask_client: TestClient) -> None:
    info = fill_mask_client.app.state.runtime.inference.info  # type: ignore[attr-defined]
    for top_k in (1_000_000_000, info.vocab_size):
        r = fill_mask_client.post("/", json={"inputs": SEED_TEXT, "parameters": {"top_k": top_k}})
        assert r.status_code == 200, r.text
        assert len(r.json()) == info.vocab_size


def test_c09_null_top_k_is_the_default_and_empty_targets_422(
    fill_mask_client: TestClient,
) -> None:
    r = fill_mask_client.post("/", json={"inputs": SEED_TEXT, "parameters": {"top_k": None}})
    assert r.status_code == 200 and len(r.json()) == 5  # the pipeline's default top_k
    r = fill_mask_client.post("/", json={"inputs": SEED_TEXT, "parameters": {"targets": []}})
    assert_clean_error(r, 422, "parameters.targets", "non-empty")
    assert_control(fill_mask_client, True)


def test_c01_truncation_that_cuts_the_mask_says_so(fill_mask_client: TestClient) -> None:
    body = {"inputs": LONG + " [MASK]", "parameters": {"truncation": True}}
    r = fill_mask_client.post("/", json=body)
    assert_clean_error(r, 422, "truncation cut off the mask token [MASK]", "first 512 tokens")
    assert_control(fill_mask_client, True)


def test_c09_predictions_per_input_are_bounded(fill_mask_client: TestClient) -> None:
    """Mask tokens x top_k <= 1000: the pipeline decodes the whole input once per prediction,
    so an unbounded product let one short request hold the model for minutes."""
    ten = " ".join(["[MASK]"] * 10)
    r = fill_mask_client.post("/", json={"inputs": ten, "parameters": {"top_k": 100}})
    assert r.status_code == 200, r.text
    assert [len(row) for row in r.json()] == [100] * 10
    r = fill_mask_client.post("/", json={"inputs": ten + " [MASK]", "parameters": {"top_k": 100}})
    assert_clean_error(r, 422, "11 mask token(s) x top_k 100 is 1100 predictions", "1000")
    many = {"inputs": "[MASK] " * 500, "parameters": {"top_k": 1_000_000}}
    assert_clean_error(fill_mask_client.post("/", json=many), 422, "predictions")
    assert_control(fill_mask_client, True)


@pytest.mark.parametrize(
    "bad, status",
    [
        ({"inputs": "Paris is the capital of France."}, 422),
        ({"inputs": SEED_TEXT, "parameters": {"top_k": -1}}, 422),
        ({"inputs": "[MASK] " + LONG}, 422),
    ],
)
def test_c11_one_bad_request_in_a_batch(
    fill_mask_client: TestClient, bad: dict[str, Any], status: int
) -> None:
    texts = [
        f"{w} is the [MASK] of France."
        for w in ("Paris", "Rome", "Berlin", "London", "A big city", "This", "The river")
    ]

    def post(body: dict[str, Any]) -> Any:
        return fill_mask_client.post("/", json=body)

    singles = [post({"inputs": t}).json() for t in texts]
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(post, {"inputs": t}) for t in texts[:4]]
        bad_future = pool.submit(post, bad)
        futures += [pool.submit(post, {"inputs": t}) for t in texts[4:]]
        responses = [f.result() for f in futures]
    assert_clean_error(bad_future.result(), status)
    for r, single in zip(responses, singles, strict=True):
        assert r.status_code == 200, r.text
        got = r.json()
        assert [g["score"] for g in got] == pytest.approx([s["score"] for s in single], abs=1e-4)
    assert_control(fill_mask_client, True)
