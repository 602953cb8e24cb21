"""The chart's InferencePool (Gateway API Inference Extension, `inference.networking.k8s.io/v1`):
valid against the CRD's schema, selecting this release's pods on the serving port, and absent
when the cluster does not serve the API."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from .helm import (
    CHART,
    CRD_APIS,
    NAMESPACE,
    RELEASE,
    REPOSITORY,
    Manifest,
    helm,
    kinds,
    only,
    render,
)

pytestmark = pytest.mark.chart

SCHEMA = Path(__file__).parent / "schemas" / "inference.networking.k8s.io_inferencepool_v1.json"
POOL_API = "inference.networking.k8s.io/v1/InferencePool"
WITH_POOL = (*CRD_APIS, POOL_API)


def pool(*sets: str) -> tuple[Manifest, list[Manifest]]:
    docs = render(None, "inferencePool.enabled=true", *sets, apis=WITH_POOL)
    return only(docs, "InferencePool"), docs


def test_inference_pool_is_valid_against_the_crd_schema() -> None:
    for sets in [(), ("inferencePool.endpointPicker.failureMode=FailOpen", "server.port=9000")]:
        made, _ = pool(*sets)
        jsonschema.validate(made, json.loads(SCHEMA.read_text()))
        # The CRD's CEL rules, which jsonschema does not run: unique target ports, and a port
        # for a Service-kind picker.
        numbers = [p["number"] for p in made["spec"]["targetPorts"]]
        assert len(set(numbers)) == len(numbers)
        picker = made["spec"]["endpointPickerRef"]
        assert picker.get("kind", "Service") != "Service" or "port" in picker


def test_inference_pool_selects_the_release_pods_on_the_serving_port() -> None:
    made, docs = pool("server.port=9000")
    assert made["apiVersion"] == "inference.networking.k8s.io/v1"
    assert made["metadata"]["namespace"] == NAMESPACE
    pod = only(docs, "Deployment")["spec"]["template"]
    selector = made["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    assert selector == only(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    (container,) = pod["spec"]["containers"]
    (http,) = [p for p in container["ports"] if p["name"] == "http"]
    assert made["spec"]["targetPorts"] == [{"number": http["containerPort"]}] == [{"number": 9000}]
    picker = made["spec"]["endpointPickerRef"]
    assert picker == {
        "name": f"{RELEASE}-pipeline-server-epp",
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }


def test_inference_pool_names_the_picker_it_is_given() -> None:
    made, _ = pool("inferencePool.endpointPicker.serviceName=embeddings-epp")
    assert made["spec"]["endpointPickerRef"]["name"] == "embeddings-epp"


def test_schema_rejects_a_bad_failure_mode() -> None:
    done = helm(
        "template", RELEASE, str(CHART), "--set", "inferencePool.endpointPicker.failureMode=Open"
    )
    assert done.returncode != 0 and "failureMode" in done.stderr


def test_nothing_renders_without_the_api_or_when_disabled() -> None:
    without_api = render(None, "inferencePool.enabled=true", apis=CRD_APIS)
    assert "InferencePool" not in kinds(without_api)
    assert "InferencePool" not in kinds(render(None, apis=WITH_POOL))
    done = helm(
        "install",
        RELEASE,
        str(CHART),
        "--dry-run=client",
        "--set",
        f"image.repository={REPOSITORY}",
        "--set",
        "inferencePool.enabled=true",
    )
    assert done.returncode == 0, done.stderr
    assert "WARNING: inferencePool.enabled=true, but this cluster does not serve" in done.stdout
    assert "kind: InferencePool" not in done.stdout
