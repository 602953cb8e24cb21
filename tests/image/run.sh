#!/usr/bin/env bash
# tests/image/run.sh: build the Dockerfile with podman and check the image the way the chart
# runs it. Needs root on Debian/Ubuntu (it apt-installs podman) and no container registry:
# the base image is made locally with debootstrap and `podman import`.
#
# Steps: host packages -> podman config for this kind of host -> base image -> build ->
# run with the chart's env and securityContext on 127.0.0.1 -> probes, seed curl, /metrics,
# /info, HEALTHCHECK, non-root/read-only checks -> SIGTERM with requests in flight -> exit 0.
# Prints the image size, the build time and the time from `podman run` to ready.
# It never skips: when something cannot run, it fails and says why.
#
# Environment (all optional):
#   IMAGE_TEST_WORK    work folder: podman storage, rootfs, logs (default /var/tmp/pipeline-server-image-test)
#   IMAGE_TEST_PORT    loopback port for the container (default: a free one)
#   STORAGE_DRIVER     overlay (default) or vfs (slower, works anywhere)
#   NO_CACHE=1         rebuild every layer (a cold build time)
#   TORCH_INDEX_URL    index for torch; default: the Dockerfile's (the PyTorch CPU index), or,
#                      when a CPU torch wheel lies in pip's find-links folder, that folder + PyPI
#   PYTHON             python with PyYAML for reading the chart (default .venv/bin/python)
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${IMAGE_TEST_WORK:-/var/tmp/pipeline-server-image-test}
DRIVER=${STORAGE_DRIVER:-overlay}
BASE_IMAGE=localhost/pipeline-server-base:bookworm
IMAGE=localhost/pipeline-server:test
NAME=pipeline-server-image-test-$$
SEED="Paris is the [MASK] of France."
LOG=$WORK/logs
mkdir -p "$WORK" "$LOG"

fail() { echo "image test FAILED: $*" >&2; echo "logs: $LOG" >&2; exit 1; }
step() { echo "== $*"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# --- 0. preconditions and host packages ------------------------------------------------------
[ "$(id -u)" = 0 ] || fail "needs root (podman storage and networking as configured here); run with sudo"
command -v apt-get >/dev/null || fail "needs a Debian/Ubuntu host (apt-get) to install podman"
PKGS=(podman buildah runc fuse-overlayfs slirp4netns uidmap debootstrap curl)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  step "apt-get install ${missing[*]}"
  apt-get update -qq >"$LOG/apt.log" 2>&1 || { tail -20 "$LOG/apt.log" >&2; fail "apt-get update failed"; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >>"$LOG/apt.log" 2>&1 \
    || { tail -20 "$LOG/apt.log" >&2; fail "apt-get install ${missing[*]} failed"; }
fi

if [ -z "${PYTHON:-}" ]; then
  if [ -x "$REPO/.venv/bin/python" ]; then PYTHON=$REPO/.venv/bin/python; else PYTHON=python3; fi
fi
"$PYTHON" -c 'import yaml' 2>/dev/null \
  || fail "$PYTHON cannot import yaml (PyYAML): run 'make dev' first or set PYTHON"

# --- 1. podman configured for hosts like this one ----------------------------------------------
# Root may not raise hard rlimits here, and the cgroup layout can be hybrid (crun refuses it):
# fixed ulimits, runc, cgroupfs. Private config and storage: nothing global is touched.
CONF=$WORK/conf
mkdir -p "$CONF"
cat >"$CONF/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
cat >"$CONF/storage.conf" <<EOF
[storage]
driver = "$DRIVER"
graphroot = "$WORK/storage-$DRIVER"
runroot = "$WORK/run-$DRIVER"
EOF
export CONTAINERS_CONF=$CONF/containers.conf CONTAINERS_STORAGE_CONF=$CONF/storage.conf
podman info >"$LOG/podman-info.txt" 2>&1 \
  || { tail -20 "$LOG/podman-info.txt" >&2; fail "podman cannot run on this host (see above); try STORAGE_DRIVER=vfs"; }

# --- 2. the base image, from the Debian mirror apt already uses ----------------------------------
if ! podman image exists "$BASE_IMAGE"; then
  MIRROR=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [ -n "$MIRROR" ] || MIRROR=$(awk '$1 == "deb" { print $2; exit }' /etc/apt/sources.list 2>/dev/null || true)
  [ -n "$MIRROR" ] || MIRROR=http://deb.debian.org/debian
  step "debootstrap bookworm from $MIRROR"
  ROOTFS=$WORK/rootfs
  rm -rf "$ROOTFS"
  t=$(now)
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$ROOTFS" "$MIRROR" >"$LOG/debootstrap.log" 2>&1 \
    || { tail -20 "$LOG/debootstrap.log" >&2; fail "debootstrap failed"; }
  rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* \
         "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/*
  tar -C "$ROOTFS" -c . | podman import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null
  rm -rf "$ROOTFS"
  echo "base image made in $(since "$t") s"
fi

# --- 3. build -----------------------------------------------------------------------------------
BUILD=(--format docker --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "$IMAGE" -f "$REPO/Dockerfile")
[ "${NO_CACHE:-0}" = 1 ] && BUILD+=(--no-cache)
# TLS to package indexes may be intercepted by a CA only the host trusts: lend the build the
# host's bundle (a mount, never a layer).
HOST_CA=/etc/ssl/certs/ca-certificates.crt
if [ -f "$HOST_CA" ]; then
  BUILD+=(-v "$HOST_CA:/run/host-ca.crt:ro" --build-arg PIP_CERT=/run/host-ca.crt)
fi
# A CPU torch wheel on local disk (pip's find-links) saves the download: mount it and let the
# index be PyPI, whose own torch of the same version loses to the local `+cpu` build.
FIND_LINKS=${PIP_FIND_LINKS:-$("$PYTHON" -m pip config get global.find-links 2>/dev/null || true)}
if [ -n "$FIND_LINKS" ] && compgen -G "$FIND_LINKS/torch-*+cpu-*.whl" >/dev/null; then
  BUILD+=(-v "$FIND_LINKS:/wheels:ro" --build-arg PIP_FIND_LINKS=/wheels)
  TORCH_INDEX_URL=${TORCH_INDEX_URL:-https://pypi.org/simple}
fi
[ -n "${TORCH_INDEX_URL:-}" ] && BUILD+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
podman image exists "$IMAGE" && KIND="rebuild: layer cache allowed" || KIND="first build in this storage: no cache"
[ "${NO_CACHE:-0}" = 1 ] && KIND="no cache"
step "podman build ${BUILD[*]} $REPO"
t=$(now)
podman build "${BUILD[@]}" "$REPO" >"$LOG/build.log" 2>&1 \
  || { tail -40 "$LOG/build.log" >&2; fail "podman build failed (full log: $LOG/build.log)"; }
BUILD_S=$(since "$t")
SIZE_MB=$(podman image inspect --format '{{.Size}}' "$IMAGE" | awk '{ printf "%.0f", $1 / 1e6 }')
[ "$(podman image inspect --format '{{.Config.User}}' "$IMAGE")" = "10001:10001" ] \
  || fail "the image does not run as 10001:10001"
podman image inspect --format '{{json .Config.Healthcheck}}' "$IMAGE" | grep -q livez \
  || fail "the image has no HEALTHCHECK on /livez (built without --format docker?)"

# --- 4. run it as the chart's pod would ---------------------------------------------------------
POD=$WORK/pod
"$PYTHON" "$REPO/tests/image/pod_args.py" "$POD" "$IMAGE" || fail "could not render the chart"
# shellcheck source=/dev/null
. "$POD/pod.sh"
mapfile -t RUN_ARGS <"$POD/podman-args.txt"
PORT=${IMAGE_TEST_PORT:-$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
URL=http://127.0.0.1:$PORT

cleanup() {
  podman logs "$NAME" >"$LOG/container.log" 2>&1 || true
  podman rm -f -t 0 "$NAME" >/dev/null 2>&1 || true
  jobs -p | xargs -r kill 2>/dev/null || true
}
trap cleanup EXIT

step "podman run ${RUN_ARGS[*]} --env-file $POD/env.list -p 127.0.0.1:$PORT:$CONTAINER_PORT"
t=$(now)
# Without systemd, podman logs that it cannot schedule HEALTHCHECK timers: kept out of the
# way (the check runs it by hand below).
podman run -d --name "$NAME" "${RUN_ARGS[@]}" --env-file "$POD/env.list" \
  -p "127.0.0.1:$PORT:$CONTAINER_PORT" "$IMAGE" >/dev/null 2>"$LOG/podman-run.err" \
  || { cat "$LOG/podman-run.err" >&2; fail "podman run failed"; }
code() { curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$@" || true; }
saw_loading=0
until [ "$(code "$URL$READY_PATH")" = 200 ]; do
  # While loading, liveness must pass (a kubelet would otherwise restart the pod).
  [ "$(code "$URL$LIVE_PATH")" = 200 ] && saw_loading=1
  [ "$(podman inspect --format '{{.State.Running}}' "$NAME")" = true ] \
    || { podman logs "$NAME" | tail -30 >&2; fail "the container exited while starting"; }
  awk -v s="$(since "$t")" -v b="$STARTUP_BUDGET_S" 'BEGIN { exit !(s > b) }' \
    && { podman logs "$NAME" | tail -30 >&2; fail "not ready within the startup budget ($STARTUP_BUDGET_S s)"; }
  sleep 0.2
done
READY_S=$(since "$t")

# --- 5. checks ----------------------------------------------------------------------------------
check() { echo "   ok: $1"; }
[ "$(code "$URL$LIVE_PATH")" = 200 ] || fail "$LIVE_PATH is not 200 once ready"
curl -fsS "$URL$READY_PATH" | grep -q '"ready"' || fail "$READY_PATH does not say ready"
check "ready after $READY_S s (liveness 200 while loading: $saw_loading)"

curl -fsS -X POST -d "$SEED" "$URL/" >"$LOG/seed.json" || fail "the seed curl failed"
"$PYTHON" - "$LOG/seed.json" <<'PY' || fail "the seed curl's answer is not MiniLM's sentence embedding: $(head -c 300 "$LOG/seed.json")"
import json, math, sys
rows = json.load(open(sys.argv[1]))
# The default model's own config: mean pooling, then Normalize: one unit-length 384-d row.
assert len(rows) == 1 and len(rows[0]) == 384, (len(rows), len(rows[0]))
norm = math.sqrt(sum(x * x for x in rows[0]))
assert abs(norm - 1.0) < 1e-4, norm
PY
check "seed curl: one 384-d sentence embedding of unit length (mean pooling, normalized)"

grep -q '^pipeline_server_queue_depth ' <<<"$(curl -fsS "$URL/metrics")" || fail "/metrics has no queue depth"
check "/metrics serves pipeline_server_queue_depth"
curl -fsS "$URL/info" >"$LOG/info.json"
"$PYTHON" - "$LOG/info.json" "$TORCH_THREADS" <<'PY' || fail "/info disagrees with the chart: $(cat "$LOG/info.json")"
import json, sys
model = json.load(open(sys.argv[1]))["model"]
assert model["model_id"] == "/models/model", model
assert model["torch_threads"] == int(sys.argv[2]), model
# BACKEND=auto: every candidate ran (the baked onnx/model.onnx too, read by the pod's user)
candidates = model["backend"]["candidates"]
assert ("onnx", "float32") in {(c["backend"], c["dtype"]) for c in candidates}, candidates
assert not [c for c in candidates if "error" in c], candidates
PY
check "/info: model /models/model, torch threads $TORCH_THREADS (from the CPU request), every backend candidate ran (served: $("$PYTHON" -c 'import json,sys; b=json.load(open(sys.argv[1]))["model"]["backend"]; print(b["name"], b["dtype"])' "$LOG/info.json"))"

[ "$(podman exec "$NAME" id -u)" = 10001 ] || fail "the process is not uid 10001"
podman exec "$NAME" cat /proc/1/cmdline | tr '\0' ' ' | grep -q gunicorn \
  || fail "PID 1 is not gunicorn: $(podman exec "$NAME" cat /proc/1/cmdline | tr '\0' ' ')"
podman exec "$NAME" sh -c 'touch /models/model/x || touch /x' 2>/dev/null \
  && fail "the root filesystem or the model folder is writable"
check "uid 10001, gunicorn is PID 1, root filesystem and /models read-only"
podman healthcheck run "$NAME" >/dev/null || fail "the image's HEALTHCHECK fails"
check "HEALTHCHECK passes"

# --- 6. preStop, then SIGTERM with requests in flight ----------------------------------------------
$PRESTOP_CMD  # the preStop pause, as in the pod; the kubelet sends SIGTERM after it
# 4 requests of 48 inputs of about 90 tokens (192 inputs: the queue holds them all): about half
# a second of work for the fastest backend here, so some is still queued when SIGTERM comes
# (16 short inputs each were done before `podman kill` landed once bfloat16 served them).
BODY=$("$PYTHON" -c 'import json; print(json.dumps({"inputs": [" ".join(["A sentence of moderate length, to keep the model busy for a little while."] * 6)] * 48}))')
# A few batches first, so the service-time estimate reflects batched work (fewer sheds).
for _ in 1 2 3; do
  curl -fsS -o /dev/null -H 'Content-Type: application/json' -d "$BODY" "$URL/" || fail "a 48-input request failed"
done
pids=()
for i in 1 2 3 4; do
  { curl -s -o /dev/null -w '%{http_code}' --max-time 60 -H 'Content-Type: application/json' \
      -d "$BODY" "$URL/"; echo " $(now)"; } >"$LOG/inflight-$i.txt" &
  pids+=($!)
done
# SIGTERM once work is queued behind the running batch (not after a fixed pause).
for _ in $(seq 1 100); do
  grep -q '^pipeline_server_queue_depth [1-9]' <<<"$(curl -fsS "$URL/metrics")" && break
  sleep 0.05
done
t=$(now)
podman kill --signal TERM "$NAME" >/dev/null
EXIT=$(timeout "$GRACE_S" podman wait "$NAME") || fail "still running $GRACE_S s (the grace period) after SIGTERM"
STOP_S=$(since "$t")
for p in "${pids[@]}"; do wait "$p" || true; done
[ "$EXIT" = 0 ] || { podman logs "$NAME" | tail -20 >&2; fail "exit code $EXIT after SIGTERM"; }
# Answered before SIGTERM: 200, or 503 if shed at admission (never accepted). Answered after
# it: accepted work that the drain must finish, so 200 only.
answers=$(cat "$LOG"/inflight-*.txt)
shed=$(awk -v t="$t" '$2 <= t && $1 == 503' <<<"$answers" | wc -l)
awk -v t="$t" '($2 <= t && $1 != 200 && $1 != 503) || ($2 > t && $1 != 200) { bad = 1 } END { exit bad }' <<<"$answers" \
  || fail "requests in flight at SIGTERM were lost: $(tr '\n' ';' <<<"$answers")"
drained=$(awk -v t="$t" '$2 > t' <<<"$answers" | wc -l)
[ "$drained" -ge 1 ] || fail "no request was still in flight at SIGTERM: the drain went untested"
check "SIGTERM with requests queued: $drained finished after it, all 200 ($shed shed before it), exit 0 after $STOP_S s (grace $GRACE_S s)"

# --- 7. figures -----------------------------------------------------------------------------------
{
  echo "image:          $IMAGE (base $BASE_IMAGE, storage $DRIVER)"
  echo "image size:     $SIZE_MB MB"
  echo "build time:     $BUILD_S s ($KIND)"
  echo "start to ready: $READY_S s (podman run until $READY_PATH answers 200)"
  echo "SIGTERM to exit: $STOP_S s with work in flight"
} | tee "$WORK/summary.txt"
echo "IMAGE TEST OK"
