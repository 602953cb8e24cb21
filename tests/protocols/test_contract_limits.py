"""Refusals at the edge of the task contracts, in process: zero-shot templates and pair limits,
the name answers give the model, and what a 424 (wrong task) says.

References: the zero-shot pipeline formats `hypothesis_template.format(label)`; we accept only
`{}` / `{0}` (any other brace would make `format` raise or read attributes), and count
premise/hypothesis pairs against MAX_CLIENT_BATCH_SIZE as inputs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import app_client
from starlette.testclient import TestClient

from service.engine.loading.load import served_name
from service.protocols.classification.hf import hypothesis
from service.settings import Settings

TEXT = "paris is the capital of france"
LABELS = ["city", "river", "good"]


@pytest.fixture(scope="module")
def zero_shot(tiny_models: dict[str, Path]) -> Iterator[TestClient]:
    with app_client(tiny_models["zero-shot-classification"], max_client_batch_size=4) as client:
        yield client


def _zs(client: TestClient, inputs: object, **parameters: object) -> tuple[int, dict]:
    body = {"inputs": inputs, "parameters": {"candidate_labels": LABELS, **parameters}}
    response = client.post("/", json=body)
    return response.status_code, response.json()


@pytest.mark.parametrize(
    ("template", "label", "expected"),
    [
        ("This example is {}.", "city", "This example is city."),
        ("It is about {0}.", "river", "It is about river."),
        ("{} and {}", "x", "x and x"),
    ],
)
def test_hypothesis_replaces_the_placeholder_as_format_does(
    template: str, label: str, expected: str
) -> None:
    assert hypothesis(template, label) == expected
    if template.count("{") == 1:
        assert template.format(label) == expected  # the pipeline's own substitution


def test_indexed_and_bare_placeholders_answer_the_same(zero_shot: TestClient) -> None:
    code_bare, bare = _zs(zero_shot, TEXT, hypothesis_template="It is about {}.")
    code_indexed, indexed = _zs(zero_shot, TEXT, hypothesis_template="It is about {0}.")
    assert code_bare == code_indexed == 200
    assert bare == indexed


@pytest.mark.parametrize(
    "template", ["About {label}.", "About {0.__class__}.", "About {1}.", "About }{.", "No slot."]
)
def test_templates_format_cannot_fill_are_422(zero_shot: TestClient, template: str) -> None:
    code, body = _zs(zero_shot, TEXT, hypothesis_template=template)
    assert code == 422, body
    assert "hypothesis_template" in body["error"]


def test_pairs_over_the_request_limit_are_413_before_any_work(zero_shot: TestClient) -> None:
    # 2 inputs x 3 labels = 6 pairs > MAX_CLIENT_BATCH_SIZE=4; 1 x 3 = 3 fits
    code, body = _zs(zero_shot, [TEXT, TEXT])
    assert code == 413, body
    assert "6 premise/hypothesis pairs" in body["error"]
    assert "MAX_CLIENT_BATCH_SIZE" in body["error"]
    assert _zs(zero_shot, TEXT)[0] == 200


def test_empty_candidate_labels_are_422(zero_shot: TestClient) -> None:
    response = zero_shot.post("/", json={"inputs": TEXT, "parameters": {"candidate_labels": []}})
    assert response.status_code == 422
    assert "candidate_labels" in response.json()["error"]


def test_served_name_setting_names_the_model_in_openai_answers(embedded_model: Path) -> None:
    with app_client(embedded_model, served_model_name="team/minilm") as client:
        out = client.post("/v1/embeddings", json={"input": "hello", "model": "whatever"})
        assert out.status_code == 200
        assert out.json()["model"] == "team/minilm"
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["team/minilm"]
        assert client.get("/info").json()["model"]["served_name"] == "team/minilm"


def test_the_embedded_model_keeps_its_name_through_a_link(
    embedded_model: Path, tmp_path: Path
) -> None:
    """The image moves the embedded folder to /models/model and links the package's path to
    it; MODEL_ID=/models/model is still all-MiniLM-L6-v2 to clients, not `model`."""
    link = tmp_path / "model"
    link.symlink_to(embedded_model, target_is_directory=True)
    assert served_name(Settings(), str(link)) == "sentence-transformers/all-MiniLM-L6-v2"
    assert served_name(Settings(), str(embedded_model)) == "sentence-transformers/all-MiniLM-L6-v2"
    other = tmp_path / "other"
    other.mkdir()
    assert served_name(Settings(), str(other)) == "other"


def test_a_local_folder_is_served_under_its_own_name_not_its_path(
    tiny_models: dict[str, Path],
) -> None:
    folder = tiny_models["fill-mask"]
    with app_client(folder) as client:
        cards = client.get("/v1/models").json()["data"]
        assert [c["id"] for c in cards] == [folder.name]
        # a wrong-task route (424) names the task, never the folder
        wrong = client.post("/rerank", json={"query": "q", "texts": ["a"]})
        assert wrong.status_code == 424
        assert "it serves fill-mask" in wrong.json()["error"]
        assert str(folder) not in wrong.text
