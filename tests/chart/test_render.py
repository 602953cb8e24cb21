"""The chart, rendered and checked: lint, Kubernetes schemas, and what the objects promise.

Every values set is the defaults plus each `ci/*-values.yaml`. Manifests are validated per
document against the oldest and newest Kubernetes the chart supports (kubernetes-validate,
strict: unknown fields fail), CRD-backed ones against the JSON schemas in `schemas/`.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from starlette.routing import Route

from service.protocols.routes import ROUTES
from service.settings import INTERNAL, Settings, load_settings

from .helm import (
    CHART,
    CI_VALUES,
    NAMESPACE,
    RELEASE,
    REPOSITORY,
    SMALL_VALUES,
    Manifest,
    container_env,
    env_map,
    helm,
    kinds,
    names_an_image,
    only,
    quantity,
    render,
    render_error,
    server_container,
    values_id,
)

pytestmark = pytest.mark.chart

KUBE_VERSIONS = ("1.28", kubernetes_validate.latest_version())
VALUE_SETS: list[Path | None] = [None, *CI_VALUES, SMALL_VALUES]
SCHEMAS = Path(__file__).parent / "schemas"
CRD_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): SCHEMAS / "keda.sh_scaledobject_v1alpha1.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SCHEMAS
    / "monitoring.coreos.com_servicemonitor_v1.json",
}
# Env the chart sets that are not service settings: library knobs.
LIBRARY_ENV = {"HF_HUB_OFFLINE", "HF_HOME", "XDG_CACHE_HOME"}
TEST_ONLY_SETTINGS = {"MODEL_LOAD_DELAY_S"}
EXAMPLE_CURL = 'curl -X POST -d "The weather is lovely today." http://localhost:8000/'
WITH_IMAGE = ("--set", f"image.repository={REPOSITORY}")
NO_IMAGE = (
    "image.repository is required: no pipeline-server image is published. Build one from the "
    "repository's Dockerfile and push it to a registry your cluster can pull from (docker build "
    "-t REGISTRY/pipeline-server:0.1.0 . && docker push REGISTRY/pipeline-server:0.1.0)"
)

values_sets = pytest.mark.parametrize("values", VALUE_SETS, ids=values_id)


def pod_spec(docs: list[Manifest]) -> Manifest:
    spec: Manifest = only(docs, "Deployment")["spec"]["template"]["spec"]
    return spec


def ci_values(name: str) -> Path:
    return CHART / "ci" / name


# --- helm's own checks ---------------------------------------------------------------------


@values_sets
def test_lint_strict(values: Path | None) -> None:
    args = ["lint", "--strict", str(CHART)] + (["--values", str(values)] if values else [])
    done = helm(*args, *([] if names_an_image(values) else WITH_IMAGE))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("command", ["template", "install", "lint"])
def test_without_an_image_rendering_says_how_to_get_one(command: str) -> None:
    """No image is published: a default install would pull `pipeline-server:0.1.0` from Docker
    Hub's library and fail with ImagePullBackOff. The render fails instead, with one message
    saying how to build, push and name the image; `helm lint` (lenient about required values,
    as helm is for every chart) passes and warns with the same message."""
    if command == "lint":
        done = helm("lint", "--strict", str(CHART))
        assert done.returncode == 0, done.stdout + done.stderr
    else:
        extra = ["--dry-run=client"] if command == "install" else []
        done = helm(command, RELEASE, str(CHART), *extra)
        assert done.returncode != 0
    output = done.stdout + done.stderr
    assert NO_IMAGE in output, output
    assert "--set image.repository=REGISTRY/pipeline-server" in output
    assert "image.repository: pipeline-server" not in output
    for values in CI_VALUES:  # every example values file names its image
        assert yaml.safe_load(values.read_text())["image"]["repository"], values.name


def test_package(tmp_path: Path) -> None:
    done = helm("package", str(CHART), "--destination", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert list(tmp_path.glob("pipeline-server-*.tgz"))


def test_schema_rejects_misspelled_values() -> None:
    assert "'maxBatchSzie' not allowed" in render_error(None, "server.maxBatchSzie=4")
    assert "'replicaCont' not allowed" in render_error(None, "replicaCont=2")
    assert "source" in render_error(None, "model.source=s3")


def _notes(*args: str) -> str:
    done = helm("install", RELEASE, str(CHART), "--dry-run=client", "--namespace", NAMESPACE, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.split("NOTES:", 1)[1]


def test_notes_print_port_forward_and_curl() -> None:
    notes = _notes(*WITH_IMAGE)
    fullname = f"{RELEASE}-pipeline-server"
    assert f"kubectl --namespace {NAMESPACE} port-forward service/{fullname} 8000:8000" in notes
    assert EXAMPLE_CURL in notes
    assert "/openapi.json" in notes and "/rerank" in notes and "/v1/embeddings" in notes


def test_notes_name_the_served_model_and_the_image() -> None:
    """Not the container path (`/models/model`): the model, and where it comes from."""
    notes = " ".join(_notes(*WITH_IMAGE).split())
    assert f"pipeline-server 0.1.0 ({REPOSITORY}:0.1.0) serves the model baked into the image" in (
        notes
    )
    assert "sentence-transformers/all-MiniLM-L6-v2" in notes
    assert "/models/model" not in notes
    named = " ".join(_notes(*WITH_IMAGE, "--set", "model.servedName=minilm").split())
    assert "serves the model minilm." in named
    keda = " ".join(_notes("--values", str(ci_values("keda-values.yaml"))).split())
    assert "serves the model google-bert/bert-base-uncased at revision 86b5e09" in keda
    assert "task fill-mask" in keda and '-X POST -d "Paris is the [MASK] of France."' in keda
    pvc = " ".join(_notes("--values", str(ci_values("full-values.yaml"))).split())
    assert "serves the model found in the PersistentVolumeClaim models" in pvc


def test_notes_with_api_key_send_it() -> None:
    notes = _notes(*WITH_IMAGE, "--set", "apiKey.value=k")
    assert 'curl -H "Authorization: Bearer $API_KEY" -X POST -d' in notes


# --- Kubernetes schemas ----------------------------------------------------------------------


@values_sets
@pytest.mark.parametrize("kube", KUBE_VERSIONS)
def test_manifests_match_kubernetes_schemas(values: Path | None, kube: str) -> None:
    errors = []
    for doc in render(values):
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        crd = CRD_SCHEMAS.get((doc["apiVersion"], doc["kind"]))
        try:
            if crd:
                jsonschema.validate(doc, json.loads(crd.read_text()))
            else:
                kubernetes_validate.validate(doc, kube, strict=True)
        except jsonschema.ValidationError as e:  # kubernetes_validate's error subclasses it
            errors.append(f"{where} at {list(e.absolute_path)}: {e.message}")
    assert not errors, "\n".join(errors)


def test_every_crd_kind_is_checked() -> None:
    rendered = {d["kind"] for v in VALUE_SETS for d in render(v)}
    assert {"ScaledObject", "ServiceMonitor"} <= rendered


# --- the Deployment against the service --------------------------------------------------------


@values_sets
def test_probes_hit_the_service_routes_on_its_port(values: Path | None) -> None:
    docs = render(values)
    container = server_container(docs)
    routes = {r.path: r.methods or set() for r in ROUTES if isinstance(r, Route)}
    probes = {k: container[k] for k in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert probes["startupProbe"]["httpGet"]["path"] == "/readyz"
    assert probes["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert probes["livenessProbe"]["httpGet"]["path"] == "/livez"
    (port,) = container["ports"]
    for probe in probes.values():
        assert "GET" in routes[probe["httpGet"]["path"]]
        assert probe["httpGet"]["port"] == port["name"] == "http"
    assert env_map(container)["PORT"]["value"] == str(port["containerPort"])
    assert env_map(container)["HOST"]["value"] == "0.0.0.0"
    service = only(docs, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "http"


@values_sets
def test_env_names_are_service_settings(values: Path | None) -> None:
    settings = {name.upper() for name in Settings.model_fields}
    container = server_container(render(values))
    extra = {e["name"] for e in _values_extra_env(values)}
    unknown = set(env_map(container)) - settings - LIBRARY_ENV - extra
    assert not unknown, f"the chart sets env the service does not read: {unknown}"


def test_every_setting_is_reachable_from_values() -> None:
    internal = {name.upper() for name in INTERNAL}  # the master hands these to its worker
    settings = {name.upper() for name in Settings.model_fields} - TEST_ONLY_SETTINGS - internal
    rendered = {
        name
        for values in VALUE_SETS
        for name in env_map(server_container(render(values)))
        if name not in LIBRARY_ENV
    }
    optional = render(
        None,
        "model.task=fill-mask",
        "model.revision=main",
        "model.pooling=mean",
        "model.servedName=my-model",
        "server.dtype=float32",
        "server.maxBatchTokens=4096",
        "server.calibrationFile=/calibration/texts.txt",
        "server.longInputs=chunk",
        "apiKey.value=k",
    )
    rendered |= set(env_map(server_container(optional)))
    assert settings <= rendered, f"no value sets {settings - rendered}"


def test_schema_choices_are_the_settings_choices() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["server"]
    fields = {
        "device": "device",
        "dtype": "dtype",
        "logLevel": "log_level",
        "logFormat": "log_format",
        "longInputs": "long_inputs",
        "openaiTokenIds": "openai_token_ids",
    }
    for value, field in fields.items():
        allowed = set(typing.get_args(Settings.model_fields[field].annotation))
        assert set(schema["properties"][value]["enum"]) - {""} == allowed, value


def test_settings_come_from_values() -> None:
    env = env_map(
        server_container(
            render(
                None,
                "server.maxBatchSize=7",
                "server.maxBatchWaitMs=3",
                "server.maxQueueSize=99",
                "server.requestTimeoutS=12",
                "server.drainTimeoutS=20",
                "model.task=fill-mask",
            )
        )
    )
    assert env["MAX_BATCH_SIZE"]["value"] == "7"
    assert env["MAX_BATCH_WAIT_MS"]["value"] == "3"
    assert env["MAX_QUEUE_SIZE"]["value"] == "99"
    assert env["REQUEST_TIMEOUT_S"]["value"] == "12"
    assert env["DRAIN_TIMEOUT_S"]["value"] == "20"
    assert env["TASK"]["value"] == "fill-mask"
    assert env["MAX_BODY_BYTES"]["value"] == "4194304"  # not 4.194304e+06


@pytest.mark.parametrize(
    "sets, size, tokens",
    [((), 64, 8192), (("server.maxBatchTokens=0",), 64, None)],
)
def test_batch_bounds_from_values_are_read_as_the_service_reads_them(
    monkeypatch: pytest.MonkeyPatch, sets: tuple[str, ...], size: int, tokens: int | None
) -> None:
    """The chart's defaults are the service's; maxBatchTokens 0 is no token budget."""
    env = env_map(server_container(render(None, *sets)))
    for name in ("MAX_BATCH_SIZE", "MAX_BATCH_TOKENS"):
        monkeypatch.setenv(name, env[name]["value"])
    settings = load_settings()
    assert (settings.max_batch_size, settings.max_batch_tokens) == (size, tokens)


def test_api_key_comes_from_a_secret() -> None:
    docs = render(ci_values("full-values.yaml"))
    ref = env_map(server_container(docs))["API_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "pipeline-server-api-key", "key": "token"}
    assert "Secret" not in kinds(docs)  # an existing Secret: the chart creates none

    docs = render(None, "apiKey.value=s3cret")
    secret = only(docs, "Secret")
    ref = env_map(server_container(docs))["API_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == secret["metadata"]["name"]
    assert ref["key"] in secret["data"]
    assert "s3cret" not in json.dumps(only(docs, "Deployment"))
    assert "API_KEY" not in env_map(server_container(render(None)))


def test_torch_threads_are_the_guaranteed_cpus() -> None:
    """One thread per CPU of the request, the CPUs the pod is sure of (a thread beyond them
    waits for a core on a busy node, and the batch waits for it)."""
    container = server_container(render(None))
    assert container_env(container)["TORCH_NUM_THREADS"] == "2"
    assert env_map(container)["TORCH_NUM_THREADS"]["valueFrom"]["resourceFieldRef"] == {
        "resource": "requests.cpu",
        "divisor": "1",
    }
    burstable = server_container(render(None, "resources.requests.cpu=1"))
    assert container_env(burstable)["TORCH_NUM_THREADS"] == "1"
    gpu = env_map(server_container(render(ci_values("gpu-values.yaml"))))
    assert gpu["TORCH_NUM_THREADS"]["value"] == "4"


@values_sets
def test_resources_are_set(values: Path | None) -> None:
    resources = server_container(render(values))["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"])
    assert "memory" in resources["limits"]


@pytest.mark.parametrize("values", [None, ci_values("keda-values.yaml")], ids=values_id)
def test_the_pod_is_guaranteed_qos(values: Path | None) -> None:
    """Kubernetes gives a pod the Guaranteed class when every container, init containers
    included, requests exactly its limits of CPU and memory."""
    spec = pod_spec(render(values))
    containers = spec["containers"] + spec.get("initContainers", [])
    assert len(containers) == (2 if values else 1)
    for container in containers:
        requests, limits = container["resources"]["requests"], container["resources"]["limits"]
        for resource in ("cpu", "memory"):
            assert quantity(str(requests[resource])) == quantity(str(limits[resource])), (
                container["name"],
                resource,
            )


@pytest.mark.parametrize(
    ("values", "sets", "emptydirs"),
    [
        (None, (), ["cache", "tmp"]),
        (None, ("tmp.medium=Memory",), ["cache"]),
        (None, ("cache.sizeLimit=1.5Gi", "tmp.sizeLimit=100M"), ["cache", "tmp"]),
        (ci_values("keda-values.yaml"), (), ["cache", "tmp", "model"]),
    ],
)
def test_ephemeral_storage_request_covers_the_emptydirs(
    values: Path | None, sets: tuple[str, ...], emptydirs: list[str]
) -> None:
    docs = render(values, *sets)
    volumes = {v["name"]: v for v in pod_spec(docs)["volumes"]}
    on_disk = [n for n, v in volumes.items() if v.get("emptyDir", {}).get("medium") != "Memory"]
    assert sorted(n for n in on_disk if "emptyDir" in volumes[n]) == sorted(emptydirs)
    total = sum(quantity(volumes[n]["emptyDir"]["sizeLimit"]) for n in emptydirs)
    request = server_container(docs)["resources"]["requests"]["ephemeral-storage"]
    assert total <= quantity(request) < total + 2**20  # rounded up to the next MiB
    given = render(None, "resources.requests.ephemeral-storage=5Gi")
    assert server_container(given)["resources"]["requests"]["ephemeral-storage"] == "5Gi"


def test_resources_are_required_by_the_schema() -> None:
    assert "resources" in render_error(None, "resources=null")
    assert "memory" in render_error(None, "resources.limits.memory=null")


# --- shutdown and rollout ------------------------------------------------------------------------


@values_sets
def test_grace_period_covers_prestop_and_drain(values: Path | None) -> None:
    docs = render(values)
    spec = pod_spec(docs)
    container = server_container(docs)
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep", "an exec sleep: the native sleep action needs k8s 1.29"
    pre_stop = float(command[1])
    drain = float(env_map(container)["DRAIN_TIMEOUT_S"]["value"])
    assert spec["terminationGracePeriodSeconds"] >= pre_stop + drain + 10


def test_grace_period_too_short_fails_clearly() -> None:
    error = render_error(None, "terminationGracePeriodSeconds=30")
    assert "terminationGracePeriodSeconds (30) must be at least preStopSleepSeconds (5)" in error
    assert "server.drainTimeoutS (25) + 10 = 40" in error


@values_sets
def test_rollout_adds_before_it_removes(values: Path | None) -> None:
    strategy = only(render(values), "Deployment")["spec"]["strategy"]
    assert strategy == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }


@values_sets
def test_startup_probe_budget_covers_model_load(values: Path | None) -> None:
    container = server_container(render(values))
    startup = container["startupProbe"]
    assert startup["failureThreshold"] * startup["periodSeconds"] >= 300
    assert "initialDelaySeconds" not in container["livenessProbe"] or (
        container["livenessProbe"]["initialDelaySeconds"] == 0
    ), "the startup probe already holds liveness back"


# --- security ----------------------------------------------------------------------------------


def _restricted(container: Manifest) -> None:
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert "add" not in sc["capabilities"]
    assert sc["seccompProfile"]["type"] == "RuntimeDefault"


@values_sets
def test_pods_are_restricted(values: Path | None) -> None:
    docs = render(values)
    pods = [pod_spec(docs), only(docs, "Pod")["spec"]]
    for spec in pods:
        assert spec["automountServiceAccountToken"] is False
        assert spec["enableServiceLinks"] is False
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] == 10001
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        assert not any("hostPath" in v for v in spec.get("volumes", []))
        for container in spec["containers"] + spec.get("initContainers", []):
            _restricted(container)
    if "ServiceAccount" in kinds(docs):
        assert only(docs, "ServiceAccount")["automountServiceAccountToken"] is False


@values_sets
def test_writable_paths_are_emptydirs(values: Path | None) -> None:
    docs = render(values)
    volumes = {v["name"]: v for v in pod_spec(docs)["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in server_container(docs)["volumeMounts"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    assert "emptyDir" in volumes[mounts["/cache"]]
    env = env_map(server_container(docs))
    assert env["HF_HOME"]["value"].startswith("/cache/")
    model_id = env["MODEL_ID"]["value"]
    assert not model_id.startswith(("/cache", "/tmp")), "the cache emptyDir must not hide it"


# --- model sources -------------------------------------------------------------------------------


def test_model_baked_in_the_image() -> None:
    docs = render(None)
    assert env_map(server_container(docs))["MODEL_ID"]["value"] == "/models/model"
    assert "initContainers" not in pod_spec(docs)
    assert "model" not in {v["name"] for v in pod_spec(docs)["volumes"]}


def test_model_from_a_pvc() -> None:
    docs = render(ci_values("full-values.yaml"))
    volumes = {v["name"]: v for v in pod_spec(docs)["volumes"]}
    assert volumes["model"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    mount = next(m for m in server_container(docs)["volumeMounts"] if m["name"] == "model")
    assert mount == {
        "name": "model",
        "mountPath": "/models/pvc",
        "subPath": "bert-base-uncased",
        "readOnly": True,
    }
    assert env_map(server_container(docs))["MODEL_ID"]["value"] == "/models/pvc"
    assert "claimName" in render_error(None, "model.source=pvc")


def test_model_downloaded_at_start() -> None:
    docs = render(ci_values("keda-values.yaml"))
    spec = pod_spec(docs)
    (init,) = spec["initContainers"]
    init_env = env_map(init)
    assert init_env["DOWNLOAD_REPO_ID"]["value"] == "google-bert/bert-base-uncased"
    assert init_env["HF_HUB_OFFLINE"]["value"] == "0"
    assert init_env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "hf-token"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["model"]["emptyDir"] == {"sizeLimit": "2Gi"}
    env = env_map(server_container(docs))
    assert env["MODEL_ID"]["value"] == "/models/download"
    assert env["HF_HUB_OFFLINE"]["value"] == "1"
    assert "repoId" in render_error(None, "model.source=download")


# --- optional objects ------------------------------------------------------------------------


def test_pdb_only_when_more_than_one_replica_can_exist() -> None:
    assert "PodDisruptionBudget" not in kinds(render(None))
    assert "PodDisruptionBudget" in kinds(render(None, "replicaCount=2"))
    assert "PodDisruptionBudget" in kinds(render(None, "autoscaling.enabled=true"))
    one = render(None, "autoscaling.enabled=true", "autoscaling.maxReplicas=1")
    assert "PodDisruptionBudget" not in kinds(one)
    assert "PodDisruptionBudget" not in kinds(
        render(None, "replicaCount=2", "podDisruptionBudget.enabled=false")
    )


def test_hpa_scales_on_cpu_and_queue_depth() -> None:
    docs = render(ci_values("full-values.yaml"))
    hpa = only(docs, "HorizontalPodAutoscaler")
    metrics = {m["type"]: m for m in hpa["spec"]["metrics"]}
    assert metrics["Resource"]["resource"]["target"]["averageUtilization"] == 70
    assert metrics["Pods"]["pods"]["metric"]["name"] == "pipeline_server_queue_depth"
    assert metrics["Pods"]["pods"]["target"] == {"type": "AverageValue", "averageValue": "24"}
    assert "replicas" not in only(docs, "Deployment")["spec"], "the HPA owns the count"
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)


def test_keda_scales_on_queue_depth() -> None:
    docs = render(ci_values("keda-values.yaml"))
    scaled = only(docs, "ScaledObject")
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert "pipeline_server_queue_depth" in trigger["metadata"]["query"]
    assert f'namespace="{NAMESPACE}"' in trigger["metadata"]["query"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == only(docs, "Deployment")["metadata"]["name"]
    assert "replicas" not in only(docs, "Deployment")["spec"]
    assert "HorizontalPodAutoscaler" not in kinds(docs)


def test_hpa_and_keda_are_exclusive() -> None:
    error = render_error(None, "autoscaling.enabled=true", "keda.enabled=true")
    assert "autoscaling.enabled and keda.enabled are both true: choose one" in error


def test_crd_objects_need_their_api() -> None:
    docs = render(ci_values("keda-values.yaml"), apis=())
    assert "ScaledObject" not in kinds(docs)
    assert "ServiceMonitor" not in kinds(docs)
    assert only(docs, "Deployment")["spec"]["replicas"] == 1, "without KEDA, a fixed count"
    done = helm(
        "install",
        RELEASE,
        str(CHART),
        "--dry-run=client",
        "--values",
        str(ci_values("keda-values.yaml")),
    )
    assert done.returncode == 0, done.stderr
    assert "WARNING: keda.enabled=true, but this cluster does not serve" in done.stdout
    assert "WARNING: serviceMonitor.enabled=true" in done.stdout


def test_service_monitor_scrapes_metrics() -> None:
    docs = render(ci_values("full-values.yaml"))
    monitor = only(docs, "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items()
        <= only(docs, "Service")["metadata"]["labels"].items()
    )


def test_network_policy_and_ingress() -> None:
    docs = render(ci_values("full-values.yaml"))
    policy = only(docs, "NetworkPolicy")
    assert policy["spec"]["ingress"][0]["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    ingress = only(docs, "Ingress")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": f"{RELEASE}-pipeline-server", "port": {"name": "http"}}


def test_platform_values_reach_the_pod() -> None:
    docs = render(ci_values("full-values.yaml"))
    spec = pod_spec(docs)
    meta = only(docs, "Deployment")["spec"]["template"]["metadata"]
    container = server_container(docs)
    assert container["image"].endswith("@sha256:" + "0123456789abcdef" * 4)
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["priorityClassName"] == "inference"
    assert spec["nodeSelector"] == {"kubernetes.io/arch": "amd64"}
    assert spec["tolerations"][0]["key"] == "dedicated"
    assert "podAntiAffinity" in spec["affinity"]
    (spread,) = spec["topologySpreadConstraints"]
    assert (
        spread["labelSelector"]["matchLabels"]
        == only(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    )
    assert meta["annotations"]["example.com/team"] == "ml-platform"
    assert meta["labels"]["example.com/cost-center"] == "1234"
    assert env_map(container)["MALLOC_ARENA_MAX"]["value"] == "2"
    assert any(v["name"] == "extra-config" for v in spec["volumes"])
    assert any(m["name"] == "extra-config" for m in container["volumeMounts"])


def test_helm_test_pod_checks_readiness_and_one_inference() -> None:
    pod = only(render(None), "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (check,) = pod["spec"]["containers"]
    script = check["command"][-1]
    assert '"/readyz"' in script and "urlopen(req" in script
    env = env_map(check)
    assert env["BASE_URL"]["value"] == f"http://{RELEASE}-pipeline-server.{NAMESPACE}.svc:8000"
    assert env["INPUT"]["value"] == "The weather is lovely today."
    fill_mask = env_map(only(render(ci_values("full-values.yaml")), "Pod")["spec"]["containers"][0])
    assert fill_mask["INPUT"]["value"] == "Paris is the [MASK] of France."


def _values_extra_env(values: Path | None) -> list[Manifest]:
    if values is None:
        return []
    data = yaml.safe_load(values.read_text()) or {}
    extra: list[Manifest] = data.get("extraEnv", [])
    return extra


def test_edge_limits_come_from_values() -> None:
    env = env_map(
        server_container(
            render(
                None,
                "server.maxConnections=500",
                "server.requestHeadTimeoutS=3",
                "server.maxRequestHeadBytes=1048576",
            )
        )
    )
    assert env["MAX_CONNECTIONS"]["value"] == "500"
    assert env["REQUEST_HEAD_TIMEOUT_S"]["value"] == "3"
    assert env["MAX_REQUEST_HEAD_BYTES"]["value"] == "1048576"  # not 1.048576e+06
    assert "maxRequestHeadBytes" in render_error(None, "server.maxRequestHeadBytes=512")
