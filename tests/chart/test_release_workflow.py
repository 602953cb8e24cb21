"""The release workflow (.github/workflows/release.yml), checked offline.

Its structure against the GitHub Actions workflow schema (check-jsonschema's vendored copy of
SchemaStore's), its shell steps with `bash -n`, and the two steps that keep the versions in
step run here for real: the tag check against Chart.yaml, and the packaging step's edit that
makes the released chart name the released image.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from .helm import CHART, REPO, helm, only, server_container

pytestmark = pytest.mark.chart

WORKFLOW = REPO / ".github" / "workflows" / "release.yml"
EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


def _steps() -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = yaml.safe_load(WORKFLOW.read_text())["jobs"]["release"]["steps"]
    return steps


def _step(name: str) -> dict[str, Any]:
    return next(s for s in _steps() if s.get("name", "").startswith(name))


def _run(step: dict[str, Any], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    script = EXPRESSION.sub(lambda m: env.get(m.group(1), ""), step["run"])
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        env={**os.environ, **env},
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_workflow_matches_the_actions_schema() -> None:
    checker = Path(sys.executable).with_name("check-jsonschema")
    done = subprocess.run(
        [str(checker), "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_it_runs_on_version_tags_only() -> None:
    on = yaml.safe_load(WORKFLOW.read_text())[True]  # YAML 1.1 reads the key `on` as True
    assert on == {"push": {"tags": ["v[0-9]+.[0-9]+.[0-9]+"]}}


def test_shell_steps_parse() -> None:
    for step in _steps():
        if "run" in step:
            script = EXPRESSION.sub("x", step["run"])
            done = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True)
            assert done.returncode == 0, (step["name"], done.stderr)


def test_every_version_output_used_is_written() -> None:
    text = WORKFLOW.read_text()
    used = set(re.findall(r"steps\.version\.outputs\.(\w+)", text))
    written = set(re.findall(r'echo "(\w+)=', _step("Version from the tag")["run"]))
    assert used and used <= written, used - written


def _version_step(tag: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], str]:
    output = tmp_path / "output"
    output.write_text("")
    env = {
        "GITHUB_REF_NAME": tag,
        "GITHUB_OUTPUT": str(output),
        "GITHUB_REPOSITORY_OWNER": "Example-Org",
        "CHART_DIR": str(CHART),
    }
    return _run(_step("Version from the tag"), env, REPO), output.read_text()


def test_the_tag_must_match_chart_version_and_app_version(tmp_path: Path) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"], "released together: one version"
    done, output = _version_step(f"v{chart['version']}", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert output.splitlines() == [
        f"version={chart['version']}",
        "image=ghcr.io/example-org/pipeline-server",
        "charts=oci://ghcr.io/example-org/charts",
    ]
    done, _ = _version_step("v99.0.0", tmp_path)
    assert done.returncode == 1
    assert f"Chart.yaml has version {chart['version']} and appVersion {chart['version']}" in (
        done.stdout
    )


def test_the_released_chart_names_the_released_image(tmp_path: Path) -> None:
    """The packaging step's edit, applied to a copy of the chart (helm stubbed out): the chart
    then renders with no --set, pulling IMAGE:appVersion."""
    chart = tmp_path / "pipeline-server"
    shutil.copytree(CHART, chart)
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "helm").write_text("#!/bin/sh\ncat >/dev/null\n")  # reads what is piped to it
    (stub / "helm").chmod(0o755)
    env = {
        "VERSION": "0.1.0",
        "IMAGE": "ghcr.io/example-org/pipeline-server",
        "CHARTS": "oci://ghcr.io/example-org/charts",
        "REGISTRY_PASSWORD": "x",
        "CHART_DIR": str(chart),
        "PATH": f"{stub}:{os.environ['PATH']}",
    }
    done = _run(_step("Package and push the chart"), env, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    rendered = helm("template", "rel", str(chart))
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    assert server_container(docs)["image"] == "ghcr.io/example-org/pipeline-server:0.1.0"
    assert only(docs, "Pod")["spec"]["containers"][0]["image"] == server_container(docs)["image"]
