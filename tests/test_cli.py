"""The `pipeline-server` command line: help and version print without starting anything, every
setting is also a flag equal to its environment variable, a wrong flag exits 2 in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from service import cli
from service.settings import INTERNAL, Settings, load_settings, setting_names

COMMAND = [sys.executable, "-c", "from service.cli import main; main()"]
REPO = Path(__file__).resolve().parents[1]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize("args", [["--help"], ["export", "--help"], ["serve", "--help"]])
def test_help_prints_every_setting_with_its_variable_and_starts_nothing(args: list[str]) -> None:
    out = run(*args, env={"MODEL_ID": "/no/such/folder"})  # help never reads the model
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: pipeline-server")
    for flag, env in setting_names().items():
        assert flag in out.stdout and f"${env}" in out.stdout


def test_version_prints_the_package_version() -> None:
    from importlib import metadata

    out = run("--version")
    assert out.returncode == 0
    assert out.stdout.strip() == f"pipeline-server {metadata.version('pipeline-server')}"


def test_an_unknown_flag_exits_2_with_one_line() -> None:
    out = run("serve", "--modle-id=x")
    assert out.returncode == 2
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "unrecognized arguments: --modle-id=x" in lines[0]


def test_a_flag_is_its_environment_variable() -> None:
    by_flag = run("--model-id", "/no/such/folder", "--port", "8001")
    by_env = run(env={"MODEL_ID": "/no/such/folder", "PORT": "8001"})
    assert by_flag.returncode == by_env.returncode == 2
    assert by_flag.stderr == by_env.stderr
    assert "MODEL_ID=/no/such/folder: no such folder" in by_flag.stderr


def test_flags_before_or_after_the_command_set_the_same_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("PORT", "MAX_BATCH_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for argv in (
        ["--port", "8001", "serve", "--max-batch-size", "8"],
        ["serve", "--port", "8001", "--max-batch-size", "8"],
    ):
        args = vars(cli.parser().parse_args(argv))
        args.pop("command")
        assert args == {"PORT": "8001", "MAX_BATCH_SIZE": "8"}
        with monkeypatch.context() as m:
            for env, value in args.items():
                m.setenv(env, value)
            settings = load_settings()
        assert (settings.port, settings.max_batch_size) == (8001, 8)


def test_every_setting_has_a_flag() -> None:
    assert len(setting_names()) == len(Settings.model_fields) - len(INTERNAL) > 30
    assert setting_names()["--model-id"] == "MODEL_ID"
