"""BACKEND and DTYPE: validated at start with one line naming the variable."""

from __future__ import annotations

import pytest

from service.settings import SettingsError, load_settings


@pytest.mark.parametrize(
    "env, name, words",
    [
        ({"DTYPE": "int8", "DEVICE": "cuda"}, "DTYPE", "DEVICE=cpu"),
        ({"DTYPE": "int8", "BACKEND": "torch"}, "DTYPE", "OpenVINO"),
        ({"BACKEND": "onnx", "DTYPE": "bfloat16"}, "BACKEND", "float32 or int8"),
        ({"BACKEND": "onnx", "DEVICE": "cuda", "DTYPE": "auto"}, "BACKEND", "DEVICE=cpu"),
        ({"BACKEND": "tensorrt"}, "BACKEND", "'auto', 'torch' or 'onnx'"),
        ({"DTYPE": "fp8"}, "DTYPE", "'float32'"),
    ],
)
def test_bad_backend_or_dtype_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], name: str, words: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith(f"invalid setting {name}:") and words in message
    assert "\n" not in message


def test_backend_and_dtype_are_read_case_insensitively(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BACKEND", "ONNX")
    monkeypatch.setenv("DTYPE", "Int8")
    settings = load_settings()
    assert (settings.backend, settings.dtype) == ("onnx", "int8")


def test_defaults_are_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BACKEND", raising=False)  # the suite's conftest sets torch/float32
    monkeypatch.delenv("DTYPE", raising=False)
    settings = load_settings()
    assert (settings.backend, settings.dtype) == ("auto", "auto")
