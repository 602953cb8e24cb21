"""Run helm against charts/pipeline-server and hand back the rendered objects.

helm comes from `.tools/bin` (where `scripts/install-helm.sh` puts it); when it is missing, the
script is run once, so the tests work on a fresh clone with only pip's index reachable. `HELM`
in the environment points at another binary.
"""

from __future__ import annotations

import functools
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "pipeline-server"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
# A profile users pass with `-f` (it names no image: theirs is set with it).
SMALL_VALUES = CHART / "values-small.yaml"
# Render CRD-backed objects as a cluster with KEDA and the Prometheus Operator would.
CRD_APIS = ("keda.sh/v1alpha1/ScaledObject", "monitoring.coreos.com/v1/ServiceMonitor")
RELEASE = "rel"
NAMESPACE = "ml"
# The chart has no default image (none is published): renders of the default values name one,
# as every `ci/*-values.yaml` does.
REPOSITORY = "registry.example.com/ml/pipeline-server"

Manifest = dict[str, Any]


@functools.cache
def helm_binary() -> str:
    """The helm to run: $HELM, else .tools/bin/helm, installed there on first use."""
    if env := os.environ.get("HELM"):
        return env
    local = REPO / ".tools" / "bin" / "helm"
    if not local.exists():
        subprocess.run(
            [str(REPO / "scripts" / "install-helm.sh"), str(local.parent)],
            env={**os.environ, "PYTHON": sys.executable},
            check=True,
            timeout=300,
        )
    return str(local)


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    """Run helm with `args`; the caller checks `returncode` (failures are often the point)."""
    return subprocess.run(
        [helm_binary(), *args], capture_output=True, text=True, timeout=120, check=False
    )


def names_an_image(values: Path | None) -> bool:
    """The values file sets `image.repository` (every `ci/*-values.yaml` does)."""
    if values is None:
        return False
    return bool((yaml.safe_load(values.read_text()).get("image") or {}).get("repository"))


def values_args(values: Path | None, sets: tuple[str, ...]) -> list[str]:
    """`--values` and `--set` arguments; `image.repository` is set when the file names none."""
    args = ["--values", str(values)] if values else []
    if not names_an_image(values):
        args += ["--set", f"image.repository={REPOSITORY}"]
    for s in sets:
        args += ["--set", s]
    return args


@functools.cache
def render(
    values: Path | None = None, *sets: str, apis: tuple[str, ...] = CRD_APIS
) -> list[Manifest]:
    """`helm template` with a values file and `--set` overrides; the objects, in order."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    args += values_args(values, sets)
    for api in apis:
        args += ["--api-versions", api]
    done = helm(*args)
    if done.returncode != 0:
        raise AssertionError(f"helm template failed:\n{done.stderr}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def render_error(values: Path | None = None, *sets: str) -> str:
    """`helm template` that must fail; its error output."""
    args = ["template", RELEASE, str(CHART), *values_args(values, sets)]
    done = helm(*args)
    assert done.returncode != 0, f"rendering with {sets} should have failed"
    return done.stderr


def only(docs: list[Manifest], kind: str) -> Manifest:
    """The single object of `kind` (the chart's objects are one per kind)."""
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def kinds(docs: list[Manifest]) -> list[str]:
    return [d["kind"] for d in docs]


def server_container(docs: list[Manifest]) -> Manifest:
    containers: list[Manifest] = only(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, "the pod has exactly one container"
    return containers[0]


def env_map(container: Manifest) -> dict[str, Manifest]:
    """Env entries by name (the entry, so callers can see value or valueFrom)."""
    return {e["name"]: e for e in container.get("env", [])}


def values_id(path: Path | None) -> str:
    return path.name if path else "default"


def quantity(text: str) -> float:
    """A quantity in bytes or cores ("1280Mi", "2Gi", "1500m", "2")."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "M": 10**6, "G": 10**9, "m": 1e-3}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return float(text.removesuffix(suffix)) * factor
    return float(text)


def cpu_cores(quantity: str | int | float) -> float:
    """A CPU quantity in cores ("1500m" -> 1.5, "2" -> 2.0)."""
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def container_env(container: Manifest) -> dict[str, str]:
    """The env a kubelet gives the container (no Secrets here: secret refs are left out).

    resourceFieldRef requests.cpu with divisor 1 is the request rounded up, as the API does it.
    """
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        elif ref := entry["valueFrom"].get("resourceFieldRef"):
            assert (ref["resource"], ref["divisor"]) == ("requests.cpu", "1"), ref
            cpu = container["resources"]["requests"]["cpu"]
            env[entry["name"]] = str(math.ceil(cpu_cores(cpu)))
    return env
