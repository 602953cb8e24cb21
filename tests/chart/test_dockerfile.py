"""The Dockerfile, statically: hadolint, the build context, and agreement with the chart."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from .helm import REPO, env_map, only, render, server_container

pytestmark = pytest.mark.chart

DOCKERFILE = REPO / "Dockerfile"


def test_hadolint_clean() -> None:
    hadolint = Path(sys.executable).with_name("hadolint")
    done = subprocess.run(
        [str(hadolint), "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_build_context_holds_what_the_dockerfile_copies() -> None:
    allowed = [
        line[1:].rstrip("/")
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    sources = re.findall(r"^COPY (?!--from)(.+) \S+$", DOCKERFILE.read_text(), re.MULTILINE)
    copied = [src.rstrip("/") for line in sources for src in line.split()]
    assert sorted(set(copied)) == sorted(allowed)
    for path in copied:
        assert (REPO / path).exists(), f"{path} is copied into the image but missing"


def test_image_and_chart_agree() -> None:
    dockerfile = DOCKERFILE.read_text()
    docs = render(None)
    pod = only(docs, "Deployment")["spec"]["template"]["spec"]
    env = env_map(server_container(docs))
    uid = pod["securityContext"]["runAsUser"]
    assert f"useradd --system --uid {uid}" in dockerfile
    assert f"USER {uid}:{pod['securityContext']['runAsGroup']}" in dockerfile
    assert f"MODEL_ID={env['MODEL_ID']['value']}" in dockerfile
    assert f"HF_HOME={env['HF_HOME']['value']}" in dockerfile
    assert f"EXPOSE {server_container(docs)['ports'][0]['containerPort']}" in dockerfile
    assert "HEALTHCHECK" in dockerfile and "/livez" in dockerfile
    assert 'CMD ["pipeline-server"]' in dockerfile  # exec form: gunicorn gets SIGTERM as PID 1
    assert "ARG BASE_IMAGE=python:3.11-slim" in dockerfile


def test_chart_readme_values_table_is_current() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "chart_values_table.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_the_installed_package_holds_every_module_of_service(tmp_path: Path) -> None:
    """The image runs the installed wheel, not the source tree: a subpackage left out of
    pyproject's package list imports here (from the checkout) and fails only in the image.
    Built from a copy of what the Dockerfile copies, so no stale build/ folder hides it."""
    import shutil
    import zipfile

    src = tmp_path / "src"
    shutil.copytree(REPO / "service", src / "service", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(tmp_path / "wheel"),
            str(src),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = (tmp_path / "wheel").glob("pipeline_server-*.whl")
    packed = {n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".py")}
    source = {p.relative_to(REPO).as_posix() for p in (REPO / "service").rglob("*.py")}
    assert source - packed == set()
