"""charts/pipeline-server/values-small.yaml: one pod, and the rolling update's extra pod, fit a
2-CPU kind or minikube node beside the pods that cluster runs itself; the defaults do not.

What a fresh cluster's own pods request (kubeadm's static pods, CoreDNS, the CNI):
- kind: API server 250m, controller manager 200m, scheduler 100m, etcd 100m and 100Mi, two
  CoreDNS at 100m and 70Mi each, kindnet 100m and 50Mi: 950m CPU, 290Mi;
- minikube: the same static pods and one CoreDNS: 750m CPU, 170Mi.
A node's allocatable memory is its capacity less the kubelet's default hard eviction threshold
(100Mi). A kind node has the host's memory; minikube's smallest default node has 2,200 MB.
"""

from __future__ import annotations

import math

import pytest

from .helm import SMALL_VALUES, container_env, cpu_cores, only, quantity, render, server_container

pytestmark = pytest.mark.chart

NODE_CPU = 2.0
SYSTEM_CPU = {"kind": 0.95, "minikube": 0.75}
MINIKUBE_NODE_BYTES = 2_200 * 10**6
EVICTION_BYTES = 100 * 2**20
SYSTEM_BYTES = {"kind": 290 * 2**20, "minikube": 170 * 2**20}
# The server's resident set with the default model at its highest: the first start, while
# the backend is chosen (864 MiB measured on 2 cores of an AMD EPYC, BACKEND=auto).
PEAK_RSS_BYTES = 870 * 2**20


def pods_during_a_rollout() -> int:
    deployment = only(render(SMALL_VALUES), "Deployment")
    surge = deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"]
    return int(deployment["spec"]["replicas"]) + int(surge)


def test_a_rollout_fits_a_two_cpu_node() -> None:
    requests = server_container(render(SMALL_VALUES))["resources"]["requests"]
    pods = pods_during_a_rollout()
    assert pods == 2
    for cluster, system in SYSTEM_CPU.items():
        assert system + pods * cpu_cores(requests["cpu"]) <= NODE_CPU, cluster
    allocatable = MINIKUBE_NODE_BYTES - EVICTION_BYTES - SYSTEM_BYTES["minikube"]
    assert pods * quantity(requests["memory"]) <= allocatable


def test_the_defaults_do_not_fit_one() -> None:
    """Why the profile exists: the default pod alone is over what a small node has left."""
    requests = server_container(render(None))["resources"]["requests"]
    assert SYSTEM_CPU["minikube"] + cpu_cores(requests["cpu"]) > NODE_CPU


def test_the_pod_has_room_to_run() -> None:
    """One torch thread (from the CPU request) that the CPU limit never throttles, and a memory
    limit above the server's highest resident set."""
    container = server_container(render(SMALL_VALUES))
    resources = container["resources"]
    threads = int(container_env(container)["TORCH_NUM_THREADS"])
    assert threads == math.ceil(cpu_cores(resources["requests"]["cpu"])) == 1
    assert cpu_cores(resources["limits"]["cpu"]) >= threads
    assert quantity(resources["limits"]["memory"]) >= PEAK_RSS_BYTES
    assert quantity(resources["requests"]["memory"]) >= 0.95 * PEAK_RSS_BYTES


def test_only_resources_differ_from_the_defaults() -> None:
    """The profile changes what the pod asks of the node, nothing the server does."""
    small, default = render(SMALL_VALUES), render(None)
    env = container_env(server_container(small))
    assert env.pop("TORCH_NUM_THREADS") == "1"  # follows the CPU request
    default_env = container_env(server_container(default))
    assert default_env.pop("TORCH_NUM_THREADS") == "2"
    assert env == default_env
    assert [d["kind"] for d in small] == [d["kind"] for d in default]
