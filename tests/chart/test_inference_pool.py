"""The chart's InferencePool (Gateway API Inference Extension, `inference.networking.k8s.io/v1`):
valid against the CRD's schema, selecting this release's pods on the serving port, and absent
when the cluster does not serve the API; the pods' `llm-d.ai/engine-type` label, and
docs/kubernetes.md's values for llm-d's router against the chart and the server."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from starlette.routing import Route

from service import metrics
from service.protocols.routes import ROUTES

from .helm import (
    CHART,
    CRD_APIS,
    NAMESPACE,
    RELEASE,
    REPO,
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
ENGINE_LABEL = "llm-d.ai/engine-type"


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


def test_pods_carry_the_llm_d_engine_type_label() -> None:
    """On the pods (with or without a pool), never in the selector (a selector is immutable);
    `inferencePool.engineType=""` leaves it off; the schema takes label values only."""
    for docs in (render(None), pool()[1]):
        deployment = only(docs, "Deployment")
        assert deployment["spec"]["template"]["metadata"]["labels"][ENGINE_LABEL] == (
            "pipeline-server"
        )
        assert ENGINE_LABEL not in deployment["spec"]["selector"]["matchLabels"]
    named = only(render(None, "inferencePool.engineType=embedder"), "Deployment")
    assert named["spec"]["template"]["metadata"]["labels"][ENGINE_LABEL] == "embedder"
    unlabelled = only(render(None, "inferencePool.engineType="), "Deployment")
    assert ENGINE_LABEL not in unlabelled["spec"]["template"]["metadata"]["labels"]
    done = helm(
        "template",
        RELEASE,
        str(CHART),
        "--set",
        f"image.repository={REPOSITORY}",
        "--set",
        "inferencePool.engineType=not a label",
    )
    assert done.returncode != 0 and "engineType" in done.stderr


def router_values() -> dict[str, Any]:
    """docs/kubernetes.md's values for llm-d's router chart (the yaml block naming
    `engineConfigs`), with its EndpointPickerConfig parsed."""
    text = (REPO / "docs" / "kubernetes.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    (block,) = [b for b in blocks if "engineConfigs" in b]
    values: dict[str, Any] = yaml.safe_load(block)
    epp = values["router"]["epp"]
    epp["config"] = yaml.safe_load(epp["pluginsCustomConfig"][epp["pluginsConfigFile"]])
    return values


def test_the_llm_d_router_recipe_matches_the_chart_and_the_server() -> None:
    values = router_values()
    docs = render(None)
    pod = only(docs, "Deployment")["spec"]["template"]
    servers = values["router"]["modelServers"]
    selector = only(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert servers["matchLabels"] == {**selector, "app.kubernetes.io/instance": "embed"}
    (container,) = pod["spec"]["containers"]
    assert servers["targetPorts"] == [{"number": container["ports"][0]["containerPort"]}]

    config = values["router"]["epp"]["config"]
    assert config["apiVersion"] == "llm-d.ai/v1alpha1"
    assert config["kind"] == "EndpointPickerConfig"
    plugins = {p.get("name", p["type"]): p for p in config["plugins"]}
    extractor = plugins["core-metrics-extractor"]["parameters"]
    (engine,) = extractor["engineConfigs"]
    assert engine["name"] == extractor["defaultEngine"] == pod["metadata"]["labels"][ENGINE_LABEL]
    gauges = {g.describe()[0].name for g in (metrics.REQUESTS_WAITING, metrics.REQUESTS_RUNNING)}
    assert {engine["queuedRequestsSpec"], engine["runningRequestsSpec"]} == gauges
    assert engine["queuedRequestsSpec"] == metrics.REQUESTS_WAITING.describe()[0].name
    for unserved in ("kvUsageSpec", "loraSpec", "cacheInfoSpec"):
        assert engine[unserved] == ""  # turned off: no KV cache, no adapters

    parsers = [p["pluginRef"] for p in config["requestHandler"]["parsers"]]
    assert parsers == ["openai-parser", "passthrough-parser"]  # the fallback last
    for profile in config["schedulingProfiles"]:
        assert {p["pluginRef"] for p in profile["plugins"]} <= plugins.keys()
    assert set(parsers) <= plugins.keys()
    paths = {r.path for r in ROUTES if isinstance(r, Route)}
    assert {"/v1/embeddings", "/", "/embed", "/rerank", "/metrics"} <= paths
