"""Turn the chart's rendered Deployment into `podman run` arguments, for tests/image/run.sh.

    python tests/image/pod_args.py OUT_DIR IMAGE

renders the chart with IMAGE (`repository:tag`; the chart has no default image) and writes
OUT_DIR/env.list (the container's env, one KEY=VALUE a line, as `--env-file` reads it),
OUT_DIR/podman-args.txt (one argument a line: user, read-only root, emptyDirs as tmpfs,
capabilities, CPU and memory limits) and OUT_DIR/pod.sh (facts for the shell: grace period,
preStop seconds, the thread count). The container runs as the pod would, minus the cluster.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chart.helm import Manifest, container_env, only, render, server_container


def memory_bytes(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * factor)
    return int(quantity)


def podman_args(pod: Manifest, container: Manifest) -> list[str]:
    pod_sc, sc = pod["securityContext"], container["securityContext"]
    args = [f"--user={pod_sc['runAsUser']}:{pod_sc['runAsGroup']}"]
    if sc.get("readOnlyRootFilesystem"):
        # Like Kubernetes: nothing writable but the volumes (podman would add tmpfs of its own).
        args += ["--read-only", "--read-only-tmpfs=false"]
    if sc.get("allowPrivilegeEscalation") is False:
        args.append("--security-opt=no-new-privileges")
    if "ALL" in sc.get("capabilities", {}).get("drop", []):
        args.append("--cap-drop=ALL")
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        empty_dir = volumes[mount["name"]].get("emptyDir")
        assert empty_dir is not None, f"only emptyDir volumes can be mimicked: {mount}"
        size = memory_bytes(empty_dir.get("sizeLimit", "1Gi"))
        args.append(f"--tmpfs={mount['mountPath']}:rw,size={size},mode=1777")
    limits = container["resources"]["limits"]
    args += [f"--cpus={limits['cpu']}", f"--memory={memory_bytes(limits['memory'])}"]
    return args


def main() -> None:
    out, image = Path(sys.argv[1]), sys.argv[2]
    out.mkdir(parents=True, exist_ok=True)
    repository, _, tag = image.rpartition(":")
    docs = render(None, f"image.repository={repository}", f"image.tag={tag}")
    deployment = only(docs, "Deployment")
    assert server_container(docs)["image"] == image, "the chart names the image under test"
    pod = deployment["spec"]["template"]["spec"]
    container = server_container(docs)
    env = container_env(container)
    (out / "env.list").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    (out / "podman-args.txt").write_text("\n".join(podman_args(pod, container)) + "\n")
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    facts = {
        "GRACE_S": pod["terminationGracePeriodSeconds"],
        "PRESTOP_CMD": " ".join(pre_stop),
        "TORCH_THREADS": env["TORCH_NUM_THREADS"],
        "CONTAINER_PORT": container["ports"][0]["containerPort"],
        "READY_PATH": container["readinessProbe"]["httpGet"]["path"],
        "LIVE_PATH": container["livenessProbe"]["httpGet"]["path"],
        "STARTUP_BUDGET_S": container["startupProbe"]["failureThreshold"]
        * container["startupProbe"]["periodSeconds"],
    }
    (out / "pod.sh").write_text("".join(f"{k}={shlex.quote(str(v))}\n" for k, v in facts.items()))


if __name__ == "__main__":
    main()
